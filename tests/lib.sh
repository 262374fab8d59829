# Sourced by the shell tests (tests/test_*.sh): the binary under test, a scratch folder removed at
# exit together with every process still running from it (their command lines name it), and the
# pass/fail counting every test prints ("N passed, M failed"; the exit status is 0 only with no
# failure). A test that starts processes whose command lines do not name $tmp kills them itself.
set -u
bin=${DTRAIN_BIN:-build/dtrain}
tmp=$(mktemp -d)
pass=0 fail=0
lib_cleanup() { pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"; }
trap lib_cleanup EXIT
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { local name=$1; shift; if "$@"; then ok "$name"; else bad "$name"; fi; }
summary() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }
