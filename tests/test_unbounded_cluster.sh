#!/usr/bin/env bash
# Unbounded ids (issue 22, docs/sparse.md "Unbounded ids"): an embedding with capacity= instead of
# buckets= keys its rows by the raw id in each ps's hash table. (1) A cluster with a small capacity,
# admission at the second update and eviction after 20 steps shows admissions, refusals and
# evictions on the ps's metrics, and no table holds more than its capacity. (2) A checkpoint holds the
# held rows' ids, rows and slots (`dtrain inspect` says how many); restored onto 3 ps tasks (the rows
# re-homed by the hash of (table, id)) and trained on, it ends where 2 ps tasks that never stopped
# end, every held row and slot bit for bit. (3) So does one process restoring it (the other way:
# tests/test_unbounded_local.sh).
# (4) Tables past a ps's --ps_table_memory are refused at the chief's start, naming the figures.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/metrics_lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
src=$(cd "${DTRAIN_SRC:-$(dirname "$0")/..}" && pwd)
cd "$tmp"

"$bin" gen-clicks --out clicks.tsv --lines 6000 --vocab 500 --seed 5 >gen.out 2>&1

# (1) admission and eviction on the ps's metrics
cp "$src/tests/fixtures/unbounded_small.model" small.model
base=$(free_ports 2) || { bad "two free ports"; summary; exit; }
timeout --foreground 120 "$bin" launch --ps 1 --workers 1 --data clicks.tsv --model small.model --optimizer sgd \
  --learning_rate 0.05 --batch_size 32 --train_steps 150 --steps_to_validate 1000 --threads 1 --logdir= --summary_dir= \
  --debug_step_delay_ms 20 --metrics_port "$base" >small.log 2>&1 &
launch_pid=$!
scrape() { curl -sf "http://127.0.0.1:$base/metrics" >"$1.tmp" && mv "$1.tmp" "$1"; }
# figure FILE FAMILY: "tables sum max" over the family's per-table series in FILE
figure() {
  awk -v f="$2" 'index($0, f "{") == 1 && /table="/ { n++; s += $NF; if ($NF > m) m = $NF } END { printf "%d %d %d\n", n, s, m }' "$1"
}
evicting() {
  scrape m && read -r _ ev _ < <(figure m dtrain_ps_sparse_evicted_total) && [ "$ev" -gt 0 ] &&
    read -r _ na _ < <(figure m dtrain_ps_sparse_not_admitted_total) && [ "$na" -gt 0 ]
}
check "the ps's tables evict rows and refuse ids not seen twice yet" wait_for 60 evicting
read -r n rows most < <(figure m dtrain_ps_sparse_rows)
read -r _ adm _ < <(figure m dtrain_ps_sparse_admitted_total)
read -r _ ev _ < <(figure m dtrain_ps_sparse_evicted_total)
read -r _ na _ < <(figure m dtrain_ps_sparse_not_admitted_total)
echo "     rows $rows (most in one table $most), admitted $adm, evicted $ev, not admitted $na"
check "26 tables, none holding more than its capacity of 40 rows ($n, $most)" [ "$n" -eq 26 ] && [ "$most" -le 40 ]
check "rows held = admitted - evicted ($rows = $adm - $ev)" [ "$rows" -eq $((adm - ev)) ]
wait "$launch_pid"
st=$?
check "the cluster trains to its end (status $st)" [ "$st" -eq 0 ]
[ "$st" -eq 0 ] || tail -20 small.log

# (2) checkpoints: held rows, restored onto another ps count
# the small FM of the bounded checkpoint test, with unbounded ids (the factors in one shared table)
sed -e 's/buckets=[0-9]*/capacity=100000/' -e 's/name=factors /name=factors table=shared /' \
  "$src/tests/fixtures/sparse_fm.model" >fm.model
one=(--data clicks.tsv --model fm.model --optimizer adam --learning_rate 0.01 --table_optimizer adam
     --batch_size 64 --summary_dir "" --threads 1)
