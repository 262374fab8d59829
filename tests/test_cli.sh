#!/usr/bin/env bash
# The CLI's contract: help works, and every bad input gives ONE line on stderr naming what and
# where, a non-zero exit status, and no crash (sanitizer builds would print a report and fail).
. "$(dirname "$0")/lib.sh"
data=${FASHION:-/usr/share/datasets/fashion-mnist}

"$bin" --help >"$tmp/out" 2>&1 && grep -q "train" "$tmp/out" && ok "help lists commands" || bad "help lists commands"
"$bin" train --help >"$tmp/out" 2>&1 && grep -q -- "--learning_rate" "$tmp/out" && grep -q -- "--steps_to_validate" "$tmp/out" \
  && ok "train --help lists flags" || bad "train --help lists flags"

expect_error "unknown command" 2 "unknown command 'trian'" "$bin" trian
expect_error "unknown flag with suggestion" 2 "unknown flag --learnin_rate \(did you mean --learning_rate\?\)" \
  "$bin" train --learnin_rate=0.1
expect_error "flag value not a number" 2 "--batch_size: 'abc' is not an integer" "$bin" train --batch_size abc
expect_error "negative seed" 2 "--seed" "$bin" train --seed=-1
expect_error "bad_images value: names the option" 2 "bad_images: expected skip or fail, got 'maybe'" "$bin" train --model models/fashion.model --data "$data" --bad_images=maybe
expect_error "missing model flag: names the option" 1 "model_path: no model file given" "$bin" train --data "$data"
expect_error "missing model file" 1 "$tmp/nope.model" "$bin" train --model "$tmp/nope.model" --data "$data"
expect_error "batch size zero" 2 "--batch_size: 0 is out of range 1\.\.65536" "$bin" train --model models/fashion.model --data "$data" --batch_size 0

# Every subcommand refuses a flag given twice (the last one winning would hide the first).
expect_error "train: flag given twice" 2 "--job_name: given twice" "$bin" train --job_name=ps --job_name=worker
expect_error "train: boolean flag given twice" 2 "--strict: given twice" "$bin" train --strict --strict
expect_error "eval: flag given twice" 2 "--threads: given twice" "$bin" eval --threads 1 --threads=2
expect_error "keygen: flag given twice" 2 "--out: given twice" "$bin" keygen --out "$tmp/k1" --out "$tmp/k2" --name a
expect_error "launch: flag given twice" 2 "--ps: given twice" "$bin" launch --ps 1 --ps=2

# Every numeric flag has a range; an error quotes the value as given.
expect_error "negative train_steps" 2 "--train_steps: -5 is out of range 0\.\." "$bin" train --train_steps -5
expect_error "negative threads" 2 "--threads: -1 is out of range 0\.\.1024" "$bin" train --threads -1
expect_error "too many threads" 2 "--threads: 100000 is out of range 0\.\.1024" "$bin" train --threads 100000
expect_error "eval: too many threads" 2 "--threads: 100000 is out of range" "$bin" eval --threads 100000
expect_error "negative save_model_secs" 2 "--save_model_secs: -1 is out of range \[0, " "$bin" train --save_model_secs -1
expect_error "zero learning rate" 2 "--learning_rate: 0 is out of range \(0, " "$bin" train --learning_rate 0
expect_error "learning rate 0 as a float" 2 "--learning_rate: 1e-50 is out of range" "$bin" train --learning_rate 1e-50
expect_error "seed beyond 64 bits" 2 "--seed: 99999999999999999999999 is out of range" "$bin" train --seed 99999999999999999999999
expect_error "batch size beyond 64 bits" 2 "--batch_size: 99999999999999999999 is out of range" "$bin" train --batch_size 99999999999999999999
expect_error "epochs overflow" 2 "--epochs: 1e400 is out of range" "$bin" train --epochs 1e400
expect_error "launch: workers beyond 64 bits" 2 "--workers: 99999999999999999999 is out of range 1\.\.32" "$bin" launch --workers 99999999999999999999
expect_error "task index beyond 32 bits" 1 "--task_index: 1099511627776 is out of range for job worker" \
  "$bin" train --model models/fashion.model --data "$data" --worker_hosts=127.0.0.1:1 --job_name=worker --task_index=1099511627776
"$bin" train --help >"$tmp/out" 2>&1 && grep -q -- "--threads .*range 0\.\.1024" "$tmp/out" \
  && ok "train --help shows ranges" || bad "train --help shows ranges"

printf 'model typo\ninput 28 28 1\nconv2d filters=8 kernel=3\nrelu\nflaten\ndense units=10\n' >"$tmp/typo.model"
expect_error "model file typo names the line" 1 "typo.model:5" "$bin" train --model "$tmp/typo.model" --data "$data"

expect_error "missing data folder" 1 "$tmp/nodata" "$bin" train --model models/fashion.model --data "$tmp/nodata"
mkdir -p "$tmp/trunc"
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
  gzip -dc "$data/$f.gz" >"$tmp/trunc/$f"
done
head -c 100000 "$data/train-images-idx3-ubyte.gz" | gzip -dc 2>/dev/null >"$tmp/trunc/train-images-idx3-ubyte"
expect_error "truncated IDX names the file" 1 "train-images-idx3-ubyte" \
  "$bin" train --model models/fashion.model --data "$tmp/trunc"
