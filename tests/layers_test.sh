#!/bin/sh
# Tests scripts/check_layers.py itself: it passes the real tree, fails on a
# planted upward include, a planted include cycle, a planted upward call
# (real object files, read with nm) and an unknown folder, and its matrix is
# the one docs/ARCHITECTURE.md prints.
#   sh tests/layers_test.sh [PYTHON]
set -u
PY=${1:-python3}
CHECK="$PY scripts/check_layers.py"
CC=${CC:-cc}
. tests/suite.sh

# copy_src DIR : a copy of the real src/ to plant edges in
copy_src() { rm -rf "$1"; mkdir -p "$1"; cp -R src/. "$1/"; }

expect_pass "the real src/ (includes only)" $CHECK --src src

copy_src "$tmp/up"
printf '#include "cache/cache_internal.h"\n' >>"$tmp/up/compute/gemm.c"
expect_fail "planted upward include compute -> cache" \
  "src/compute/gemm.c:.*compute/ may not import cache/" $CHECK --src "$tmp/up"

copy_src "$tmp/cycle"
printf '#include "core/core.h"\n' >>"$tmp/cycle/kernels/scalar.c"
expect_fail "planted include cycle through kernels -> core" "cycle between folders: .*kernels -> core" \
  $CHECK --src "$tmp/cycle"

copy_src "$tmp/relative"
printf '#include "../cache/cache_internal.h"\n' >>"$tmp/relative/core/mask.c"
expect_fail "planted upward include by a relative path" "core/ may not import cache/" $CHECK --src "$tmp/relative"

copy_src "$tmp/unknown"
mkdir -p "$tmp/unknown/extra" && printf 'int mha_extra;\n' >"$tmp/unknown/extra/extra.c"
expect_fail "a folder the matrix does not know" "folder 'extra'" $CHECK --src "$tmp/unknown"

# Call edges: two real objects; the header-free declaration hides the edge
# from the include scan, so only nm can see it.
mk_call_tree() { # DIR CALLER_FOLDER CALLEE_FOLDER
  mkdir -p "$1/src/$2" "$1/src/$3" "$1/obj/$2" "$1/obj/$3"
  printf 'int mha_callee(void) { return 1; }\n' >"$1/src/$3/callee.c"
  printf 'int mha_callee(void);\nint mha_caller(void) { return mha_callee(); }\n' >"$1/src/$2/caller.c"
  $CC -c "$1/src/$3/callee.c" -o "$1/obj/$3/callee.o" && $CC -c "$1/src/$2/caller.c" -o "$1/obj/$2/caller.o"
}
mk_call_tree "$tmp/calls_down" cache compute
expect_pass "a downward call cache -> compute (control)" $CHECK --src "$tmp/calls_down/src" --objects "$tmp/calls_down/obj"
mk_call_tree "$tmp/calls_up" compute cache
expect_fail "planted upward call compute -> cache" "src/compute/caller.c uses mha_callee (defined in src/cache/callee.c).*compute/ may not import cache/" \
  $CHECK --src "$tmp/calls_up/src" --objects "$tmp/calls_up/obj"
expect_pass "the same upward call unseen without objects (the include scan cannot see it)" \
  $CHECK --src "$tmp/calls_up/src"

# The documented matrix is the checked one.
$CHECK --matrix >"$tmp/matrix"
missing=$(grep -vxF -f docs/ARCHITECTURE.md "$tmp/matrix" 2>&1)
if [ -f docs/ARCHITECTURE.md ] && [ -z "$missing" ]; then ok "docs/ARCHITECTURE.md shows the checked matrix"
else bad "docs/ARCHITECTURE.md lacks these matrix rows:"; echo "$missing"; fi

finish layers_test
