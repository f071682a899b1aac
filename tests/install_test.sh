#!/bin/sh
# Installs mha into a temporary prefix as a C user and a Python user would
# use it, from outside the repository: the installed file set, soname and
# links; a C program built with `pkg-config --cflags --libs mha` (shared, and
# static with --static); the man page against the CLI's --help; the Python
# package installed with pip and run from the prefix's libmha.so. Then
# uninstalls and checks nothing is left; a DESTDIR install goes to the
# staging tree with the final prefix inside mha.pc.
#   sh tests/install_test.sh [PYTHON]          (from the repository root)
set -u
PY=${1:-/usr/bin/python3}
CC=${CC:-cc}
repo=$(pwd)
. tests/suite.sh
prefix=$tmp/prefix
# files DIR : every non-directory under DIR, relative, sorted
files() { (cd "$1" && find . ! -type d | sed 's|^\./||' | sort); }

version=$(sed -n "s/^VERSION *= *//p" Makefile)
major=${version%%.*}
expected="bin/mha
include/mha.h
lib/libmha.a
lib/libmha.so
lib/libmha.so.$major
lib/libmha.so.$version
lib/pkgconfig/mha.pc
share/man/man1/mha.1"

# ----------------------------------------------------------------- install
make -s install PREFIX="$prefix" >"$tmp/log" 2>&1 || { cat "$tmp/log"; echo "FAIL make install"; exit 1; }
if [ "$(files "$prefix")" = "$expected" ]; then ok "make install wrote exactly the expected files"
else bad "installed files differ from the expected set:"; files "$prefix" | diff - "$(printf '%s\n' "$expected" >"$tmp/e"; echo "$tmp/e")"; fi
so=$(readelf -d "$prefix/lib/libmha.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$so" = "libmha.so.$major" ] && ok "soname libmha.so.$major" || bad "soname is '$so', expected libmha.so.$major"
[ "$(readlink "$prefix/lib/libmha.so")" = "libmha.so.$major" ] &&
  [ "$(readlink "$prefix/lib/libmha.so.$major")" = "libmha.so.$version" ] &&
  ok "libmha.so -> libmha.so.$major -> libmha.so.$version" || bad "library links are wrong"

# --------------------------------------------- a C user, outside the repo
# One layer, T=2, causal, W_Q = 0 (every score 0: uniform attention over
# the allowed keys), W_V = I, W_O = 2I, b_O = 1, so
#   y[0] = 2*x[0] + 1,  y[1] = (x[0] + x[1]) + 1.
mkdir -p "$tmp/app"
cat >"$tmp/app/main.c" <<'EOF'
#include <math.h>
#include <stdio.h>
#include <mha.h>

int main(void) {
    enum { D = 4, H = 2, T = 2 };
    float wq[D * D] = {0}, wk[D * D], wv[D * D] = {0}, wo[D * D] = {0}, zero[D] = {0}, bo[D];
    for (int i = 0; i < D * D; i++) wk[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int i = 0; i < D; i++) { wv[i * D + i] = 1.0f; wo[i * D + i] = 2.0f; bo[i] = 1.0f; }
    mha_config cfg = mha_config_default(D, H);
    mha_weights w = {wq, wk, wv, wo, zero, zero, zero, bo, NULL, NULL};
    mha_layer *layer;
    if (mha_layer_create(&layer, &cfg, &w) != MHA_OK) { fprintf(stderr, "%s\n", mha_last_error()); return 1; }
    float x[T * D] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, 3.0f, -2.0f, 0.75f}, y[T * D];
    mha_options opt = mha_options_default();
    opt.causal = 1;
    if (mha_forward(layer, y, NULL, x, NULL, 1, T, T, &opt) != MHA_OK) { fprintf(stderr, "%s\n", mha_last_error()); return 1; }
    mha_layer_free(layer);
    double worst = 0;
    for (int c = 0; c < D; c++) {
        worst = fmax(worst, fabs(y[c] - (2.0 * x[c] + 1.0)));
        worst = fmax(worst, fabs(y[D + c] - (x[c] + x[D + c] + 1.0)));
    }
    printf("max error %.3g\n", worst);
    return worst < 1e-5 ? 0 : 1;
}
EOF
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cd "$tmp/app"
if $CC -std=c11 -o app main.c $(pkg-config --cflags --libs mha) -lm 2>"$tmp/log"; then
  needed=$(readelf -d app | sed -n 's/.*(NEEDED).*\[\(libmha[^]]*\)\]/\1/p')
  [ "$needed" = "libmha.so.$major" ] && ok "the C program links libmha.so.$major" ||
    bad "the C program needs '$needed', expected libmha.so.$major"
  LD_LIBRARY_PATH="$prefix/lib" ./app >"$tmp/log" 2>&1 && ok "the C program's forward: $(cat "$tmp/log")" ||
    { bad "the C program failed:"; cat "$tmp/log"; }
