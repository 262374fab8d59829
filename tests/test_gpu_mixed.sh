#!/usr/bin/env bash
# A mixed sync cluster (label gpu; docs/gpu.md): one ps, worker 0 on cuda and worker 1 on the CPU,
# against the same cluster with two CPU workers (processes on 127.0.0.1, kernel-chosen ports):
#   - worker 0's first gradient: cuda within 1e-4 of the CPU's (L2 norm ratio);
#   - worker 1's first gradient: bit for bit the same in both clusters (same parameters, same data);
#   - the parameters after 3 sync steps: within 1e-4.
# Without a GPU (or in a build without CUDA) it exits 77: skipped.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
src=$PWD
cmp_bin=${DTRAIN_COMPARE:-$(dirname "$bin")/compare_floats}
cd "$tmp"
fashion_subset data 1024 64
base=(--model "$src/models/fashion.model" --data data --logdir= --summary_dir= --batch_size 32 --threads 2
      --optimizer sgd --learning_rate 0.05 --steps_to_validate 1000 --seed 3)

# cluster NAME DEVICE0 DEVICE1: ps + 2 workers; worker k dumps its first gradient to NAME_gK.bin,
# the chief its final parameters to NAME_p.bin. Exit status: the chief's.
cluster() {
  local name=$1 ports
  ports=($(free_port 3))
  local c=(--issync=1 --train_steps 3 --ps_hosts "127.0.0.1:${ports[0]}"
           --worker_hosts "127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}")
  timeout --foreground 150 "$bin" train "${base[@]}" "${c[@]}" --job_name ps --task_index 0 >"${name}_ps.log" 2>&1 &
  local ps=$!
  timeout --foreground 150 "$bin" train "${base[@]}" "${c[@]}" --job_name worker --task_index 1 --device "$3" \
    --debug_dump_grads "${name}_g1.bin" >"${name}_w1.log" 2>&1 &
  local w1=$!
  timeout --foreground 150 "$bin" train "${base[@]}" "${c[@]}" --job_name worker --task_index 0 --device "$2" \
    --debug_dump_grads "${name}_g0.bin" --debug_dump_params "${name}_p.bin" >"${name}_w0.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] || kill $w1 $ps 2>/dev/null # a chief that failed leaves the others waiting
  wait $w1 $ps
  return $rc
}

# Skip (77) unless one step runs on cuda here; the reason goes to the log.
timeout --foreground 60 "$bin" train "${base[@]}" --train_steps 1 --device cuda >probe.log 2>&1
gpu_skip_unless_ran $? probe.log

cluster mixed cuda cpu
rc=$?
check "mixed cluster (cuda + cpu workers, sync) runs 3 steps" test $rc -eq 0 || tail -n 5 mixed_*.log
cluster cpu cpu cpu
check "cpu cluster runs 3 steps" test $? -eq 0 || tail -n 5 cpu_*.log

out=$("$cmp_bin" mixed_g0.bin cpu_g0.bin 1e-4)
check "worker 0's first gradient, cuda vs cpu, within 1e-4: $out" test $? -eq 0
out=$("$cmp_bin" mixed_g1.bin cpu_g1.bin)
check "worker 1's first gradient is the same in both clusters: $out" test "${out%% *}" = identical
out=$("$cmp_bin" mixed_p.bin cpu_p.bin 1e-4)
check "parameters after 3 sync steps within 1e-4: $out" test $? -eq 0
summary
