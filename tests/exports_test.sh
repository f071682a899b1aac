#!/bin/sh
# Tests scripts/check_exports.py itself on a small shared library built
# here: it passes when the .so exports exactly the header, and fails on a
# leaked internal symbol, on a header function the .so lacks, and on a
# binding that binds a non-public function.
#   sh tests/exports_test.sh [PYTHON]
set -u
PY=${1:-python3}
CC=${CC:-cc}
. tests/suite.sh
CHECK="$PY scripts/check_exports.py"

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

expect_pass "closed library, public binding (control)" $CHECK "$tmp/closed.so" "$tmp/api.h" "$tmp/good_binding.py"
expect_fail "a leaked internal symbol" "exports mha_leak, which .* does not declare" $CHECK "$tmp/leaky.so" "$tmp/api.h"
expect_fail "a header function missing from the .so" "declares mha_public_two, which .* does not export" \
  $CHECK "$tmp/partial.so" "$tmp/api.h"
expect_fail "a binding of a non-public function" "binds mha_leak, which .* does not declare" \
  $CHECK "$tmp/closed.so" "$tmp/api.h" "$tmp/bad_binding.py"

finish exports_test
