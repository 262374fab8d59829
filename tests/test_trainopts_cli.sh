#!/usr/bin/env bash
# Training options end to end (--lr_schedule, --warmup_steps, --weight_decay, --clip_gradient_norm,
# --augment), on a small slice of Fashion-MNIST with a dense model so that it stays quick under the
# sanitizers:
#   the learning_rate summaries of 1 ps + 2 sync workers equal a single process's at the same
#   global steps, and a run stopped and resumed from its checkpoint gets the same rates as one
#   straight run;
#   2 sync workers x 16 = 1 process x 32 with a schedule, L2 weight decay and augmentation (the
#   ps applies what one process applies; augmentation does not depend on the number of workers);
#   1 sync worker = 1 process bit for bit with every option at once (AdamW, clipping);
#   bad values are refused with one line naming the flag.
# Every run is bounded by `timeout`; launch stops its children when it is stopped.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
cd "$tmp"

fashion_subset data 1024 64
printf 'model mlp\ninput 28 28 1\nflatten\ndense units=64\nrelu\ndense units=10\n' >mlp.model
common=(--model mlp.model --data data --threads 1)
opts=(--lr_schedule cosine --warmup_steps 8 --learning_rate 0.05 --optimizer momentum --weight_decay 0.01
      --augment crop=2,flip)
run() { timeout --foreground 300 "$@" >"$log" 2>&1; }

# learning_rate scalars of a summary folder as "step value" lines.
rates() { "$bin" inspect "$1"/train/events.out.tfevents.* | awk '$4 == "learning_rate" { print $3, $6 }'; }
params_close() { # a b: largest difference <= 1e-6 of the largest parameter
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
import numpy as np
a, b = (np.fromfile(f, np.float32).astype(np.float64) for f in sys.argv[1:3])
ok = a.shape == b.shape and a.size > 0 and np.abs(a - b).max() <= 1e-6 * np.abs(a).max()
print("max %.3g" % (np.abs(a - b).max() / np.abs(a).max()) if a.shape == b.shape and a.size else "sizes differ")
sys.exit(0 if ok else 1)
PY
}

# One process, batch 32, 40 steps; 2 sync workers x 16 through 1 ps, the same steps.
log=single.log; run "$bin" train "${common[@]}" "${opts[@]}" --train_steps 40 --steps_to_validate 10 --batch_size 32 \
  --logdir= --summary_dir=s_single --debug_dump_params single.bin
log=sync.log; run "$bin" launch --ps 1 --workers 2 "${common[@]}" "${opts[@]}" --train_steps 40 --steps_to_validate 10 \
  --issync=1 --batch_size 16 --logdir= --summary_dir=s_sync --debug_dump_params sync.bin
rates s_single >single.rates 2>/dev/null
rates s_sync >sync.rates 2>/dev/null
# Expected: cosine with 8 warmup steps from 0.05 over the 32 after them (the closed form, in awk),
# to float precision, at every step logged (10, 20, 30, the epoch's end 32, 40).
formula_ok() {
  awk 'BEGIN { pi = atan2(0, -1) } { w = 0.05 * 0.5 * (1 + cos(pi * ($1 - 8) / 32)); d = $2 - w;
       if (d < 0) d = -d; if (d > 1e-8) bad = 1; n++ } END { exit bad || n < 5 }' "$1"
}
if cmp -s single.rates sync.rates && formula_ok single.rates; then
  ok "learning_rate summaries: 1 ps + 2 sync workers = 1 process = the cosine formula at $(wc -l <single.rates) steps"
else bad "learning_rate summaries"; paste single.rates sync.rates; tail -n 3 single.log sync.log; fi
out=$(params_close single.bin sync.bin) && ok "2 sync workers x 16 = 1 process x 32 with schedule, weight decay, augmentation ($out)" \
  || { bad "2 sync workers x 16 vs 1 x 32 ($out)"; tail -n 3 sync.log; }