common=("${one[@]}" --issync 1 --workers 1)
timeout --foreground 120 "$bin" launch --ps 2 "${common[@]}" --train_steps 30 --logdir A >a.out 2>&1
check "2 ps tasks train 30 steps and checkpoint (status $?)" [ -f A/model.ckpt-30.safetensors ]
"$bin" inspect A/model.ckpt-30.safetensors >inspect.out 2>&1
check "inspect: the held rows' ids" grep -qE '^factors/embeddings/ids +U64 +\[[1-9][0-9]*\]' inspect.out
check "inspect: each table's rows held" \
  grep -qE '^  factors/embeddings +unbounded ids, [1-9][0-9]* rows held x dim 4, slots adam_m, adam_v: [1-9][0-9]* rows trained' inspect.out
timeout --foreground 120 "$bin" launch --ps 2 "${common[@]}" --train_steps 40 --logdir R >r.out 2>&1
check "the uninterrupted run (status $?)" [ -f R/model.ckpt-40.safetensors ]
mkdir -p B && cp A/model.ckpt-30.safetensors B/
timeout --foreground 120 "$bin" launch --ps 3 "${common[@]}" --train_steps 40 --logdir B >b.out 2>&1
st=$?
check "restored onto 3 ps tasks and trained on (status $st)" [ "$st" -eq 0 ]
check "... the chief sent the held rows to their ps tasks" \
  grep -qE "chief: restored the 27 sparse table\(s\) of .* onto 3 ps task\(s\): [1-9][0-9]* row\(s\)" b.out
/usr/bin/python3 "$src/tests/unbounded_tables.py" R/model.ckpt-40.safetensors B/model.ckpt-40.safetensors >cmp.out 2>&1
st=$?
head -3 cmp.out
check "... step 40 holds the uninterrupted run's rows, ids and slots bit for bit, and its other tensors" [ "$st" -eq 0 ]

# (3) one process (docs/sparse.md, "Unbounded ids"): the cluster's checkpoint restored into this
# process's tables and trained on ends where the 2 ps tasks that never stopped end, bit for bit
mkdir -p D && cp A/model.ckpt-30.safetensors D/
timeout --foreground 60 "$bin" train "${one[@]}" --train_steps 40 --logdir D >d.out 2>&1
st=$?
check "one process restores the cluster's step 30 and trains on (status $st)" [ "$st" -eq 0 ] && \
  grep -qE "^restored the 27 sparse table\(s\) of D/.* onto this process's tables: [1-9][0-9]* row\(s\)" d.out
/usr/bin/python3 "$src/tests/unbounded_tables.py" R/model.ckpt-40.safetensors D/model.ckpt-40.safetensors >cmp1.out 2>&1
check "... step 40 holds the cluster's rows, ids and slots bit for bit" [ $? -eq 0 ]

# (4) tables that cannot fit a ps's table memory: the chief's SPARSE_INIT is refused at start, the
# chief says why (the figures and the flag) and the cluster stops, rather than waiting
start=$(date +%s)
timeout --foreground 60 "$bin" launch --ps 1 "${common[@]}" --train_steps 5 --logdir= \
  --ps_table_memory 0.01 >mem.out 2>&1
st=$?
took=$(( $(date +%s) - start ))
check "tables past --ps_table_memory: the launch fails at start (status $st, ${took} s)" \
  [ "$st" -ne 0 ] && [ "$st" -ne 124 ] && [ "$took" -lt 30 ]
check "... the chief names the bound and the figures" grep -qE "^\[worker0\] dtrain train: ps 0 at .*: SPARSE_INIT \
refused: the 27 table\(s\) would hold up to [0-9.]+ MiB on this ps \(ps 0 of 1\) at their capacities, over its table \
memory of 10\.2 MiB \(--ps_table_memory\)" mem.out
summary
