#!/bin/sh
# io_cli_test.sh — the file commands end to end: `mha run` on the same
# weights written in every layout (native, hf, gpt2, megatron) gives the
# same Y; convert and permute round trips; masks; a value source apart from
# the keys (--v-input); `mha audit` recovers the exact repair of corrupted
# checkpoints (W_O row blocks swapped, W_Q column blocks swapped, K/V blocks
# swapped, GQA groups scrambled by a wrong fused layout) and says so when a
# mismatch is not a permutation; `mha plot` writes PNGs; every bad file gets
# its error (exit 1, one line naming the problem), never a crash. Fixtures
# come from tests/python/io_fixtures.py (numpy, with a safetensors writer
# independent of the library's).
#   usage: sh tests/io_cli_test.sh ./build/mha
MHA=${1:?usage: sh tests/io_cli_test.sh PATH_TO_MHA}
PY=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$MHA" ] || { echo "io_cli_test: '$MHA' is not an executable" >&2; exit 1; }
# numpy builds the fixtures and the oracle: without it the suite cannot
# check anything, which is a failure, not a pass
if ! "$PY" -c "import numpy" 2>/dev/null; then
    echo "io_cli_test: FAILED: $PY cannot import numpy, needed for the fixtures and the oracle (run 'make setup')" >&2
    exit 1
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
fx() { "$PY" "$here/python/io_fixtures.py" "$@"; }
fx make "$tmp" || { echo "io_cli_test: fixtures failed" >&2; exit 1; }
checks=0
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

