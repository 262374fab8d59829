#!/usr/bin/env bash
# Scale-out of a click-log model on the netns bed (issue 22, "Numbers": FM with 8 workers and 4 ps,
# weak scaling >= 85% at 1 Gbit): models/fm.model, each task on its own emulated host
# (scripts/netcluster, links capped at RATE), sync replicas, the same batch B per worker, for
# 1 worker + 1 ps, 2 + 1, 4 + 2 and 8 + 4, ROUNDS rounds in rotating order. Compute is emulated
# (--debug_emulate_compute_ms C: each step's real batch, forward and backward, padded to C ms, the
# forward's wait for its sparse rows beside the C ms and counted as exchange) so
# that 12 processes on 2 cores measure the network and the ps tasks, not the cores; the rows each
# batch names travel for real. Weak scaling = step time of 1 worker / step time of W workers (the
# workers' mean compute + exchange per step, from their end lines), medians over the rounds.
# Usage: bench/ctr_scale.sh [C_MS] [ROUNDS] [B] [RATE] [STEPS]   (repository root, root for namespaces)
# EXTRA: more flags for every task (EXTRA="--sparse_prefetch 0": the rows pulled when each forward
# starts); CASES: the "workers ps" cases to run (default "1 1;2 1;4 2;8 4"); AB=PATH: another
# build's dtrain ("a"), run beside this one ("b") in every case of every round, alternating which
# goes first; the end prints each build's weak scaling. DILATE=K: the time-dilated bed (netcluster
# --dilate K, docs/testbed.md: a core per task; the logs read are already divided by K).
set -u
C=${1:-50} R=${2:-3} B=${3:-512} RATE=${4:-1gbit} STEPS=${5:-100}
bins=("b $(realpath "${DTRAIN_BIN:-build/dtrain}")")
[ -n "${AB:-}" ] && bins=("a $(realpath "$AB")" "${bins[@]}")
bin=${bins[-1]#b }
out=$(mktemp -d /tmp/ctr_scale.XXXXXX)
trap 'rm -rf "$out"' EXIT
# Enough lines for 8 workers x STEPS batches of B (each worker reads its own share), plus the splits.
"$bin" gen-clicks --out "$out/clicks.tsv" --lines $((10 * STEPS * B + 20000)) --model fm --seed 3 >/dev/null 2>&1
IFS=';' read -r -a cases <<<"${CASES:-1 1;2 1;4 2;8 4}"
nc=${#cases[@]}
echo "bench/ctr_scale.sh $* (DILATE=${DILATE:-} CASES='${CASES:-}' EXTRA='${EXTRA:-}' AB=${AB:-})"
echo "uptime: $(uptime)"
for r in $(seq 1 "$R"); do
  for k in $(seq 0 $((nc - 1))); do
    set -- ${cases[$(((k + r) % nc))]}
    w=$1 p=$2
    nb=${#bins[@]}
    for j in $(seq 0 $((nb - 1))); do
      read -r tag exe <<<"${bins[$(((j + r + k) % nb))]}"
      d="$out/$tag-w$w-p$p-r$r"
      scripts/netcluster cluster --ps "$p" --workers "$w" --rate "$RATE" --timeout 600 --out "$d" --tail 0 \
        --bin "$exe" ${DILATE:+--dilate "$DILATE"} -- --model models/fm.model --data "$out/clicks.tsv" --issync=1 --threads 1 --batch_size "$B" \
        --train_steps "$STEPS" --steps_to_validate 1000000 --logdir= --summary_dir= --progress=never \
        --debug_emulate_compute_ms "$C" ${EXTRA:-} >"$d.report" 2>&1 || { echo "w$w p$p: failed"; tail -5 "$d.report"; continue; }
      cat "$d"/worker*.log | awk -v r="$r" -v w="$w" -v p="$p" -v t="$tag" '/updates \(sync replicas\): per step compute/ {
          for (i = 1; i < NF; i++) { if ($i == "compute") c += $(i + 1); if ($i == "exchange") x += $(i + 1) } n++ }
        END { printf "round %s workers %d ps %d step %7.2f ms (compute %.2f, exchange %.2f) build %s\n", r, w, p, (c + x) / n, c / n, x / n, t }'
    done
  done
done | tee "$out/rows"
med() { grep " workers $1 .* build $2\$" "$out/rows" | awk '{print $8}' | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }
for entry in "${bins[@]}"; do
  tag=${entry%% *}
  one=$(med 1 "$tag")
  for w in 2 4 8; do
    grep -q " workers $w .* build $tag\$" "$out/rows" || continue
    awk -v w="$w" -v a="$one" -v b="$(med "$w" "$tag")" -v t="$tag" 'BEGIN { printf "build %s: %d workers: median step %s ms against %s ms for 1: weak scaling %.1f%%\n", t, w, b, a, 100 * a / b }'
  done
done
echo "uptime: $(uptime)"
