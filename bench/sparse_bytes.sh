#!/usr/bin/env bash
# Bytes per step of the sparse tables (issue 22, "only touched rows travel": each way <= 1.1 x
# unique ids x (4 dim + 8) + the dense part's bytes, measured on the wire). A 1 ps + 2 sync workers
# run of models/lr.model (26 tables of dim 1) on scripts/netcluster's test bed (1 Gbit links), at
# batch 128 and 1024, in float32 and bf16 (--compression). For worker 1 (it trains only; the chief
# also pulls rows for validation and test) it prints, per update:
#   ids      distinct ids it pulled (= rows pushed), the issue's "unique ids"
#   unit     ids x (4 dim + 8) bytes (12 at dim 1): the issue's unit, in float32's 4 bytes a value
#   up, dn   sparse bytes the client counted (headers + payloads), each way
#   hdr      of which headers, each way: 104 bytes a message (a request up, its reply down; one per
#            ps and call for all tables, two calls a step: the pull and the push), and up also the
#            8-byte section records (one per table in each request)
#   dense    the dense part's counted bytes, each way
#   wire_up, wire_dn  bytes through worker 1's link (tc's counters: Ethernet, IP, TCP, ZMTP and all),
#            over the whole run divided by its updates (start-up, HELLO and end included)
#   r_up, r_dn  (wire bytes - counted dense bytes) / unit: the issue's ratio, each way (<= 1.1 wanted)
#   r_mean   the mean of both ways over the unit (the mean of counted sparse bytes, without the wire)
# Needs root (network namespaces); without it the bed's script exits 77.
#   bench/sparse_bytes.sh [BUILD_DIR]   (default build)
set -eu
build=${1:-build}
bin=$(cd "$build" && pwd)/dtrain
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" gen-clicks --out "$tmp/clicks.tsv" --lines 40000 --vocab 2000 --seed 5 >/dev/null 2>&1
sed 's/buckets=1048576/buckets=65536/' "$here/models/lr.model" >"$tmp/lr.model"
printf '%-6s %-5s %8s %8s %8s %8s %7s %7s %8s %8s %8s %8s %6s %6s %6s %7s\n' batch enc ids unit up dn hdr_up hdr_dn \
  dense_up dense_dn wire_up wire_dn r_up r_dn r_mean auc
for batch in 128 1024; do
  for enc in none bf16; do
    DTRAIN_BIN="$bin" "$here/scripts/netcluster" cluster --ps 1 --workers 2 --timeout 300 --out "$tmp/run" --tail 1 \
      -- --data "$tmp/clicks.tsv" --model "$tmp/lr.model" --optimizer sgd --learning_rate 0.05 --epochs 1 \
      --steps_to_validate 1000 --logdir= --summary_dir= --threads 1 --issync=1 --batch_size "$batch" \
      --compression "$enc" >"$tmp/nc.out" 2>&1 || { cat "$tmp/nc.out"; exit 1; }
    # worker 1 is on host h2 (the ps on h0, the chief on h1)
    read -r wsent wrecv < <(awk '$1 == "h2" {print $3, $4}' "$tmp/nc.out")
    auc=$(grep -o "test auc [0-9.]*" "$tmp/run/worker0.log" | tail -1 | awk '{print $3}')
    awk -v batch="$batch" -v enc="$enc" -v ws="$wsent" -v wr="$wrecv" -v auc="$auc" '
      / updates \(/ && n == 0 { for (i = 1; i < NF; i++) if ($(i + 1) == "updates") { n = $i; break } }
      /sparse tables: [0-9]+ pulls/ {
        for (i = 1; i < NF; i++) if (!($(i + 1) in v)) v[$(i + 1)] = $i
        msgs = v["messages,"]; secs = v["sections,"]; pulled = v["rows"]; up = v["bytes"]; dn = v["down;"]
        match($0, /sparse: [0-9]+ up, [0-9]+ down/); split(substr($0, RSTART, RLENGTH), t, /[ ,]+/)
        tup = t[2]; tdn = t[4] }
      END {
        ids = pulled / n; unit = ids * 12; sup = up / n; sdn = dn / n; h = 104 * msgs / n; hu = h + 8 * secs / n
        dup = tup - sup; ddn = tdn - sdn; wu = ws / n; wd = wr / n
        printf "%-6s %-5s %8.1f %8.0f %8.0f %8.0f %7.0f %7.0f %8.0f %8.0f %8.0f %8.0f %6.3f %6.3f %6.3f %7s\n",
          batch, enc, ids, unit, sup, sdn, hu, h, dup, ddn, wu, wd, (wu - dup) / unit, (wd - ddn) / unit,
          (sup + sdn) / 2 / unit, auc }' "$tmp/run/worker1.log"
  done
done
