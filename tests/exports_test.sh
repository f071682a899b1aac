#!/bin/sh
# Tests scripts/check_exports.py itself on a small shared library built
# here: it passes when the .so exports exactly the header, and fails on a
# leaked internal symbol, on a header function the .so lacks, and on a
# binding that binds a non-public function.
#   sh tests/exports_test.sh [PYTHON]
set -u
PY=${1:-python3}
CC=${CC:-cc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
check() { $PY scripts/check_exports.py "$@" >"$tmp/out" 2>&1; }
expect_fail() { # NAME PATTERN ARGS...
  name=$1 pattern=$2; shift 2
  check "$@"; rc=$?
  if [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$tmp/out"; then ok "$name"
  else bad "$name (exit $rc, expected 1 and '$pattern'):"; cat "$tmp/out"; fi
}

cat >"$tmp/api.h" <<'H'
/* Only functions marked MHA_API are public. */
#define MHA_API __attribute__((visibility("default")))
MHA_API int mha_public_one(int x);
MHA_API const char *
mha_public_two(void);
H
# mha_leak is a non-static function built without -fvisibility=hidden.
printf '#include "api.h"\nint mha_public_one(int x) { return x; }\nconst char *mha_public_two(void) { return ""; }\nint mha_leak(void) { return 1; }\n' >"$tmp/lib.c"
$CC -shared -fPIC -o "$tmp/leaky.so" "$tmp/lib.c" || exit 1
$CC -shared -fPIC -fvisibility=hidden -o "$tmp/closed.so" "$tmp/lib.c" || exit 1
printf 'int mha_public_one(int x) { return x; }\n' >"$tmp/partial.c"
$CC -shared -fPIC -o "$tmp/partial.so" "$tmp/partial.c" || exit 1
printf '_sig("mha_public_one", c_int, c_int)\n' >"$tmp/good_binding.py"
printf '_sig("mha_public_one", c_int, c_int)\n_sig("mha_leak", c_int)\n' >"$tmp/bad_binding.py"

if check "$tmp/closed.so" "$tmp/api.h" "$tmp/good_binding.py"; then ok "closed library, public binding (control)"
else bad "closed library, public binding:"; cat "$tmp/out"; fi
expect_fail "a leaked internal symbol" "exports mha_leak, which .* does not declare" "$tmp/leaky.so" "$tmp/api.h"
expect_fail "a header function missing from the .so" "declares mha_public_two, which .* does not export" \
  "$tmp/partial.so" "$tmp/api.h"
expect_fail "a binding of a non-public function" "binds mha_leak, which .* does not declare" \
  "$tmp/closed.so" "$tmp/api.h" "$tmp/bad_binding.py"

[ "$fails" -eq 0 ] && echo "exports_test: all passed" || { echo "exports_test: $fails failed"; exit 1; }