run() {
    "$MHA" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    last="mha $*"
}
expect_ok() {
    checks=$((checks + 1))
    [ "$rc" -eq 0 ] || fail "$last: exit $rc; stderr: $(head -c 400 "$tmp/err")"
}
# expect_error CODE PATTERN: exit CODE, one stderr line "mha <cmd>: ..." containing PATTERN
expect_error() {
    checks=$((checks + 1))
    [ "$rc" -eq "$1" ] || fail "$last: exit $rc, want $1; stderr: $(head -c 300 "$tmp/err")"
    [ "$rc" -ge 128 ] && fail "$last: crashed (signal $((rc - 128)))"
    [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "$last: want one stderr line, got: $(head -c 400 "$tmp/err")"
    grep -q "^mha [a-z]*: " "$tmp/err" || fail "$last: stderr does not start 'mha <cmd>: '"
    grep -qF -- "$2" "$tmp/err" || fail "$last: stderr does not mention '$2': $(cat "$tmp/err")"
}
expect_out() { # PATTERN in stdout
    checks=$((checks + 1))
    grep -qF -- "$1" "$tmp/out" || fail "$last: stdout does not contain '$1': $(head -c 600 "$tmp/out")"
}
close() { # A B [TOL]
    checks=$((checks + 1))
    fx close "$@" >"$tmp/close" || fail "$last: $1 vs $2 $(cat "$tmp/close")"
}
# oracle Y.npy gqa|mha [ORACLE FLAGS]: Y against numpy's float64 layer from
# the fixture weights (tests/mha_oracle.py), independent of the library
oracle() {
    checks=$((checks + 1))
    y=$1 w=$2
    shift 2
    if [ "$w" = gqa ]; then hk=2; else hk=4; fi
    "$PY" "$here/mha_oracle.py" $T/weights_$w.npz 4 $hk $T/x.npy "$y" "$@" >"$tmp/close" ||
        fail "$last: $y vs the numpy oracle: $(cat "$tmp/close")"
}
T=$tmp

# --- every layout of the same weights gives the same Y ---------------------
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_native.npy
expect_ok
expect_out "h=4, h_kv=2"
oracle $T/y_native.npy gqa
run run --weights $T/hf.safetensors --heads 4 --input $T/x.npy --output $T/y_hf.npy
expect_ok
oracle $T/y_hf.npy gqa
run run --weights $T/phi3.safetensors --heads 4 --input $T/x.npy --output $T/y_phi3.npy
expect_ok
oracle $T/y_phi3.npy gqa
run run --weights $T/opt.safetensors --heads 4 --input $T/x.npy --output $T/y_opt.npy
expect_ok
oracle $T/y_opt.npy gqa
run run --weights $T/megatron.safetensors --layout megatron --heads 4 --input $T/x.npy --output $T/y_mg.npy
expect_ok
oracle $T/y_mg.npy gqa
run run --weights $T/mha_native.safetensors --input $T/x.npy --output $T/y_mha.npy
expect_ok
oracle $T/y_mha.npy mha
run run --weights $T/gpt2.safetensors --heads 4 --input $T/x.npy --output $T/y_gpt2.npy
expect_ok
oracle $T/y_gpt2.npy mha
# a whole model: --prefix may name the block (the MLP's c_proj is not W_O)
for p in h.1 h.1. h.1.attn h.1.attn.; do
    run run --weights $T/gpt2_model.safetensors --heads 4 --prefix $p --input $T/x.npy --output $T/y_gpt2_$p.npy
    expect_ok
    oracle $T/y_gpt2_$p.npy mha
done
run run --weights $T/gpt2_model.safetensors --heads 4 --prefix h --input $T/x.npy --output $T/y_gpt2_h.npy
expect_error 1 "2 layers lie inside prefix 'h' ('h.0.attn.', 'h.1.attn.')"
# the same model in two shards with an index (block 1's attention split between them)
run run --weights $T/gpt2.safetensors.index.json --heads 4 --prefix h.1 --input $T/x.npy --output $T/y_gpt2_index.npy
expect_ok
oracle $T/y_gpt2_index.npy mha
run run --weights $T/gpt2.safetensors.index.json --heads 4 --input $T/x.npy --output $T/y_gpt2_index2.npy
expect_error 1 "weight_map has 2 attention layers ('h.0.attn.', 'h.1.attn.')"

# --- convert then run equals running the source -------------------------------
for l in hf megatron; do
    run convert --from $l --heads 4 --to native $T/$l.safetensors $T/conv_$l.safetensors
    expect_ok
    run run --weights $T/conv_$l.safetensors --input $T/x.npy --output $T/y_conv_$l.npy
    expect_ok
    oracle $T/y_conv_$l.npy gqa
done
run convert --from gpt2 --heads 4 --to native $T/gpt2.safetensors $T/conv_gpt2.safetensors
expect_ok
run run --weights $T/conv_gpt2.safetensors --input $T/x.npy --output $T/y_conv_gpt2.npy
expect_ok
oracle $T/y_conv_gpt2.npy mha
# the layer's variant flags are written into the native file: it runs as `mha run` with them
run convert --from native --to native --rope halves --rope-theta 500 --softcap 2 --alibi --clip-qkv 0.25 \
    $T/native.safetensors $T/conv_var.safetensors
expect_ok
[ "$(fx meta $T/conv_var.safetensors rope)" = halves ] && [ "$(fx meta $T/conv_var.safetensors softcap)" = 2 ] &&
    [ "$(fx meta $T/conv_var.safetensors clip_qkv)" = 0.25 ] ||
    fail "convert --rope halves --softcap 2 --clip-qkv 0.25: metadata rope '$(fx meta $T/conv_var.safetensors rope)'" \
        "clip_qkv '$(fx meta $T/conv_var.safetensors clip_qkv)'"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_var_flags.npy --rope halves --rope-theta 500 \
    --softcap 2 --alibi --clip-qkv 0.25
expect_ok
run run --weights $T/conv_var.safetensors --input $T/x.npy --output $T/y_var_file.npy
expect_ok
close $T/y_var_file.npy $T/y_var_flags.npy
# the clamp matters here: without it Y is another
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_var_noclip.npy --rope halves --rope-theta 500 \
    --softcap 2 --alibi
expect_ok
checks=$((checks + 1))
fx close $T/y_var_noclip.npy $T/y_var_flags.npy >/dev/null 2>&1 && fail "--clip-qkv 0.25 left Y unchanged"

# --- consistent permutation: same Y, labels moved -----------------------------
run permute --order 2,3,0,1 $T/native.safetensors $T/perm.safetensors
expect_ok
run run --weights $T/perm.safetensors --input $T/x.npy --output $T/y_perm.npy
expect_ok
oracle $T/y_perm.npy gqa
checks=$((checks + 1))
[ "$(fx meta $T/perm.safetensors labels_o)" = "2,3,0,1" ] || fail "permute: labels_o is '$(fx meta $T/perm.safetensors labels_o)'"
[ "$(fx meta $T/perm.safetensors labels_k)" = "1,0" ] || fail "permute: labels_k is '$(fx meta $T/perm.safetensors labels_k)'"
run permute --order 1,2,0,3 $T/native.safetensors $T/x.safetensors
expect_error 2 "kv group"
run permute --order 0,0,1,2 $T/native.safetensors $T/x.safetensors
expect_error 2 "perm"
run permute --order 0,1,2 $T/native.safetensors $T/x.safetensors
expect_error 2 "4 comma-separated"
# an empty positional argument names no file: refused by name (it was an
# open's "No such file or directory", for IN and for OUT alike)
run convert --from native --to native $T/native.safetensors ""
expect_error 2 "the OUT argument is empty (''); expected a file path"
run convert --from native --to native "" $T/x.safetensors
expect_error 2 "the IN argument is empty (''); expected a file path"
run permute --order 1,0,2,3 $T/native.safetensors ""
expect_error 2 "the OUT argument is empty"
run permute --order 1,0,2,3 "" $T/x.safetensors
expect_error 2 "the IN argument is empty"
checks=$((checks + 1))
[ ! -e $T/x.safetensors ] || fail "an empty argument wrote $T/x.safetensors"
for order in " 1,0,2,3" "1,+0,2,3" "1,0,2,3," "1,0,2, 3"; do
    run permute --order "$order" $T/native.safetensors $T/x.safetensors
    expect_error 2 "4 comma-separated"
done

# --- inputs: unbatched, float16, cross-attention, masks -----------------------
run run --weights $T/native.safetensors --input $T/x2d.npy --output $T/y2d.npy --save-probs $T/p2d.npy
expect_ok
expect_out "unbatched"
"$PY" -c "
import numpy as np, sys
y=np.load('$T/y2d.npy'); Y=np.load('$T/y_native.npy'); p=np.load('$T/p2d.npy')
ok = y.shape==(6,16) and np.allclose(y, Y[0], atol=1e-5) and p.shape==(4,6,6) and np.allclose(p.sum(-1),1,atol=1e-5)
sys.exit(0 if ok else 1)" || fail "unbatched input: outputs do not match the batched run"
checks=$((checks + 1))
run run --weights $T/native.safetensors --input $T/x_f16.npy --output $T/y_f16.npy
expect_ok
close $T/y_f16.npy $T/y_native.npy 0.05
run run --weights $T/native.safetensors --input $T/x.npy --kv-input $T/kv.npy --output $T/y_kv.npy --save-probs $T/p_kv.npy
expect_ok
oracle $T/y_kv.npy gqa --kv $T/kv.npy
"$PY" -c "
import numpy as np, sys
p=np.load('$T/p_kv.npy'); sys.exit(0 if p.shape==(2,4,6,8) else 1)" || fail "cross-attention probs shape"
checks=$((checks + 1))
# causal three ways: --causal, bool attn_mask (True = not allowed), float -inf mask
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_c1.npy --causal
expect_ok
oracle $T/y_c1.npy gqa --causal
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_c2.npy --attn-mask $T/causal_bool.npy
expect_ok
oracle $T/y_c2.npy gqa --mask $T/causal_bool.npy
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_c3.npy --attn-mask $T/causal_float.npy
expect_ok
oracle $T/y_c3.npy gqa --causal
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_c4.npy --causal=bottom-right
expect_ok
oracle $T/y_c4.npy gqa --causal
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_kp.npy --key-padding-mask $T/kpm.npy
expect_ok
oracle $T/y_kp.npy gqa --kpm $T/kpm.npy
"$PY" -c "
import numpy as np, sys
a=np.load('$T/y_kp.npy'); b=np.load('$T/y_native.npy')
sys.exit(0 if np.allclose(a[0],b[0],atol=1e-6) and not np.allclose(a[1],b[1],atol=1e-3) else 1)" ||
    fail "key padding: batch 0 should be unchanged and batch 1 changed"
checks=$((checks + 1))

# --- a value source apart from the keys (PyTorch's value, d_v_in != d_kv_in) --
# expected Y from numpy, written here from the formulas in mha.h
"$PY" - "$T" "$here" <<'EOF' || fail "value-source fixture"
import sys; import numpy as np
sys.path.insert(0, sys.argv[2] + "/python"); from io_helpers import write_safetensors
d, r = sys.argv[1], np.random.RandomState(7)
f = lambda *s: r.uniform(-0.5, 0.5, s).astype(np.float32)
w = {"w_q": f(16, 16), "w_k": f(12, 16), "w_v": f(10, 16), "w_o": f(16, 16), "b_q": f(16), "b_k": f(16),
     "b_v": f(16), "b_o": f(16)}
write_safetensors(d + "/kv_apart.safetensors", w, {"n_heads": 4})
x, k, v = f(2, 6, 16) * 4, f(2, 5, 12) * 4, f(2, 5, 10) * 4
for n, a in (("xa", x), ("ka", k), ("va", v), ("va_bad", f(2, 5, 12))): np.save(d + "/" + n + ".npy", a)
q, kk, vv = x @ w["w_q"] + w["b_q"], k @ w["w_k"] + w["b_k"], v @ w["w_v"] + w["b_v"]
z = np.zeros((2, 6, 16))
for h in range(4):
    s = q[..., 4*h:4*h+4] @ kk[..., 4*h:4*h+4].transpose(0, 2, 1) / 2.0
    p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    z[..., 4*h:4*h+4] = p @ vv[..., 4*h:4*h+4]
np.save(d + "/ya_want.npy", (z @ w["w_o"] + w["b_o"]).astype(np.float32))
EOF
for p in reference fast; do
    run run --weights $T/kv_apart.safetensors --input $T/xa.npy --kv-input $T/ka.npy --v-input $T/va.npy --output $T/ya_$p.npy --path $p
    expect_ok
    close $T/ya_$p.npy $T/ya_want.npy
done
run run --weights $T/kv_apart.safetensors --input $T/xa.npy --kv-input $T/ka.npy --output $T/y.npy
expect_error 2 "--v-input"
run run --weights $T/kv_apart.safetensors --input $T/xa.npy --kv-input $T/ka.npy --v-input $T/va_bad.npy --output $T/y.npy
expect_error 1 "d_v_in"

# --- outputs are allocated without zeroing: the forward must write every
# element. glibc's MALLOC_PERTURB_ fills fresh allocations with a byte, so two
# fills give byte-identical files only if nothing was left unwritten.
for fill in 90 165; do
    for p in reference fast; do
        MALLOC_PERTURB_=$fill "$MHA" run --weights $T/native.safetensors --input $T/x.npy --output $T/yp$fill$p.npy \
            --save-z $T/zp$fill$p.npy --save-contributions $T/cp$fill$p.npy --save-probs $T/pp$fill$p.npy \
            --key-padding-mask $T/kpm.npy --causal --path $p >"$tmp/out" 2>"$tmp/err"
        rc=$?; last="MALLOC_PERTURB_=$fill mha run --path $p (all captures)"
        expect_ok
    done
done
for p in reference fast; do
    for o in y z c p; do
        checks=$((checks + 1))
        cmp -s $T/${o}p90$p.npy $T/${o}p165$p.npy || fail "--path $p: output $o depends on the allocator's fill: an element is never written"
    done
done

# --- ablation: zeroing head 1 removes exactly its contribution ---------------
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_full.npy --save-contributions $T/c.npy --save-z $T/z.npy
expect_ok
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_abl.npy --ablate 1=zero,2=scale:0.5
expect_ok
oracle $T/y_abl.npy gqa --ablate 1=zero --ablate 2=scale:0.5
"$PY" -c "
import numpy as np, sys
y=np.load('$T/y_full.npy'); c=np.load('$T/c.npy'); a=np.load('$T/y_abl.npy'); z=np.load('$T/z.npy')
ok = c.shape==(4,2,6,16) and z.shape==(2,6,16) and np.allclose(a, y - c[1] - 0.5*c[2], atol=1e-5)
sys.exit(0 if ok else 1)" || fail "ablation: Y_ablated != Y - C[1] - 0.5 C[2]"
checks=$((checks + 1))
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --ablate 9=zero
expect_error 2 "out of range"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --ablate 1=explode
expect_error 2 "unknown operation"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --ablate 1=zero,1=mean
expect_error 2 "given twice"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --ablate 1=keep,1=zero
expect_error 2 "head 1 is given twice"
for spec in " 1=zero" "+1=zero" "1=zero,+2=mean" "1=zero, 2=mean"; do
    run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --ablate "$spec"
    expect_error 2 "expected HEAD=OP"
done
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --ablate 1=zero,
expect_error 2 "a ',' ends the list"

# --- attribution: head r's Z.dZ of <dY, Y> is exactly <dY, Y - Y(r zeroed)> -----
"$PY" -c "import numpy as np; np.save('$T/dy.npy', np.random.default_rng(5).standard_normal((2,6,16)).astype(np.float32))"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_full.npy --grad-output $T/dy.npy --save-attribution $T/attr.npy
expect_ok
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_abl.npy --ablate 2=zero
expect_ok
"$PY" -c "
import numpy as np, sys
dy=np.load('$T/dy.npy'); y=np.load('$T/y_full.npy'); a=np.load('$T/y_abl.npy'); A=np.load('$T/attr.npy')
change=(dy*(y-a)).sum(-1)
ok = A.shape==(4,2,6) and np.abs(change).max() > 1e-3 and np.allclose(A[2], change, atol=1e-4)
sys.exit(0 if ok else 1)" || fail "attribution: A[2] != <dY, Y - Y(head 2 zeroed)>"
checks=$((checks + 1))
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --save-attribution $T/attr.npy
expect_error 2 "--grad-output"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --grad-output $T/c.npy --save-attribution $T/attr2.npy
expect_error 1 "dY"
[ ! -e $T/attr2.npy ] || fail "a failed --save-attribution left $T/attr2.npy"

# --- audit: recover the exact repair of corrupted checkpoints -----------------
run audit --weights $T/native.safetensors --input $T/x.npy --reference $T/y_native.npy
expect_ok
expect_out "reproduces the reference"
audit_case() { # NAME CORRUPT_ARGS... ; corrupts native with `mha permute`, audits, applies the fix
    name=$1; shift
    run permute "$@" $T/native.safetensors $T/$name.safetensors
    expect_ok
    run audit --weights $T/$name.safetensors --input $T/x.npy --reference $T/y_native.npy
    checks=$((checks + 1))
    [ "$rc" -eq 1 ] || fail "audit $name: exit $rc, want 1"
    fix=$(grep '^fix: ' "$tmp/out" | sed 's/^fix: mha //')
    [ -n "$fix" ] || { fail "audit $name: no fix printed: $(cat "$tmp/out")"; return; }
    echo "$fix" | grep -qF -- "$want_fix" || fail "audit $name: fix '$fix' does not contain '$want_fix'"
    # shellcheck disable=SC2086
    run $fix
    expect_ok
    run audit --weights $T/${name}_fixed.safetensors --input $T/x.npy --reference $T/y_native.npy
    expect_ok
    expect_out "labels: consistent"
}
# audit_fix NAME WANT AUDIT_ARGS...: the audit finds the mismatch (exit 1),
# prints the fix line WANT, and that `mha permute` runs
audit_fix() {
    name=$1 want=$2; shift 2
    run audit "$@"
    checks=$((checks + 1))
    [ "$rc" -eq 1 ] || fail "audit $name: exit $rc, want 1"
    expect_out "$want"
    fix=$(grep '^fix: ' "$tmp/out" | sed 's/^fix: mha //')
    # shellcheck disable=SC2086
    run $fix
    expect_ok
}
want_fix="--block o --order 1,0,2,3"
audit_case bad_o --block o --order 1,0,2,3
want_fix="--block q --order 3,0,1,2"
audit_case bad_q --block q --order 1,2,3,0
want_fix="--block kv --order 1,0"
audit_case bad_kv --block kv --order 1,0
# GQA groups scrambled by a wrong fused-layout reader (labels look fine)
run audit --weights $T/wrong_fused.safetensors --input $T/x.npy --reference $T/y_native.npy
checks=$((checks + 1))
[ "$rc" -eq 1 ] || fail "audit wrong_fused: exit $rc"
expect_out "labels: consistent"
expect_out "fix: mha permute --block q --order 0,2,1,3 --relabel"
fix=$(grep '^fix: ' "$tmp/out" | sed 's/^fix: mha //')
# shellcheck disable=SC2086
run $fix
expect_ok
run run --weights $T/wrong_fused_fixed.safetensors --input $T/x.npy --output $T/y_wf.npy
expect_ok
close $T/y_wf.npy $T/y_native.npy
# not a permutation
run audit --weights $T/scaled.safetensors --input $T/x.npy --reference $T/y_native.npy
checks=$((checks + 1))
[ "$rc" -eq 1 ] || fail "audit scaled: exit $rc"
expect_out "not a permutation"
grep -q '^fix:' "$tmp/out" && fail "audit scaled: printed a fix"
# a disagreeing ALiBi-slope label is named as such (audit's table of block
# names had four entries and read past it for MHA_BLOCK_S)
run audit --weights $T/alibi_s.safetensors --input $T/x.npy --reference $T/y_native.npy
checks=$((checks + 1))
[ "$rc" -eq 1 ] || fail "audit alibi_s: exit $rc, want 1"
expect_out "labels: disagree: score parameter (ALiBi slope, sink) block at position 0 has label 1, expected 0"
# ... and the slopes moved alone are found and repaired (--block s)
run run --weights $T/alibi.safetensors --input $T/x.npy --output $T/y_alibi.npy
expect_ok
audit_fix "alibi_s vs y_alibi" "fix: mha permute --block s --order 1,0,2,3 --relabel" \
    --weights $T/alibi_s.safetensors --input $T/x.npy --reference $T/y_alibi.npy
run audit --weights $T/alibi_s_fixed.safetensors --input $T/x.npy --reference $T/y_alibi.npy
expect_ok
expect_out "labels: consistent"
# a file name with a space and a quote: the printed fix is one shell line
# that runs as printed (the names quoted as shell words)
cp $T/alibi_s.safetensors "$T/slopes it's.safetensors"
run audit --weights "$T/slopes it's.safetensors" --input $T/x.npy --reference $T/y_alibi.npy
checks=$((checks + 1))
[ "$rc" -eq 1 ] || fail "audit of a quoted name: exit $rc, want 1"
expect_out "--relabel '$T/slopes it'\\''s.safetensors' '$T/slopes it'\\''s_fixed.safetensors'"
fix=$(grep '^fix: ' "$tmp/out" | sed 's/^fix: mha //')
eval "set -- $fix"
run "$@"
expect_ok
checks=$((checks + 1))
[ -f "$T/slopes it's_fixed.safetensors" ] || fail "the printed fix did not write 'slopes it''s_fixed.safetensors'"
run permute --block s --order 1,0,2,3 $T/native.safetensors $T/no_slopes.safetensors
expect_error 2 "has no ALiBi slopes or sinks"
# the variant flags' errors name the command that took them
run permute --block o --order 1,0,2,3 --rope halves --rope-scale bogus $T/native.safetensors $T/bad_scale.safetensors
expect_error 2 "mha permute: --rope-scale 'bogus'"
[ ! -e $T/bad_scale.safetensors ] || fail "a refused permute --rope-scale wrote its output"
run audit --weights $T/native.safetensors --input $T/x.npy --reference $T/y_native.npy --rope halves --rope-dim 3
expect_error 2 "mha audit: --rope-dim is 3"
[ ! -e $T/no_slopes.safetensors ] || fail "a refused permute --block s wrote its output"
# identical heads: several orders fit exactly; the audit says it cannot tell
# (it said "no reordering ... explains the mismatch") and prints no fix
run run --weights $T/twin.safetensors --input $T/x.npy --output $T/y_twin.npy
expect_ok
run permute --block o --order 1,2,0,3 $T/twin.safetensors $T/twin_bad.safetensors
expect_ok
run audit --weights $T/twin_bad.safetensors --input $T/x.npy --reference $T/y_twin.npy
checks=$((checks + 1))
[ "$rc" -eq 1 ] || fail "audit twin_bad: exit $rc, want 1"
expect_out "positions 0, 1 can hold several blocks"
expect_out "cannot tell: a reordering fits the reference"
grep -q '^fix:' "$tmp/out" && fail "audit twin_bad: printed a fix"
grep -q 'no reordering' "$tmp/out" && fail "audit twin_bad: says no reordering explains an exact fit"
# a head that contributes nothing (zero W_O rows) moved: its position is the
# one left over, and the repair is found (it was "not a permutation")
run run --weights $T/silent.safetensors --input $T/x.npy --output $T/y_silent.npy
expect_ok
run permute --block o --order 3,0,1,2 $T/silent.safetensors $T/silent_bad.safetensors
expect_ok
# read off the fit (the pairing search would find it too, without saying why)
run audit --weights $T/silent_bad.safetensors --input $T/x.npy --reference $T/y_silent.npy
expect_out "contributes nothing on this input; it takes block"
audit_fix silent_bad "fix: mha permute --block o --order 1,2,3,0 --relabel" \
    --weights $T/silent_bad.safetensors --input $T/x.npy --reference $T/y_silent.npy
run audit --weights $T/silent_bad_fixed.safetensors --input $T/x.npy --reference $T/y_silent.npy
expect_ok
expect_out "labels: consistent"

# --- plot -------------------------------------------------------------------
run plot --weights $T/native.safetensors --input $T/x.npy --causal --out $T/attn.png
expect_ok
checks=$((checks + 1))
fx is_png $T/attn.png || fail "plot: attn.png is not a PNG"
fx is_png $T/attn_contrib.png || fail "plot: attn_contrib.png is not a PNG"
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/a.png --batch 2
expect_error 2 "--batch 2"

# --- the oracle itself tells layers apart (a check that can fail) ---------------
checks=$((checks + 1))
"$PY" "$here/mha_oracle.py" $T/weights_mha.npz 4 4 $T/x.npy $T/y_native.npy >/dev/null &&
    fail "oracle: accepted Y of the GQA layer as the MHA layer's"
"$PY" "$here/mha_oracle.py" $T/weights_gqa.npz 4 2 $T/x.npy $T/y_native.npy --causal >/dev/null &&
    fail "oracle: accepted a non-causal Y as causal"

# --- outputs: never an input, all or none, existing files kept -----------------
# entries of $T, to see that a failed command leaves no temporary behind
K=$T/.keep
mkdir "$K"
entries() { ls -A "$T" >"$K/entries_now"; wc -l <"$K/entries_now"; }
snapshot() { ls -A "$T" >"$K/entries_then"; n0=$(wc -l <"$K/entries_then"); }
new_entries() { diff "$K/entries_then" "$K/entries_now" | tr '\n' ' '; }
keep() { cp "$T/$1" "$K/$1"; }
unchanged() { # FILE: byte-identical to its copy made by keep
    checks=$((checks + 1))
    cmp -s "$T/$1" "$K/$1" || fail "$last: $1 changed"
}
keep native.safetensors
keep x.npy
snapshot
run run --weights $T/native.safetensors --input $T/x.npy --output $T/native.safetensors
expect_error 2 "--output '$T/native.safetensors' is the same file as --weights"
unchanged native.safetensors
ln -s native.safetensors $T/link.safetensors
run run --weights $T/link.safetensors --input $T/x.npy --output $T/native.safetensors
expect_error 2 "is the same file as --weights '$T/link.safetensors'"
rm $T/link.safetensors
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/x.npy
expect_error 2 "--out '$T/x.npy' is the same file as --input"
unchanged x.npy
run run --weights $T/native.safetensors --input $T/x.npy --output $T/new_y.npy --save-z $T/new_y.npy
expect_error 2 "--save-z '$T/new_y.npy' is the same file as --output"
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/new_a.png --contrib-out $T/new_a.png
expect_error 2 "--contrib-out '$T/new_a.png' is the same file as --out"
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/new_a.png --contrib-out $T/./new_a.png
expect_error 2 "is the same file as --out"
run convert --from native --to native $T/native.safetensors $T/../$(basename $T)/native.safetensors
expect_error 2 "is the same file as IN"
unchanged native.safetensors
run permute --order 0,1,2,3 $T/native.safetensors $T/native.safetensors
expect_error 2 "OUT '$T/native.safetensors' is the same file as IN"
# a missing directory for the second output: nothing written, strerror given
run run --weights $T/native.safetensors --input $T/x.npy --output $T/fresh_y.npy --save-contributions $T/nodir/c.npy
expect_error 1 "cannot write --save-contributions '$T/nodir/c.npy': directory '$T/nodir': No such file or directory"
checks=$((checks + 1))
[ -e $T/fresh_y.npy ] && fail "$last: left fresh_y.npy behind"
run run --weights $T/native.safetensors --input $T/x.npy --output $T
expect_error 1 "cannot write --output '$T': it is a directory"
run run --weights $T --input $T/x.npy --output $T/y.npy
expect_error 1 "directory '$T' holds neither model.safetensors nor model.safetensors.index.json"
checks=$((checks + 1))
grep -q "allocate" "$tmp/err" && fail "$last: tried to allocate a directory's size"
checks=$((checks + 1))
[ "$(entries)" -eq "$n0" ] || fail "refused commands left files: $(new_entries)"
# a write that fails half-way (file size limit, SIGXFSZ ignored): every
# existing target byte-identical, no temporary left, one error line
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_old.npy --save-probs $T/p_old.npy
expect_ok
keep y_old.npy
keep p_old.npy
cp $T/native.safetensors $T/conv_old.safetensors
keep conv_old.safetensors
cp $T/p_old.npy $T/old.png
keep old.png
snapshot
# limited BLOCKS ARGS...: mha under `ulimit -f BLOCKS` (512-byte blocks in sh)
limited() {
    b=$1
    shift
    (trap '' XFSZ; ulimit -f $b; "$MHA" "$@") >"$tmp/out" 2>"$tmp/err"
    rc=$?
    last="mha $* (ulimit -f $b)"
}
# Y (896 bytes) fits under 1 KiB and P (1280 bytes) does not: the new Y
# (causal, so different) must not replace the old one either
limited 2 run --weights $T/native.safetensors --input $T/x.npy --causal --output $T/y_old.npy --save-probs $T/p_old.npy
expect_error 1 "cannot write --save-probs: cannot write '$T/p_old.npy' (flush failed): File too large; the file is unchanged"
unchanged y_old.npy
unchanged p_old.npy
limited 1 run --weights $T/native.safetensors --input $T/x.npy --output $T/y_old.npy
expect_error 1 "cannot write --output: cannot write '$T/y_old.npy' (flush failed): File too large"
unchanged y_old.npy
limited 1 convert --from native --to native $T/native.safetensors $T/conv_old.safetensors
expect_error 1 "File too large"
unchanged conv_old.safetensors
limited 1 permute --order 1,0,3,2 $T/native.safetensors $T/conv_old.safetensors
expect_error 1 "File too large"
unchanged conv_old.safetensors
limited 1 plot --weights $T/native.safetensors --input $T/x.npy --out $T/old.png --contrib-out $T/old_c.png
expect_error 1 "cannot write --out '$T/old.png': Write Error: File too large; the file is unchanged"
unchanged old.png
checks=$((checks + 1))
[ "$(entries)" -eq "$n0" ] || fail "failed writes left files: $(new_entries)"
# sizes are checked before the work, naming the flag and the size in GiB
run run --weights $T/native.safetensors --input $T/x.npy --output $T/new_y.npy --save-probs $T/new_p.npy --max-output-gib 1e-6
expect_error 2 "--save-probs would hold 1.07e-06 GiB (288 float32 values), above the limit of 1e-06 GiB; raise it with --max-output-gib"
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/new_a.png --max-output-gib 1e-7
expect_error 2 "above the limit of 1e-07 GiB"
# plot's canvases count too, before the forward: the captures here are 5 KB,
# the heatmaps' canvas 540 KB (3 bytes a pixel), which a limit that passed
# the captures rendered and wrote anyway
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/new_a.png --max-output-gib 1e-4
expect_error 2 "--out's canvas (418 x 431 RGB pixels) would hold 0.000503 GiB (540474 bytes), above the limit of 0.0001 GiB"
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/new_a.png --max-output-gib 5.05e-4
expect_error 2 "the captures and a canvas together would hold 0.000508 GiB (545466 bytes)"
checks=$((checks + 1))
[ "$(entries)" -eq "$n0" ] || fail "refused sizes left files: $(new_entries)"

# --- '-': standard output for mha run's arrays, refused elsewhere ---------------
# '-' wrote a file named '-'. An array goes to standard output whole, only
# after the command succeeded; the summary line then goes to stderr.
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_dash_file.npy
run run --weights $T/native.safetensors --input $T/x.npy --output -
expect_ok
checks=$((checks + 1))
cmp -s "$tmp/out" $T/y_dash_file.npy || fail "$last: stdout is not the .npy of Y"
grep -q "^wrote standard output: 2 x 6 x 16" "$tmp/err" || fail "$last: no summary on stderr: $(cat "$tmp/err")"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_dash2.npy --save-probs -
expect_ok
cp "$tmp/out" $T/p_stdout.npy
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_dash3.npy --save-probs $T/p_dash.npy
checks=$((checks + 1))
cmp -s $T/p_stdout.npy $T/p_dash.npy || fail "--save-probs -: stdout is not the .npy of P"
[ ! -e "$T/-" ] || fail "'-' wrote a file named '-'"
# a failure writes nothing there: before the work, or while writing a file
run run --weights $T/native.safetensors --input $T/x.npy --output - --ablate 9=zero
expect_error 2 "--ablate: head 9 is out of range"
checks=$((checks + 1))
[ ! -s "$tmp/out" ] || fail "$last: wrote to stdout"
limited 1 run --weights $T/native.safetensors --input $T/x.npy --output - --save-probs $T/p_big.npy
expect_error 1 "File too large"
checks=$((checks + 1))
[ ! -s "$tmp/out" ] && [ ! -e $T/p_big.npy ] || fail "$last: wrote stdout or P"
# one output at most, never a terminal or a closed stream; a reader that
# goes away is an error, and then no file is replaced
run run --weights $T/native.safetensors --input $T/x.npy --output - --save-z -
expect_error 2 "--output '-' and --save-z '-' both name standard output; expected at most one output there"
"$MHA" run --weights $T/native.safetensors --input $T/x.npy --output - >&- 2>"$tmp/err"
rc=$? last="mha run --output - (stdout closed)"
expect_error 2 "--output '-': standard output is closed"
if command -v script >/dev/null 2>&1; then
    script -qec "$MHA run --weights $T/native.safetensors --input $T/x.npy --output -" /dev/null >"$tmp/tty" 2>&1
    rc=$?
    checks=$((checks + 1))
    [ "$rc" -eq 2 ] && grep -q "standard output is a terminal" "$tmp/tty" || fail "--output - to a terminal: exit $rc: $(cat "$tmp/tty")"
fi
"$PY" -c "import numpy as np; np.save('$T/x_pipe.npy', np.random.RandomState(4).randn(1, 1100, 16).astype(np.float32))"
printf OLD >$T/z_pipe.npy
{ "$MHA" run --weights $T/native.safetensors --input $T/x_pipe.npy --output - --save-z $T/z_pipe.npy 2>"$tmp/err"; echo $? >"$tmp/rc"; } | :
rc=$(cat "$tmp/rc") last="mha run --output - | : (70 KB into a closed pipe)"
expect_error 1 "cannot write --output to standard output: Broken pipe; no file was replaced"
checks=$((checks + 1))
[ "$(cat $T/z_pipe.npy)" = OLD ] || fail "$last: replaced --save-z"
# a checkpoint or a PNG is no stream: refused by name (./- is a file)
run convert --from native --to native $T/native.safetensors -
expect_error 2 "OUT '-': standard output takes only a .npy array (the outputs of mha run); expected a file path for OUT"
run permute --order 1,0,3,2 $T/native.safetensors -
expect_error 2 "OUT '-': standard output takes only a .npy array"
run plot --weights $T/native.safetensors --input $T/x.npy --out -
expect_error 2 "--out '-': standard output takes only a .npy array"
run plot --weights $T/native.safetensors --input $T/x.npy --out $T/dash.png --contrib-out -
expect_error 2 "--contrib-out '-': standard output takes only a .npy array"
checks=$((checks + 1))
[ ! -e "$T/-" ] && [ ! -e $T/dash.png ] || fail "a refused '-' wrote a file"

# --- '-': standard input for one array input, refused for a checkpoint ---------
# '-' read a file named '-' (here one holding another array, so Y differed):
# it is standard input, read whole, for run's, audit's and plot's arrays
"$PY" -c "import numpy as np; np.save('$T/-', np.ones((2, 6, 16), np.float32))" && mv "$T/-.npy" "$T/-"
run run --weights $T/native.safetensors --input $T/x.npy --kv-input $T/kv.npy --output $T/y_in_file.npy
mha_abs=$(cd "$(dirname "$MHA")" && pwd)/$(basename "$MHA")
(cd $T && "$mha_abs" run --weights native.safetensors --input - --kv-input kv.npy --output y_in_dash.npy <x.npy) >"$tmp/out" 2>"$tmp/err"
rc=$? last="mha run --input - < x.npy (beside a file named '-')"
expect_ok
checks=$((checks + 1))
cmp -s $T/y_in_file.npy $T/y_in_dash.npy || fail "$last: Y differs from --input x.npy's"
rm -f "$T/-"
cat $T/kv.npy | "$MHA" run --weights $T/native.safetensors --input $T/x.npy --kv-input - --output - >$T/y_in_pipe.npy 2>"$tmp/err"
rc=$? last="cat kv.npy | mha run --kv-input - --output -"
expect_ok
checks=$((checks + 1))
cmp -s $T/y_in_file.npy $T/y_in_pipe.npy || fail "$last: Y differs from --kv-input kv.npy's"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_ref_in.npy
run audit --weights $T/native.safetensors --input $T/x.npy --reference - <$T/y_ref_in.npy
expect_ok
expect_out "the checkpoint reproduces the reference"
run plot --weights $T/native.safetensors --input - --out $T/in_dash.png <$T/x.npy
expect_ok
# refusals name standard input and the flag
run run --weights $T/native.safetensors --input - --kv-input - --output $T/y_in2.npy <$T/x.npy
expect_error 2 "--input '-' and --kv-input '-' both name standard input; expected at most one input there"
run run --weights - --input $T/x.npy --output $T/y_in2.npy <$T/native.safetensors
expect_error 2 "--weights '-': a checkpoint is mapped from its file, not read from standard input; expected a file path"
run convert --to native - $T/in_dash.safetensors <$T/native.safetensors
expect_error 2 "IN '-': a checkpoint is mapped from its file"
run permute --order 1,0,3,2 - $T/in_dash.safetensors <$T/native.safetensors
expect_error 2 "IN '-': a checkpoint is mapped from its file"
run run --weights $T/native.safetensors --input - --output $T/y_in2.npy </dev/null
expect_error 1 "standard input (--input -) is empty; expected a .npy array piped or redirected there"
run run --weights $T/native.safetensors --input $T/x.npy --attn-mask - --output $T/y_in2.npy <$T/x.npy
expect_error 1 "standard input (--attn-mask -): attn_mask has shape (2, 6, 16); expected (T, S)"
(cat $T/x.npy; printf xy) | "$MHA" run --weights $T/native.safetensors --input - --output $T/y_in2.npy >"$tmp/out" 2>"$tmp/err"
rc=$? last="mha run --input - (2 bytes after the array)"
expect_error 1 "standard input (--input -): 2 trailing bytes after the 768 data bytes"
# not a .npy array: refused after its first bytes, not read to the end
# (AddressSanitizer reserves terabytes of shadow memory, which ulimit -v
# forbids: an instrumented build is bounded by time instead, and the
# out-of-memory case below runs in the plain build only)
asan=0
grep -q __asan_init "$MHA" 2>/dev/null && asan=1
if [ "$asan" -eq 1 ]; then
    yes | timeout 60 "$MHA" run --weights $T/native.safetensors --input - --output $T/y_in2.npy >"$tmp/out" 2>"$tmp/err"
else
    yes | (ulimit -v 400000; "$MHA" run --weights $T/native.safetensors --input - --output $T/y_in2.npy) >"$tmp/out" 2>"$tmp/err"
fi
rc=$? last="yes | mha run --input -"
expect_error 1 "standard input (--input -): not a .npy file"
# an endless stream behind a .npy header stops where memory does, by name
if [ "$asan" -eq 0 ]; then
    (head -c 128 $T/x.npy; cat /dev/zero) | (ulimit -v 400000; "$MHA" run --weights $T/native.safetensors --input - --output $T/y_in2.npy) >"$tmp/out" 2>"$tmp/err"
    rc=$? last="mha run --input - (an endless stream, ulimit -v 400000)"
    expect_error 1 "standard input (--input -): out of memory after"
fi
"$MHA" run --weights $T/native.safetensors --input - --output $T/y_in2.npy <&- >"$tmp/out" 2>"$tmp/err"
rc=$? last="mha run --input - (stdin closed)"
expect_error 2 "--input '-': standard input is closed; expected it open"
if command -v script >/dev/null 2>&1; then
    script -qec "$MHA run --weights $T/native.safetensors --input - --output $T/y_in2.npy" /dev/null >"$tmp/tty" 2>&1 </dev/null
    rc=$?
    checks=$((checks + 1))
    [ "$rc" -eq 2 ] && grep -q "standard input is a terminal" "$tmp/tty" || fail "--input - from a terminal: exit $rc: $(cat "$tmp/tty")"
fi
checks=$((checks + 1))
[ ! -e $T/y_in2.npy ] && [ ! -e $T/in_dash.safetensors ] && [ ! -e "$T/-" ] || fail "a refused '-' input wrote a file"

# --- --cu-seqlens: packed sequences, each as if run alone -----------------------
# mha run had no way to pass the library's cu_seqlens: rows 0..1 and 2..5 of
# each batch row are two sequences here, and Y (and Z, the attribution) is
# what each gives alone, causal or not; without the flag they see each other
"$PY" - "$T" <<'EOF2' || fail "packed fixtures"
import sys, numpy as np
T = sys.argv[1]
x = np.load(T + "/x.npy")
np.save(T + "/x_seq0.npy", x[:, :2]), np.save(T + "/x_seq1.npy", x[:, 2:])
dy = np.random.RandomState(7).randn(*x.shape).astype(np.float32)
np.save(T + "/dy_packed.npy", dy), np.save(T + "/dy_seq0.npy", dy[:, :2]), np.save(T + "/dy_seq1.npy", dy[:, 2:])
EOF2
joined() { # OUT A B [AXIS]: A and B joined along T (axis -2; the attribution (h,B,T): -1)
    "$PY" -c "import sys, numpy as np; np.save(sys.argv[1], np.concatenate([np.load(sys.argv[2]), np.load(sys.argv[3])], axis=int(sys.argv[4])))" "$1" "$2" "$3" "${4:--2}"
}
for causal in "" --causal; do
    run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_packed.npy --cu-seqlens 0,2,6 $causal \
        --save-z $T/z_packed.npy --grad-output $T/dy_packed.npy --save-attribution $T/a_packed.npy
    expect_ok
    for s in 0 1; do
        run run --weights $T/native.safetensors --input $T/x_seq$s.npy --output $T/y_seq$s.npy $causal \
            --save-z $T/z_seq$s.npy --grad-output $T/dy_seq$s.npy --save-attribution $T/a_seq$s.npy
        expect_ok
    done
    joined $T/y_alone.npy $T/y_seq0.npy $T/y_seq1.npy
    joined $T/z_alone.npy $T/z_seq0.npy $T/z_seq1.npy
    joined $T/a_alone.npy $T/a_seq0.npy $T/a_seq1.npy -1
    last="mha run --cu-seqlens 0,2,6 $causal"
    close $T/y_packed.npy $T/y_alone.npy 1e-5
    close $T/z_packed.npy $T/z_alone.npy 1e-5
    close $T/a_packed.npy $T/a_alone.npy 1e-5
    run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_unpacked.npy $causal
    checks=$((checks + 1))
    fx close $T/y_unpacked.npy $T/y_alone.npy 1e-3 >/dev/null && fail "$last: Y without --cu-seqlens is Y of the sequences alone"
done
# one sequence is the whole call; an unbatched X (T, d_model) packs the same way
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_one_seq.npy --cu-seqlens 0,6
expect_ok
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_no_seq.npy
close $T/y_one_seq.npy $T/y_no_seq.npy 1e-6
"$PY" -c "import numpy as np; x = np.load('$T/x.npy')[1]; np.save('$T/x1_2d.npy', x); np.save('$T/x1_seq1.npy', x[2:])"
run run --weights $T/native.safetensors --input $T/x1_2d.npy --output $T/y1_packed.npy --cu-seqlens 0,2,6
expect_ok
run run --weights $T/native.safetensors --input $T/x1_seq1.npy --output $T/y1_seq1.npy
"$PY" -c "import numpy as np, sys; sys.exit(0 if np.allclose(np.load('$T/y1_packed.npy')[2:], np.load('$T/y1_seq1.npy'), atol=1e-5, rtol=0) else 1)" ||
    fail "$last: unbatched packed rows 2..5 differ from the sequence alone"
# refusals: the flag's own syntax (exit 2), the library's rule and combinations (its words, exit 1)
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_cu_bad.npy --cu-seqlens 0
expect_error 2 "--cu-seqlens '0': one boundary; expected at least two, 0 and T"
for bad in 0,a,6 0,,6 0,6, "0, 6" +0,6 0,-2,6 0,99999999999; do
    run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_cu_bad.npy --cu-seqlens "$bad"
    expect_error 2 "expected comma-separated whole numbers 0 = cu[0] < ... < cu[n] = T"
done
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_cu_bad.npy --cu-seqlens 0,3,3,6
expect_error 1 "options.cu_seqlens[2]=3 after [1]=3; expected strictly increasing boundaries"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_cu_bad.npy --cu-seqlens 1,6
expect_error 1 "options.cu_seqlens[0]=1, [n_seqs=1]=6; expected 0 and T=6"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_cu_bad.npy --cu-seqlens 0,5
expect_error 1 "expected 0 and T=6"
run run --weights $T/native.safetensors --input $T/x.npy --kv-input $T/kv.npy --output $T/y_cu_bad.npy --cu-seqlens 0,2,6
expect_error 1 "options.cu_seqlens with T=6 queries and S=8 keys; expected packed self-attention sequences (S = T)"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_cu_bad.npy --cu-seqlens 0,2,6 --chunk 2
expect_error 1 "options.cu_seqlens with chunk_size; expected 0"
checks=$((checks + 1))
[ ! -e $T/y_cu_bad.npy ] || fail "a refused --cu-seqlens wrote Y"

# --- numbers and messages ------------------------------------------------------
# a scale written out in 34 digits is 1e33, not truncated to 1e30
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_s1.npy --ablate 1=scale:1000000000000000000000000000000000
expect_ok
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_s2.npy --ablate 1=scale:1e33
expect_ok
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_s3.npy --ablate 1=scale:1e30
expect_ok
checks=$((checks + 1))
cmp -s $T/y_s1.npy $T/y_s2.npy || fail "--ablate scale in full digits differs from 1e33"
cmp -s $T/y_s1.npy $T/y_s3.npy && fail "--ablate scale in full digits was applied as 1e30"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --ablate 1=scale:1e33x
expect_error 2 "scale '1e33x' is not a finite float32 number"
"$PY" -c "import numpy as np; np.save('$T/kpm_1d.npy', np.zeros(6, bool))"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --key-padding-mask $T/kpm_1d.npy
expect_error 1 "key_padding_mask has shape (6,); expected (B, S) = (2, 6)"
# audit: 1 = mismatch found, 2 = could not run
run audit --weights $T/native.safetensors --input $T/missing.npy --reference $T/y_native.npy
expect_error 2 "missing.npy"
run audit --weights $T/native.safetensors --input $T/x.npy --reference $T/y_native.npy --tol x
expect_error 2 "--tol"
run audit --help
expect_out "2 the audit could not run"

# --- bad files: an error naming the problem, never a crash -------------------
run run --weights $T/truncated.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "truncated"
run run --weights $T/hugeheader.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "larger than the file"
run run --weights $T/overlap.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "overlap"
run run --weights $T/dup.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "duplicate"
run run --weights $T/i32.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "I32"
run run --weights $T/badshape.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "w_o"
run run --weights $T/ambiguous.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "candidates: native, hf"
run run --weights $T/hf.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "--heads"
run run --weights $T/inf_weight.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "w_v[1]"
run run --weights $T/hf_int8.safetensors --heads 4 --input $T/x.npy --output $T/y.npy
expect_error 1 "q_proj.weight' is int8; expected a floating dtype"
run run --weights $T/native.safetensors --input $T/x_nan.npy --output $T/y.npy
expect_error 1 "finite"
# an int8 checkpoint loads; one whose code is -128 (outside the symmetric
# range) is refused by run and convert, and their outputs stay as they were
run run --weights $T/native_int8.safetensors --input $T/x.npy --output $T/y_int8.npy
expect_ok
printf KEEP >$T/keep_int8
for cmd in "run --weights $T/int8_code_128.safetensors --input $T/x.npy --output $T/keep_int8" \
    "convert --from native --to native --to-dtype bf16 $T/int8_code_128.safetensors $T/keep_int8"; do
    run $cmd
    expect_error 1 "tensor 'w_k'[0][0] = -128 (scale 0.00787402 in w_k_scale); expected an integer in [-127, 127]"
    [ "$(cat $T/keep_int8)" = KEEP ] || fail "$last: changed its output"
done
# bf16 projections need bf16 weights; with them the run succeeds
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_bf16mm.npy --bf16-matmul
expect_error 1 "bf16 weights"
[ -e $T/y_bf16mm.npy ] && fail "$last: wrote an output"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y_bf16mm.npy --weights-dtype bf16 --bf16-matmul
expect_ok
run run --weights $T/native.safetensors --input $T/x_f64.npy --output $T/y.npy
expect_error 1 "'<f8'"
run run --weights $T/native.safetensors --input $T/x_fortran.npy --output $T/y.npy
expect_error 1 "Fortran"
run run --weights $T/native.safetensors --input $T/x_wide.npy --output $T/y.npy
expect_error 1 "d_model = 16"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --attn-mask $T/mask_badshape.npy
expect_error 1 "attn_mask has shape (6, 7); expected (T, S) = (6, 6)"
run run --weights $T/native.safetensors --input $T/missing.npy --output $T/y.npy
expect_error 1 "missing.npy"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --layout llama
expect_error 2 "--layout"
run convert --from hf --heads 4 --to torch $T/hf.safetensors $T/o.safetensors
expect_error 2 "--to"
run audit --weights $T/native.safetensors --input $T/x.npy --reference $T/x2d.npy
expect_error 2 "reference is float32 of shape (6, 16); expected Y's shape (2, 6, 16)"
run run --weights $T/native.safetensors --input $T/x.npy --output $T/y.npy --grad-output $T/dy_bad.npy --save-attribution $T/a.npy
expect_error 1 "dY is float32 of shape (2, 6, 15); expected float (B, T, d_model) = (2, 6, 16)"
run run --weights $T/nheads_0.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "metadata n_heads = '0'; expected a positive integer"
for key in n_kv_heads d_k d_v; do
  run run --weights $T/${key}_0.safetensors --input $T/x.npy --output $T/y.npy
  expect_error 1 "metadata $key = '0'; expected a positive integer (or no $key at all)"
done
run run --weights $T/nheads_space.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "metadata n_heads = ' 4'; expected a non-negative integer (digits only)"
run run --weights $T/nheads_plus.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "metadata n_heads = '+4'"
run run --weights $T/u8_wq.safetensors --input $T/x.npy --output $T/y.npy
expect_error 1 "tensor 'w_q' is uint8; expected a floating dtype"
# B * h computed in 64 bits: 1048577 * 4096 heads does not wrap to 4096
run run --weights $T/wide_heads.safetensors --input $T/x_wide_batch.npy --output $T/y.npy --attn-mask $T/mask_wrap.npy
expect_error 1 "attn_mask has shape (4096, 1, 1); expected (T, S) = (1, 1) or (B*h, T, S) = (4294971392, 1, 1)"

# --- output paths: through a symbolic link, and names near NAME_MAX ---------
cp $T/y_native.npy $T/link_target.npy
ln -s link_target.npy $T/link.npy
run run --weights $T/mha_native.safetensors --input $T/x.npy --output $T/link.npy
expect_ok
checks=$((checks + 1))
[ -L $T/link.npy ] || fail "$last: the symbolic link output was replaced by a file"
cmp -s $T/link_target.npy $T/y_native.npy && fail "$last: the link's target was not rewritten"
ln -s missing_target.npy $T/dangling.npy
run run --weights $T/native.safetensors --input $T/x.npy --output $T/dangling.npy
expect_error 1 "--output '$T/dangling.npy': it is a symbolic link whose target cannot be resolved"
checks=$((checks + 1))
[ -e $T/missing_target.npy ] && fail "$last: wrote through a dangling link"
long=$(printf '%0250d' 0).st # 253 bytes: a legal name, whose temporaries must be legal too
run convert --to native --heads 4 $T/hf.safetensors "$T/$long"
expect_ok
checks=$((checks + 1))
[ -f "$T/$long" ] || fail "$last: the 253-byte output name was not written"
[ -z "$(find $T -name '.*.part' -o -name '.*.tmp')" ] || fail "$last: temporaries left behind"

# --zero-attn: the zero key/value row a state_dict does not record (the
# library's parity with torch is tests/python/test_parity.py's)
run run --weights $T/hf.safetensors --heads 4 --zero-attn --input $T/x.npy --output $T/y_zero.npy
expect_ok
run run --weights $T/hf.safetensors --heads 4 --input $T/x.npy --output $T/y_nozero.npy
expect_ok
checks=$((checks + 1))
"$PY" -c "
import numpy as np, sys
a=np.load('$T/y_zero.npy'); b=np.load('$T/y_nozero.npy')
sys.exit(0 if a.shape == b.shape and np.isfinite(a).all() and np.abs(a - b).max() > 1e-3 else 1)" ||
    fail "--zero-attn: Y should change (an extra zero key dilutes every row)"
run run --help
expect_out "--zero-attn"
# audit's repair keeps --zero-attn: without it `mha permute` writes a native
# file without the zero row, another layer (Y 0.2 off here)
audit_fix hf_bad_o "fix: mha permute --heads 4 --zero-attn --block o --order 1,0,2,3 --relabel" \
    --weights $T/hf_bad_o.safetensors --heads 4 --zero-attn --input $T/x.npy --reference $T/y_zero.npy
run run --weights $T/hf_bad_o_fixed.safetensors --input $T/x.npy --output $T/y_zero_fixed.npy
expect_ok
close $T/y_zero_fixed.npy $T/y_zero.npy
# ... and the variant flags: without --sinks `mha permute` wrote a native
# file that had lost the sink logits (run with --sinks it was refused, run
# without it computed another layer)
run run --weights $T/hf_sinks.safetensors --heads 4 --sinks sinks --input $T/x.npy --output $T/y_sinks.npy
expect_ok
audit_fix hf_sinks_bad_o "fix: mha permute --heads 4 --sinks sinks --block o --order 1,0,2,3 --relabel" \
    --weights $T/hf_sinks_bad_o.safetensors --heads 4 --sinks sinks --input $T/x.npy --reference $T/y_sinks.npy
run run --weights $T/hf_sinks_bad_o_fixed.safetensors --input $T/x.npy --output $T/y_sinks_fixed.npy
expect_ok
close $T/y_sinks_fixed.npy $T/y_sinks.npy
run permute --heads 4 --sinks no_such --order 1,0,2,3 $T/hf_sinks.safetensors $T/no_sinks.safetensors
expect_error 1 "no tensor no_such"
[ ! -e $T/no_sinks.safetensors ] || fail "a refused permute --sinks wrote its output"

# --- the files a checkpoint is read from are inputs too ----------------------
# A directory's model.safetensors, an index's shards and the config.json
# beside them were not compared with the outputs: `run --weights DIR
# --output DIR/model.safetensors` replaced the checkpoint with Y (exit 0).
C=$T/ckdir
mkdir "$C" && cp $T/native.safetensors "$C/model.safetensors" && cp $T/native.safetensors $T/.keep/ck_model
printf '{"model_type": "llama"}' >"$C/config.json" && cp "$C/config.json" $T/.keep/ck_config
cp $T/gpt2-00002-of-00002.safetensors $T/.keep/ck_shard
ck_kept() { # every file of the three checkpoints as it was
    checks=$((checks + 1))
    cmp -s "$C/model.safetensors" $T/.keep/ck_model && cmp -s "$C/config.json" $T/.keep/ck_config &&
        cmp -s $T/gpt2-00002-of-00002.safetensors $T/.keep/ck_shard || fail "$last: replaced a checkpoint's file"
    [ -z "$(find $T -name '.*.part' -o -name '.*.tmp')" ] || fail "$last: temporaries left behind"
}
run run --weights "$C" --input $T/x.npy --output "$C/model.safetensors"
expect_error 2 "--output '$C/model.safetensors' is the same file as '$C/model.safetensors', read from --weights '$C'"
ck_kept
run convert --to native "$C" "$C/./model.safetensors"
expect_error 2 "read from IN '$C'"
ck_kept
run plot --weights "$C" --input $T/x.npy --out $T/ck.png --contrib-out "$C/config.json"
expect_error 2 "--contrib-out '$C/config.json' is the same file as '$C/config.json', read from --weights '$C'"
ck_kept
run permute --order 1,0,2,3 "$C/model.safetensors" "$C/config.json"
expect_error 2 "read from IN '$C/model.safetensors'"
ck_kept
run run --weights $T/gpt2.safetensors.index.json --heads 4 --prefix h.1 --input $T/x.npy --output $T/y_ck.npy \
    --save-z $T/gpt2-00002-of-00002.safetensors
expect_error 2 "--save-z '$T/gpt2-00002-of-00002.safetensors' is the same file as '$T/gpt2-00002-of-00002.safetensors', read from --weights"
ck_kept
checks=$((checks + 1))
[ -e $T/y_ck.npy ] && fail "$last: wrote --output though --save-z was refused"
# ... while a file beside them that is not one of them stays writable
run run --weights "$C" --input $T/x.npy --output "$C/y.npy"
expect_ok
ck_kept

# --- a pipe as an input: refused, not waited on ------------------------------
# Opening a FIFO to read waits for a writer: `run --input FIFO` (and
# --weights, audit's --reference) hung forever (the library's readers:
# test_io_edges.c).
if mkfifo $T/fifo.npy 2>/dev/null; then
    for args in "run --weights $T/native.safetensors --input $T/fifo.npy --output $T/y_fifo.npy" \
        "run --weights $T/fifo.npy --input $T/x.npy --output $T/y_fifo.npy" \
        "convert --to native $T/fifo.npy $T/c_fifo.safetensors" \
        "audit --weights $T/native.safetensors --input $T/x.npy --reference $T/fifo.npy"; do
        timeout 20 "$MHA" $args >"$tmp/out" 2>"$tmp/err"
        rc=$?
        last="mha $args"
        want=1
        case $args in audit*) want=2 ;; esac
        [ "$rc" -eq 124 ] && echo "timed out: waited on the pipe" >"$tmp/err"
        expect_error $want "it is not a regular file (a pipe or a device); expected a file"
    done