else bad "building the C program with pkg-config failed:"; cat "$tmp/log"; fi
# Static: libmha.a and mha.pc's private libraries (jansson, libgomp, libm).
if $CC -std=c11 -o app_static main.c $(pkg-config --cflags mha) -L"$prefix/lib" -Wl,-Bstatic -lmha \
     -Wl,-Bdynamic $(pkg-config --libs-only-other --libs-only-l --static mha | sed 's/-lmha//') -lm \
     2>"$tmp/log" && ./app_static >"$tmp/log" 2>&1; then
  if readelf -d app_static | grep -q 'libmha'; then bad "the static program still needs libmha.so"
  else ok "the static program (pkg-config --static): $(cat "$tmp/log")"; fi
else bad "the static C program failed:"; cat "$tmp/log"; fi
# Against the build tree, as a developer would before installing: the
# soname the program records (libmha.so.0) must exist beside libmha.so.
if $CC -std=c11 -o app_tree main.c -I"$repo/include" -L"$repo/build" -lmha -Wl,-rpath,"$repo/build" -lm \
     2>"$tmp/log" && ./app_tree >"$tmp/log" 2>&1; then ok "a program linked against build/libmha.so runs: $(cat "$tmp/log")"
else bad "a program linked against build/libmha.so failed:"; cat "$tmp/log"; fi
cd "$repo"

# ------------------------------------------------- the man page = --help
# Undo manpage.sh's roff escapes in the .nf blocks and compare them with
# the CLI's help texts, in order.
mha="$prefix/bin/mha"
{ "$mha" --help; for c in $("$mha" --help | awk '/^commands:/ {on = 1; next} on && /^  [a-z]/ {print $1}'); do
    "$mha" "$c" --help; done; } >"$tmp/help.txt"
awk '/^\.nf$/ {on = 1; next} /^\.fi$/ {on = 0; next} on' "$prefix/share/man/man1/mha.1" |
  sed -e 's/^\\&//' -e 's/\\e/\\/g' >"$tmp/man.txt"
if [ -s "$tmp/help.txt" ] && cmp -s "$tmp/help.txt" "$tmp/man.txt"; then
  ok "mha.1 holds mha --help and every command's --help ($(wc -l <"$tmp/help.txt") lines)"
else bad "mha.1 differs from the CLI's help:"; diff "$tmp/help.txt" "$tmp/man.txt" | head -20; fi

# ------------------------------------------ a Python user, outside the repo
# pip's prefix layout differs between Pythons (Debian adds local/), so find
# where the package went rather than assume it.
# From a copy: setuptools writes build/ and *.egg-info next to the sources.
cp -R python "$tmp/python_src"
if "$PY" -m pip install --no-build-isolation --no-deps --no-index --no-cache-dir \
     --root-user-action=ignore --prefix "$prefix" "$tmp/python_src" >"$tmp/log" 2>&1; then
  site=$(dirname "$(find "$prefix" -path '*/mha/__init__.py' | head -1)")
  site=$(dirname "$site")
  cd "$tmp"
  if env -u MHA_LIBRARY PYTHONPATH="$site" "$PY" - "$prefix" >"$tmp/log" 2>&1 <<'EOF'
