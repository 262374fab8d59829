#!/usr/bin/env bash
# Training on a click log starts without a pass over the whole file (issue 36: a 19 MB gzip of 20M
# lines had not trained one step after 40 s, its lines being counted first). The lines are counted
# beside the steps (docs/ctr-data.md, "Epochs"), so the first step has read only the first
# batches' text: --debug_log_data_bytes says how much, against the file's whole text. And the
# epochs are the same as when the count came first: --epochs 1 and 2.5 train the steps the count
# gives, and a cosine schedule without lr_decay_steps (which needs the run's steps first) waits.
. "$(dirname "$0")/lib.sh"
cd "${DTRAIN_SRC:-$(dirname "$0")/..}"

"$bin" gen-clicks --lines 20000 --vocab 1000 --out "$tmp/c.tsv.gz" >/dev/null
text=$(gzip -dc "$tmp/c.tsv.gz" | wc -c)
# models/lr.model with small tables: the runs are about the data, not the model
cat >"$tmp/lr.model" <<'M'
model lr
input dense=13 fields=26
embedding name=weights dim=1 buckets=1024 combiner=sum weight_init=constant(0)
reduce_sum name=ids
dense name=linear input=input units=1 weight_init=constant(0)
add input=ids,linear
M
common=(--model "$tmp/lr.model" --data "$tmp/c.tsv.gz" --logdir= --summary_dir= --progress never --threads 1)
timeout --foreground 120 "$bin" train "${common[@]}" --batch_size 64 --train_steps 1 --debug_log_data_bytes 1 >"$tmp/one" 2>&1 \
  || { cat "$tmp/one"; bad "train one step"; }
read_bytes=$(sed -n 's/^debug: the first step read \([0-9]*\) bytes.*/\1/p' "$tmp/one")
# one 1 MiB buffer (twice: the format is told from the first line, then the file is read again)
[ -n "$read_bytes" ] && [ "$read_bytes" -le $((2 * 1048576 + 65536)) ] && [ "$read_bytes" -lt $((text / 2)) ] \
  && ok "the first step read $read_bytes of the $text bytes of text" \
  || { cat "$tmp/one"; bad "the first step read ${read_bytes:-?} of the $text bytes of text"; }

# One step ends before the count may: its epoch is not known, and the line says so rather than a figure
grep -q "^step 1  epoch ?  \|^step 1  epoch 0\.0" "$tmp/one" && ok "the step line's epoch is '?' or counted" \
  || { cat "$tmp/one"; bad "the step line's epoch while counting"; }
lines=
for e in 1 2.5; do
  timeout --foreground 120 "$bin" train "${common[@]}" --batch_size 1000 --epochs $e --steps_to_validate 100000 >"$tmp/e" 2>&1 \
    || { cat "$tmp/e"; bad "train $e epochs"; }
  # --epochs needs the count to end its epochs: its line comes in, beside training
  [ -n "$lines" ] || lines=$(sed -n 's/.*: \([0-9]*\) training lines (counted in.*/\1/p' "$tmp/e")
  [ -n "$lines" ] && ok "--epochs $e: the count comes in beside training ($lines lines)" \
    || { cat "$tmp/e"; bad "--epochs $e: no count line"; }
  want=$(python3 -c "import math; print(math.ceil($e * ($lines // 1000)))")
  got=$(sed -n 's/^trained \([0-9]*\) local steps.*/\1/p' "$tmp/e")
  ends=$(grep -c "^step .* epoch [0-9]*\.00 " "$tmp/e" || true)
  [ "$got" = "$want" ] && ok "--epochs $e: $got steps, as ceil($e x $lines // 1000)" \
    || { cat "$tmp/e"; bad "--epochs $e: $got steps, want $want"; }
  [ "$ends" = "$(python3 -c "print(int($e))")" ] && ok "--epochs $e: a log line at each whole epoch's end" \
    || { cat "$tmp/e"; bad "--epochs $e: $ends epoch-end lines"; }
done
timeout --foreground 120 "$bin" train "${common[@]}" --batch_size 1000 --epochs 2 --lr_schedule cosine >"$tmp/c" 2>&1 \
  && grep -q "$((2 * (lines / 1000))) global steps (2.00 epochs)" "$tmp/c" \
  && ok "cosine without lr_decay_steps: the count first, then the steps" || { cat "$tmp/c"; bad "cosine"; }
summary