else
    echo "io_cli_test: SKIPPED the pipe cases: mkfifo is not permitted here" >&2
fi

# --- plot's derived --contrib-out keeps a long path whole --------------------
# The name was built in 1024 bytes: an --out of 1100 bytes wrote the
# contributions to a file named by the first 1023 (exit 0).
L=$T/long
for i in 1 2 3 4 5 6 7 8 9; do L=$L/$(printf '%0120d' $i); done
mkdir -p "$L"
run plot --weights $T/native.safetensors --input $T/x.npy --out "$L/attn.png"
expect_ok
checks=$((checks + 1))
[ -f "$L/attn_contrib.png" ] || fail "$last: no $L/attn_contrib.png"
[ "$(find $T/long -type f | wc -l)" -eq 2 ] || fail "$last: wrote elsewhere: $(find $T/long -type f | tail -c 300)"

# --- a file name with a newline or an escape: still one line of error ---------
# Paths were printed raw: a newline in a name split the message in two,
# an escape sequence reached the terminal.
run run --weights $T/native.safetensors --input $T/x.npy --output "$T/no
dir/y.npy"
expect_error 1 "cannot write --output '$T/no?dir/y.npy': directory '$T/no?dir': No such file or directory"
esc=$(printf '%s/e\033[31m.npy' "$T")
run run --weights $T/native.safetensors --input $T/x.npy --output "$esc" --save-z "$esc"
expect_error 2 "--save-z '$T/e?[31m.npy' is the same file as --output '$T/e?[31m.npy'"
run run --weights "$T/w
x.safetensors" --input $T/x.npy --output $T/y.npy
expect_error 1 "cannot open '$T/w?x.safetensors': No such file or directory"