import os, sys
import numpy as np
import mha
prefix = os.path.realpath(sys.argv[1])
pkg = os.path.realpath(os.path.dirname(mha.__file__))
lib = os.path.realpath(mha._lib.lib._name)
assert pkg.startswith(prefix + os.sep), f"imported {pkg}, expected the package under {prefix}"
assert lib.startswith(os.path.join(prefix, "lib") + os.sep), f"loaded {lib}, expected {prefix}/lib"
# The C program's layer: y[0] = 2 x[0] + 1, y[1] = x[0] + x[1] + 1.
D = 4
w = {"w_q": np.zeros((D, D)), "w_k": np.arange(D * D).reshape(D, D) % 7 * 0.1 - 0.3,
     "w_v": np.eye(D), "w_o": 2 * np.eye(D), "b_q": np.zeros(D), "b_k": np.zeros(D),
     "b_v": np.zeros(D), "b_o": np.ones(D)}
x = np.array([[[0.5, -1, 2, 0.25], [1.5, 3, -2, 0.75]]], dtype=np.float32)
y = mha.Layer(D, 2, weights={k: v.astype(np.float32) for k, v in w.items()}).forward(x, causal=True)
want = np.stack([2 * x[0, 0] + 1, x[0, 0] + x[0, 1] + 1])[None]
err = float(np.abs(y - want).max())
assert err < 1e-5, f"max error {err}"
print(f"loaded {lib}, max error {err:.3g}")
EOF
  then ok "the installed Python package: $(tail -1 "$tmp/log")"
  else bad "the installed Python package failed:"; cat "$tmp/log"; fi
  cd "$repo"
  # pip refuses any uninstall where Debian marks the Python externally
  # managed (PEP 668), even one from a private prefix found via PYTHONPATH.
  PIP_BREAK_SYSTEM_PACKAGES=1 PYTHONPATH="$site" "$PY" -m pip uninstall -y --root-user-action=ignore mha >"$tmp/log" 2>&1 ||
    { bad "pip uninstall failed:"; cat "$tmp/log"; }
else bad "pip install of ./python failed:"; cat "$tmp/log"; fi

# --------------------------------------------------------------- uninstall
make -s uninstall PREFIX="$prefix" >"$tmp/log" 2>&1 || { bad "make uninstall failed:"; cat "$tmp/log"; }
left=$(files "$prefix")
[ -z "$left" ] && ok "make uninstall (and pip uninstall) left no file" || { bad "left behind:"; echo "$left"; }

# ------------------------------------------------------- DESTDIR, bad PREFIX
make -s install DESTDIR="$tmp/stage" PREFIX=/opt/mha >"$tmp/log" 2>&1 || { bad "make install DESTDIR failed:"; cat "$tmp/log"; }
[ "$(files "$tmp/stage/opt/mha")" = "$expected" ] &&
  grep -qx 'prefix=/opt/mha' "$tmp/stage/opt/mha/lib/pkgconfig/mha.pc" &&
  ok "DESTDIR stages the files; mha.pc names the final prefix" || bad "DESTDIR install is wrong"
make -s uninstall DESTDIR="$tmp/stage" PREFIX=/opt/mha >"$tmp/log" 2>&1
[ -z "$(files "$tmp/stage")" ] && ok "make uninstall DESTDIR left no file" || bad "DESTDIR uninstall left files"
if make -s install PREFIX=relative/prefix >"$tmp/log" 2>&1; then bad "a relative PREFIX was accepted"
elif [ -e relative ]; then bad "a refused install created relative/"; rm -rf relative
else ok "a relative PREFIX is refused: $(grep -o 'PREFIX=.*' "$tmp/log" | head -1)"; fi

finish install_test