printf 'XXXXXXXXXXXXXXXX' >"$tmp/trunc/train-images-idx3-ubyte"
expect_error "wrong IDX magic names the file" 1 "train-images-idx3-ubyte.*magic" \
  "$bin" train --model models/fashion.model --data "$tmp/trunc"
expect_error "model input does not fit the data" 1 "128|28" \
  "$bin" train --model models/catdog.model --data "$data"

# A small image folder: 4x4 RGB PNGs in two classes, plus one file that is not an image. Under
# --bad_images=fail the run must stop naming that file; under skip it must count it and finish.
png='iVBORw0KGgoAAAANSUhEUgAAAAQAAAAECAIAAAAmkwkpAAAAEElEQVR4nGM4kWIERwzEcQBCchXhIRsTawAAAABJRU5ErkJggg=='
mkdir -p "$tmp/imgs/cat" "$tmp/imgs/dog"
for i in 1 2 3 4; do
  echo "$png" | base64 -d >"$tmp/imgs/cat/c$i.png"
  echo "$png" | base64 -d >"$tmp/imgs/dog/d$i.png"
done
echo "not an image" >"$tmp/imgs/cat/readme.jpg"
printf 'model tiny\ninput 8 8 3\nconv2d filters=4 kernel=3\nrelu\nflatten\ndense units=2\n' >"$tmp/tiny.model"
expect_error "non-image in image folder (fail policy) names the file" 1 "readme.jpg" \
  "$bin" train --model "$tmp/tiny.model" --data "$tmp/imgs" --logdir= --summary_dir= --bad_images=fail --batch_size 1 --epochs 1
if "$bin" train --model "$tmp/tiny.model" --data "$tmp/imgs" --logdir= --summary_dir= --batch_size 1 --epochs 1 >"$tmp/out" 2>"$tmp/err" \
   && grep -q "skipped 1 undecodable" "$tmp/out"; then ok "non-image skipped and reported"
else bad "non-image skipped and reported: $(cat "$tmp/out" "$tmp/err" | tail -3)"; fi
# ... with advice that works as written: the flag it names stops the run on that file.
check "the skip message names the flag that stops on bad images" \
  grep -qF "skipped 1 undecodable images (to stop on them instead: --bad_images fail, or fail_on_bad_images in dt_train_options)" "$tmp/out"
expect_error "... and --bad_images fail, as the message spells it, stops there" 1 "readme.jpg" \
  "$bin" train --model "$tmp/tiny.model" --data "$tmp/imgs" --logdir= --summary_dir= --bad_images fail --batch_size 1 --epochs 1

# A warning printed while training starts a line of its own: summaries that fail mid-run (event
# files capped at 1 KiB by ulimit; SIGXFSZ ignored so writes fail with EFBIG) are turned off with a
# warning, which must not land inside a "step ..." line, nor after the live progress line (stderr a
# terminal, through script(1)).
fashion_subset "$tmp/small" 256 64
printf 'model tiny28\ninput 28 28 1\nconv2d filters=4 kernel=3 stride=2\nrelu\nflatten\ndense units=10\n' >"$tmp/tiny28.model"
summ_run() { # summ_run OUT: train with capped files, all output through a pipe (pipes have no cap)
  local out=$1; shift
  ( ulimit -f 1; trap '' XFSZ; exec "$@" 2>&1 ) | cat >"$out"
}
own_line() { # every piece of output mentioning "warning:" starts with it (lines split at \n and \r)
  tr '\r' '\n' <"$1" | sed 's/\x1b\[K//g' | grep -- "warning:" | grep -qv "^warning:" && return 1
  grep -q "warning: summaries turned off" "$1"
}
tflags="--model $tmp/tiny28.model --data $tmp/small --logdir= --summary_dir=$tmp/sum1 --batch_size 8 --train_steps 12 --steps_to_validate 1 --threads 1"
summ_run "$tmp/sumout" "$bin" train $tflags
if own_line "$tmp/sumout" && [ "$(grep -c '^step .* examples/sec$' "$tmp/sumout")" -eq 12 ]; then ok "summary warning on its own line"
else bad "summary warning on its own line: $(grep -a -m2 'warning' "$tmp/sumout")"; fi
if command -v script >/dev/null; then
  summ_run "$tmp/ttyout" script -qec "$bin train ${tflags/sum1/sum2}" /dev/null
  if own_line "$tmp/ttyout" && grep -q "ETA" "$tmp/ttyout"; then ok "summary warning on its own line (terminal)"
  else bad "summary warning on its own line (terminal): $(tr '\r' '\n' <"$tmp/ttyout" | grep -a -m2 'warning')"; fi
fi

# A short real run: 60 steps on Fashion-MNIST must learn something (well above chance at 10%).
if "$bin" train --model models/fashion.model --data "$data" --logdir= --summary_dir= --train_steps 60 --steps_to_validate 30 \
     >"$tmp/out" 2>"$tmp/err"; then
  acc=$(sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' "$tmp/out")
  if [ -n "$acc" ] && awk -v a="$acc" 'BEGIN { exit !(a > 0.55) }'; then ok "60 steps learn (test accuracy $acc)"
  else bad "60 steps learn (test accuracy '$acc')"; cat "$tmp/out" "$tmp/err"; fi
  grep -q "^step 30 " "$tmp/out" && ok "logs every --steps_to_validate" || bad "logs every --steps_to_validate"
else
  bad "short training run exits 0"; cat "$tmp/err"
fi

summary