# --- an interrupted command leaves no temporary behind ---------------------
# The temporaries are reserved before the load: SIGTERM or SIGHUP during the
# work (Ctrl-C alike; a background job of sh ignores SIGINT, so it is not
# sent here) left them in the output's directory, and a file size limit
# without `trap '' XFSZ` killed the process mid-write, leaving a partial one.
"$PY" -c "import numpy as np; np.save('$T/x_long.npy', np.random.RandomState(2).randn(1, 4000, 16).astype(np.float32))"
printf OLD >$T/sig_y.npy
cp $T/sig_y.npy $T/.keep/sig_y.npy
for sig in TERM HUP; do
    "$MHA" run --weights $T/native.safetensors --input $T/x_long.npy --output $T/sig_y.npy --save-z $T/sig_z.npy \
        --path reference >"$tmp/out" 2>"$tmp/err" & # about a second of work (small outputs)
    pid=$!
    i=0 # wait until the temporaries exist (at most 10 s), then interrupt the work
    while [ -z "$(find $T -maxdepth 1 -name '.sig_z.npy.*')" ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i + 1)); done
    kill -$sig $pid
    { wait $pid; } 2>/dev/null # without the shell's "Terminated"
    rc=$?
    last="mha run ... (SIG$sig during the work)"
    checks=$((checks + 1))
    [ "$rc" -gt 128 ] || fail "$last: exit $rc, want death by the signal (the run finished before it?)"
    [ -z "$(find $T -maxdepth 1 -name '.sig_*')" ] || fail "$last: left $(find $T -maxdepth 1 -name '.sig_*')"
    [ -e $T/sig_z.npy ] && fail "$last: wrote --save-z"
    unchanged sig_y.npy
