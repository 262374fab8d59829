#!/usr/bin/env bash
# The progress line on a terminal (a pseudo-terminal made by script(1)): `dtrain train` redraws one
# line in place (step, percent, examples/s, loss, ETA); `dtrain launch` draws the chief's at the
# bottom, prefixed [worker0], erased before each log line; with stderr not a terminal there is no
# progress line at all, only the log lines as before.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$tmp"
fashion_subset data 512 32
printf 'model tiny\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2 padding=same\nrelu\nflatten\ndense units=10\n' >tiny.model
common=(--model tiny.model --data data --batch_size 16 --threads 1 --logdir= --summary_dir= --steps_to_validate 1000)

# script -q -c CMD FILE: CMD on a pseudo-terminal, everything it wrote in FILE
timeout --foreground 120 script -qfe -c "$bin train ${common[*]} --train_steps 60 --debug_step_delay_ms 20" train.tty >/dev/null 2>&1
check "train on a terminal: a progress line with step, percent, examples/s, loss" \
  grep -qaP '\r  step \d+/60 +\d+%  epoch [0-9.]+  \d+ examples/s  loss \d\.\d{4}  ETA \d+:\d\d:\d\d' train.tty
check "... redrawn in place, last at 60/60" grep -qaP '\r  step 60/60  100%' train.tty
check "... and erased before a log line" grep -qaP '\r\e\[Kstep 60  epoch' train.tty

timeout --foreground 120 script -qfe -c "$bin launch --ps 1 --workers 2 ${common[*]} --train_steps 120 --debug_step_delay_ms 20" \
  launch.tty >/dev/null 2>&1
check "launch on a terminal: the chief's line drawn in place, prefixed [worker0]" \
  grep -qaP '\r\e\[K\[worker0\]   step \d+/120 +\d+%.*examples/s  loss' launch.tty
check "... never printed as a log line of its own" sh -c "! grep -qaP '^\[worker0\] \r' launch.tty"
check "... and the processes' lines still whole" grep -qaP '\[worker0\] test accuracy' launch.tty

timeout --foreground 120 "$bin" launch --ps 1 --workers 2 "${common[@]}" --train_steps 40 >pipe.out 2>pipe.err
check "not a terminal: no progress line (stderr of launch)" sh -c "! grep -qa 'ETA' pipe.err pipe.out"
check "... the log lines as before" grep -qE '^\[worker0\] step [0-9]+  epoch' pipe.out
summary
