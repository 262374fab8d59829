#!/usr/bin/env bash
# A checkpoint-format file written by dtrain loads in Python with only the standard library and
# numpy or torch (tests/safetensors_load.py). Skips (passing) when /usr/bin/python3 has neither.
set -euo pipefail
cd "${DTRAIN_SRC:-$(dirname "$0")/..}"
py=/usr/bin/python3
backends=()
if [ -x "$py" ]; then
  "$py" -c 'import numpy' 2>/dev/null && backends+=(numpy)
  "$py" -c 'import torch' 2>/dev/null && backends+=(torch)
fi
if [ ${#backends[@]} -eq 0 ]; then
  echo "skip: $py has neither numpy nor torch"
  exit 0
fi
# The sample is written by the C test executable, which lives beside the CLI in the build folder.
helper="$(dirname "${DTRAIN_BIN:-build/dtrain}")/test_safetensors"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$helper" --write "$tmp/sample.safetensors"
for b in "${backends[@]}"; do
  "$py" tests/safetensors_load.py "$tmp/sample.safetensors" --backend "$b"
done
# The loader really checks: a flipped data byte must make it fail.
cp "$tmp/sample.safetensors" "$tmp/bad.safetensors"
size=$(stat -c %s "$tmp/bad.safetensors")
printf '\x7f' | dd of="$tmp/bad.safetensors" bs=1 seek=$((size - 30)) conv=notrunc status=none
if "$py" tests/safetensors_load.py "$tmp/bad.safetensors" --backend "${backends[0]}" 2>/dev/null; then
  echo "FAIL: the loader accepted a corrupted file"
  exit 1
fi
echo "ok: corrupted file refused"
