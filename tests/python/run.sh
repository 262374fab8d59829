#!/usr/bin/env bash
# ctest's test_python: pytest over tests/python with Debian's python3 (exit 77, a skip, naming what is
# missing). Under the sanitizer build (DTRAIN_PRELOAD: the ASan runtime) python3 runs with it
# preloaded, and the tests give the CLI processes they start an environment without it (the CLI
# has the runtime linked in).
py=/usr/bin/python3
for m in numpy pytest; do
  "$py" -c "import $m" 2>/dev/null || { echo "SKIP: $py lacks $m (Debian python3-$m)"; exit 77; }
done
if [ -n "${DTRAIN_PRELOAD:-}" ]; then
  [ -f "$DTRAIN_PRELOAD" ] || { echo "SKIP: sanitizer runtime $DTRAIN_PRELOAD not found"; exit 77; }
  export LD_PRELOAD=$DTRAIN_PRELOAD
fi
exec "$py" -m pytest -q -p no:cacheprovider "$(dirname "$0")"
