# suite.sh — sourced by the shell test suites (layers_test.sh,
# exports_test.sh, install_test.sh): a scratch directory removed on exit,
# ok/bad lines, expectations on a command's exit status and output, and the
# summary that sets the exit status.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

# expect_fail NAME PATTERN CMD... : CMD exits 1 and its output matches PATTERN
expect_fail() {
  name=$1 pattern=$2; shift 2
  "$@" >"$tmp/out" 2>&1; rc=$?
  if [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$tmp/out"; then ok "$name"
  else bad "$name (exit $rc, expected 1 and '$pattern'):"; cat "$tmp/out"; fi
}
# expect_pass NAME CMD... : CMD exits 0
expect_pass() {
  name=$1; shift
  if "$@" >"$tmp/out" 2>&1; then ok "$name"
  else bad "$name:"; cat "$tmp/out"; fi
}
# finish SUITE : prints the summary; exits 1 when a check failed
finish() {
  [ "$fails" -eq 0 ] && echo "$1: all passed" || { echo "$1: $fails failed"; exit 1; }
}