done
# The only output goes straight to its target through the library's own
# temporary (no second rename): a signal while that temporary exists is
# held, the write completes, and the message says the output was written
# whole (it said "no output was replaced" of a replaced file). Y is 64 MB
# here so that the write lasts long enough to be caught; up to 4 tries.
"$PY" -c "import numpy as np; np.save('$T/x_big.npy', np.random.RandomState(3).randn(65536, 16, 16).astype(np.float32))"
try=0 rc=0
while [ $try -lt 4 ] && [ "$rc" -le 128 ]; do
    try=$((try + 1))
    printf OLD >$T/sig_big.npy
    "$MHA" run --weights $T/native.safetensors --input $T/x_big.npy --output $T/sig_big.npy >"$tmp/out" 2>"$tmp/err" &
    pid=$!
    i=0 # the library's temporary: .sig_big.npy.<pid>-<n>.tmp
    while [ -z "$(find $T -maxdepth 1 -name '.sig_big.npy.*.tmp')" ] && [ $i -lt 3000 ] && kill -0 $pid 2>/dev/null; do
        i=$((i + 1))
    done
    kill -TERM $pid 2>/dev/null
    { wait $pid; } 2>/dev/null
    rc=$?
done
last="mha run ... (SIGTERM while its only output is written, $try tries)"
checks=$((checks + 1))
if [ "$rc" -gt 128 ]; then
    grep -qF "interrupted (signal 15) while writing; --output '$T/sig_big.npy' was already written whole" "$tmp/err" ||
        fail "$last: stderr: $(head -c 300 "$tmp/err")"
    "$PY" -c "import numpy as np; y = np.load('$T/sig_big.npy'); assert y.shape == (65536, 16, 16)" 2>/dev/null ||
        fail "$last: the output is not the whole Y"
    [ -z "$(find $T -maxdepth 1 -name '.sig_*')" ] || fail "$last: left $(find $T -maxdepth 1 -name '.sig_*')"