# The sync chief validates at the same steps as one process: those of --steps_to_validate and the
# epoch's end (its local steps are the global steps).
vsteps() { sed -n "s/^$1step \([0-9]*\) .*val_acc.*/\1/p" "$2" | tr '\n' ' '; }
check "the chief validates at the same steps as one process ($(vsteps '\[worker0\] ' sync.log))" \
  test "$(vsteps '\[worker0\] ' sync.log)" = "$(vsteps '' single.log)" -a "$(vsteps '' single.log)" = "10 20 30 32 40 "
grep -q "schedule cosine (warmup 8, decay 32 steps, alpha 0), weight decay 0.01" sync.log \
  && ok "the ps logs the schedule and weight decay INIT gave it" || bad "ps log of the options"

# Stopped at 20 and resumed from the checkpoint to 40: the same rates at 30 and 40 as straight through.
# (Cosine's default decay spans the run's length after warmup, so the first part, a 20-step run,
# names the straight run's 32 steps itself.)
log=part1.log; run "$bin" train "${common[@]}" "${opts[@]}" --lr_decay_steps 32 --train_steps 20 --steps_to_validate 10 \
  --batch_size 32 --logdir=ck --summary_dir=s_resume
log=part2.log; run "$bin" train "${common[@]}" "${opts[@]}" --train_steps 40 --steps_to_validate 10 --batch_size 32 \
  --logdir=ck --summary_dir=s_resume2
rates s_resume2 >resumed.rates 2>/dev/null
if grep -q "resuming" part2.log && [ "$(grep -c . resumed.rates)" -ge 2 ] && \
   [ "$(grep -E '^(30|40) ' resumed.rates)" = "$(grep -E '^(30|40) ' single.rates)" ]; then
  ok "a resumed run gets the straight run's learning rates at steps 30 and 40"
else bad "resumed rates"; cat resumed.rates; tail -n 3 part2.log; fi

# Every option at once through the ps (AdamW, clipping): 1 sync worker = 1 process, bit for bit.
all=(--lr_schedule exponential --lr_decay_steps 5 --lr_decay_rate 0.7 --lr_staircase --weight_decay 0.1
     --clip_gradient_norm 0.5 --augment crop=3 --train_steps 15 --steps_to_validate 1000 --batch_size 16 --logdir= --summary_dir=)
log=one.log; run "$bin" train "${common[@]}" "${all[@]}" --debug_dump_params one.bin
log=one_ps.log; run "$bin" launch --ps 2 --workers 1 "${common[@]}" "${all[@]}" --issync=1 --debug_dump_params one_ps.bin
[ -s one.bin ] && cmp -s one.bin one_ps.bin && ok "1 sync worker (2 ps) = 1 process, bit for bit, AdamW + clipping + schedule" \
  || { bad "1 sync worker vs 1 process with every option"; tail -n 3 one.log one_ps.log; }

# Bad input: one line on stderr naming the flag, non-zero exit.
refused() { # name needle flags...
  local name=$1 needle=$2; shift 2
  timeout --foreground 60 "$bin" train "${common[@]}" --logdir= --summary_dir= --train_steps 1 "$@" >/dev/null 2>err.txt
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$(wc -l <err.txt)" -eq 1 ] && grep -qF -- "$needle" err.txt; then ok "refused: $name"
  else bad "refused: $name (exit $rc)"; cat err.txt; fi
}
refused "boundaries not increasing" "--lr_boundaries: not increasing: 50 after 100" \
  --lr_schedule piecewise --lr_boundaries 100,50 --lr_values 0.1,0.01,0.001
refused "values one short" "--lr_values: 2 values for 2 boundaries" --lr_schedule piecewise --lr_boundaries 10,20 --lr_values 0.1,0.01
refused "negative weight decay" "--weight_decay" --weight_decay -0.1
refused "crop larger than the image" "--augment: crop=28 is larger than the 28x28 image" --augment crop=28
refused "unknown augmentation" "--augment: unknown item 'rotate'" --augment rotate
refused "unknown schedule" "--lr_schedule: expected constant, exponential, piecewise or cosine" --lr_schedule linear
refused "warmup without cosine" "--warmup_steps needs --lr_schedule cosine" --warmup_steps 10
refused "exponential without its rate" "lr_schedule exponential needs lr_decay_steps and lr_decay_rate" \
  --lr_schedule exponential --lr_decay_steps 100
summary
