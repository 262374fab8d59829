#!/usr/bin/env bash
# Click-through-rate models from the command line (issue 22): models/lr.model trained on a small
# click log from dtrain gen-clicks must reach a test AUC well above 0.5 and near the Bayes-optimal
# AUC the generator prints for that split (a tolerance the run can fail); the chief's end line, dtrain
# eval and dtrain predict agree; the TensorBoard scalars auc and logloss are written; bad pairings
# of model and data are one-line errors naming both.
. "$(dirname "$0")/lib.sh"
cd "${DTRAIN_SRC:-$(dirname "$0")/..}"

# 120,000 lines over 2,000 ids a field: ids are seen often enough for one short run to learn them.
"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 120000 --vocab 2000 --seed 5 >"$tmp/gen.out" 2>&1
bayes=$(awk '$1 == "test" {print $5}' "$tmp/gen.out")
check "gen-clicks prints the test split's Bayes AUC" [ -n "$bayes" ]

# A smaller table than the shipped 2^20 rows a field keeps the run short under the sanitizers; the
# model is otherwise models/lr.model, line for line.
sed 's/buckets=1048576/buckets=65536/' models/lr.model >"$tmp/lr.model"
timeout --foreground 120 "$bin" train --data "$tmp/clicks.tsv" --model "$tmp/lr.model" --batch_size 256 \
  --learning_rate 0.005 --lr_schedule cosine --table_learning_rate 0.2 --epochs 2 --steps_to_validate 300 \
  --logdir "$tmp/ck" --summary_dir "$tmp/sum" \
  >"$tmp/train.out" 2>&1
st=$?
check "trains LR on a click log (status $st)" [ "$st" -eq 0 ]
auc=$(awk '/^test auc/ {print $3}' "$tmp/train.out")
echo "test auc $auc, Bayes AUC $bayes"
check "the chief's log lines report val_auc and val_logloss" grep -q "val_auc 0\.[0-9]*  val_logloss 0\.[0-9]*" "$tmp/train.out"
check "test AUC well above 0.5 (got $auc)" awk -v a="$auc" 'BEGIN {exit !(a > 0.7)}'
# 96,000 training lines leave a finite-sample gap: 0.0066 measured (0.8096 against 0.8162, the
# tables by Adagrad at 0.2); the tables at 0.05 reach 0.8035, and a dense rate of 0.02 (adam)
# overfitted the tables to 0.767 when they followed it.
check "test AUC within 0.02 of the Bayes AUC $bayes (got $auc)" \
  awk -v a="$auc" -v b="$bayes" 'BEGIN {exit !(a > b - 0.02 && a < b + 0.01)}'

line=$(grep "^test auc" "$tmp/train.out")
"$bin" eval --logdir "$tmp/ck" --data "$tmp/clicks.tsv" >"$tmp/eval.out" 2>"$tmp/eval.err"
check "dtrain eval prints the same test AUC and logloss" grep -qxF "$line" "$tmp/eval.out"
check "TensorBoard scalars auc and logloss" grep -qa "logloss" "$tmp"/sum/test/events.*
"$bin" predict --logdir "$tmp/ck" --out "$tmp/p.csv" "$tmp/clicks.tsv" 2>"$tmp/pred.err"
check "dtrain predict writes a probability per line" [ "$(wc -l <"$tmp/p.csv")" = 120001 ]
check "probabilities in (0, 1) and labels as the file gives them" \
  awk -F, 'NR > 1 && !($3 > 0 && $3 < 1 && ($2 == 0 || $2 == 1)) {bad = 1} END {exit bad}' "$tmp/p.csv"
check "line numbers in order" awk -F, 'NR > 1 && $1 != NR - 1 {bad = 1} END {exit bad}' "$tmp/p.csv"
check "each row names its file" awk -F, -v f="$tmp/clicks.tsv" 'NR > 1 && $4 != f {bad = 1} END {exit bad}' "$tmp/p.csv"
# Several files (a plain one and a gzip one whose name needs quoting): one header, and a file column
# that tells their rows apart, each file's lines numbered from 1.
head -n 300 "$tmp/clicks.tsv" >"$tmp/a.tsv"
head -n 200 "$tmp/clicks.tsv" | gzip >"$tmp/b,c.tsv.gz"
"$bin" predict --logdir "$tmp/ck" --out "$tmp/two.csv" "$tmp/a.tsv" "$tmp/b,c.tsv.gz" 2>"$tmp/two.err"
check "predict of two files: one header, line,label,probability,file" \
  eval '[ "$(grep -c "^line," "$tmp/two.csv")" = 1 ] && [ "$(head -n 1 "$tmp/two.csv")" = "line,label,probability,file" ]'
check "... 300 rows of the first file, numbered 1..300, then 200 of the second, quoted, numbered 1..200" \
  awk -F, -v a="$tmp/a.tsv" -v b="\"$tmp/b" 'NR == 1 {next}
    NR <= 301 {if ($1 != NR - 1 || $4 != a) bad = 1; next}
    {if ($1 != NR - 301 || $4 != b || $5 != "c.tsv.gz\"") bad = 1}
    END {exit bad || NR != 501}' "$tmp/two.csv"
check "... the same probabilities as a file alone" \
  eval 'diff <(sed -n "2,201p" "$tmp/two.csv" | cut -d, -f1-3) <(sed -n "2,201p" "$tmp/p.csv" | cut -d, -f1-3) >/dev/null &&
        diff <(sed -n "302,501p" "$tmp/two.csv" | cut -d, -f1-3) <(sed -n "2,201p" "$tmp/p.csv" | cut -d, -f1-3) >/dev/null'

# Model and data that do not go together.
mkdir -p "$tmp/images"
expect_error "a click-log model given a folder" 1 "is a folder \(image data\?\), but .*lr.model is a click-log model" \
  "$bin" train --data "$tmp/images" --model "$tmp/lr.model" --logdir "" --summary_dir ""
expect_error "an image model given a click log" 1 "clicks.tsv is a file \(a click log\?\), but models/fashion.model is an image model" \
  "$bin" train --data "$tmp/clicks.tsv" --model models/fashion.model --logdir "" --summary_dir ""
printf 'model t\ninput dense=13 fields=20\nembedding dim=1 buckets=10\nreduce_sum\n' >"$tmp/f20.model"
expect_error "a click log with other fields" 1 "26 categorical fields, but the model's input line says dense=13 fields=20" \
  "$bin" train --data "$tmp/clicks.tsv" --model "$tmp/f20.model" --logdir "" --summary_dir ""
printf 'model t\ninput dense=13 fields=26\nembedding dim=1\nreduce_sum\n' >"$tmp/nob.model"
expect_error "an embedding without buckets" 1 "nob.model:3: embedding needs buckets=N" \
  "$bin" train --data "$tmp/clicks.tsv" --model "$tmp/nob.model" --logdir "" --summary_dir ""
summary