else
    fail "$last: never caught the write (exit $rc)"
fi
rm -f $T/x_big.npy $T/sig_big.npy
(ulimit -f 1; exec "$MHA" run --weights $T/native.safetensors --input $T/x.npy --output $T/sig_y.npy) \
    >"$tmp/out" 2>"$tmp/err"
rc=$?
last="mha run under ulimit -f 1 (SIGXFSZ not trapped)"
expect_error 1 "cannot write '$T/sig_y.npy' (flush failed): File too large; the file is unchanged"
unchanged sig_y.npy
checks=$((checks + 1))
[ -z "$(find $T -maxdepth 1 -name '.sig_*')" ] || fail "$last: left $(find $T -maxdepth 1 -name '.sig_*')"

# --- a replaced output keeps its permissions ---------------------------------
# The temporary was created 0666 & ~umask: a private 0600 output came back
# 0644, readable by everyone, after the command replaced it.
printf OLD >$T/mode_y.npy && chmod 600 $T/mode_y.npy
run run --weights $T/native.safetensors --input $T/x.npy --output $T/mode_y.npy
expect_ok
printf OLD >$T/mode_c.safetensors && chmod 640 $T/mode_c.safetensors
run convert --to native $T/native.safetensors $T/mode_c.safetensors
expect_ok
checks=$((checks + 1))
[ "$(stat -c %a $T/mode_y.npy) $(stat -c %a $T/mode_c.safetensors)" = "600 640" ] ||
    fail "replaced outputs changed their permissions: $(stat -c '%a %n' $T/mode_y.npy $T/mode_c.safetensors)"
# ... and, run by root, its owner (a user's file came back owned by root)
if [ "$(id -u)" -eq 0 ] && chown 65534:65534 $T/mode_y.npy 2>/dev/null; then
    run run --weights $T/native.safetensors --input $T/x.npy --output $T/mode_y.npy --causal
    expect_ok
    checks=$((checks + 1))
    [ "$(stat -c %u:%g $T/mode_y.npy)" = 65534:65534 ] ||
        fail "$last: the replaced output's owner became $(stat -c %u:%g $T/mode_y.npy)"
else
    echo "io_cli_test: SKIPPED the owner case: it needs root (chown)" >&2
fi

echo "io_cli_test: $checks checks, $fails failures"
[ "$fails" -eq 0 ]
