#!/bin/sh
# Tests scripts/check_exports.py itself on a small shared library built
# here: it passes when the .so exports exactly the header, and fails on a
# leaked internal symbol, on a header function the .so lacks, and on a
# binding that binds a non-public function, and on a client object (as the
# CLI's, linked with libmha.a) that calls an internal one.
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

expect_pass "closed library, public binding (control)" $CHECK "$tmp/closed.so" "$tmp/api.h" --binding "$tmp/good_binding.py"
expect_fail "a leaked internal symbol" "exports mha_leak, which .* does not declare" $CHECK "$tmp/leaky.so" "$tmp/api.h"
expect_fail "a header function missing from the .so" "declares mha_public_two, which .* does not export" \
  $CHECK "$tmp/partial.so" "$tmp/api.h"
expect_fail "a binding of a non-public function" "binds mha_leak, which .* does not declare" \
  $CHECK "$tmp/closed.so" "$tmp/api.h" --binding "$tmp/bad_binding.py"
mkdir -p "$tmp/clients_good" "$tmp/clients_bad"
printf 'int mha_public_one(int);\nint main(void) { return mha_public_one(0); }\n' >"$tmp/good.c"
printf 'int mha_leak(void);\nint main(void) { return mha_leak(); }\n' >"$tmp/bad.c"
$CC -c "$tmp/good.c" -o "$tmp/clients_good/good.o" && $CC -c "$tmp/bad.c" -o "$tmp/clients_bad/bad.o" || exit 1
$CC -c -fPIC -fvisibility=hidden "$tmp/lib.c" -o "$tmp/lib.o" && ar rcs "$tmp/lib.a" "$tmp/lib.o" || exit 1
expect_pass "a client calling the public API (control)" $CHECK "$tmp/closed.so" "$tmp/api.h" --archive "$tmp/lib.a" --clients "$tmp/clients_good"
expect_fail "a client calling an internal function" "bad.o uses the library's internal mha_leak" \
  $CHECK "$tmp/closed.so" "$tmp/api.h" --archive "$tmp/lib.a" --clients "$tmp/clients_bad"

finish exports_test
