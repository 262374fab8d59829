#!/usr/bin/env bash
# --device without a GPU (runs everywhere; the GPU tests are test_gpu_*): a bad value is refused
# with one line naming the flag; --device cuda either trains (a GPU is there) or is refused with
# one line giving the reason: "built without CUDA" in a build without it, the driver's reason
# (no device, no driver) in a CUDA build. Either way the CPU run next to it trains.
. "$(dirname "$0")/lib.sh"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
src=$PWD
cd "$tmp"
fashion_subset data 256 64
base=(--model "$src/models/fashion.model" --data data --summary_dir= --batch_size 32 --train_steps 2 --threads 1)
common=("${base[@]}" --logdir=)

expect_error "--device gpu is refused naming the flag" 1 "^dtrain train: --device 'gpu': expected cpu, cuda or cuda:N" \
  "$bin" train "${common[@]}" --device gpu
expect_error "--device cuda:64 is refused" 1 "--device 'cuda:64'" "$bin" train "${common[@]}" --device cuda:64
# works_or_says_why NAME PATTERN CMD...: with a GPU, the command exits 0 and its stdout matches PATTERN;
# without one, it exits non-zero with one stderr line giving the reason
works_or_says_why() {
  local name=$1 pat=$2; shift 2
  if "$@" >out 2>err; then check "$name where a GPU is" grep -q "$pat" out
  else
    check "$name without a usable GPU: one line with the reason ($(head -c 300 err))" \
      test "$(wc -l <err)" -eq 1 -a -n "$(grep -E 'built without CUDA|no usable CUDA device|no such CUDA device|cannot load cuBLAS' err)"
  fi
}
works_or_says_why "--device cuda trains (device named)" '^device: ' "$bin" train "${common[@]}" --device cuda
"$bin" train "${base[@]}" --device cpu --logdir ck >cpu.log 2>&1
check "--device cpu trains (and saves the checkpoint eval and predict use)" test $? -eq 0
# eval and predict restore on the CPU and then move the net, or refuse in one line
expect_error "eval --device gpu is refused naming the flag" 1 "--device 'gpu'" \
  "$bin" eval --logdir ck --data data --device gpu
works_or_says_why "eval --device cuda evaluates" 'test accuracy' "$bin" eval --logdir ck --data data --device cuda
expect_error "predict --device gpu is refused naming the flag" 1 "--device 'gpu'" \
  "$bin" predict --logdir ck --device gpu data/t10k-images-idx3-ubyte
summary
