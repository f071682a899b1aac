#!/bin/sh
# mpi_test.sh — mha-mpi end to end on loopback: `mpirun -np P mha-mpi run`
# with --split heads and --split sequence for P = 1..4 reproduces the
# single-process `mha run` (MHA, GQA, a replicated kv head, cross-attention,
# causal, key padding, bool masks, ablations, captures); --stats reports the
# bytes the formula predicts; faults (bad file on one rank, a failing
# allocation on one rank, shapes that differ between ranks, an impossible
# head split) end every rank with the same error and a non-zero exit.
# Skips loudly without mpirun, and fails then when CI=true.
#   usage: sh tests/mpi_test.sh BUILD_DIR
BUILD=${1:?usage: sh tests/mpi_test.sh BUILD_DIR}
PY=${PYTHON:-/usr/bin/python3}
here=$(cd "$(dirname "$0")" && pwd)
[ -x "$BUILD/mha" ] || { echo "mpi_test: $BUILD/mha is missing" >&2; exit 1; }
if ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$BUILD/mha-mpi" ]; then
    echo "mpi_test: SKIPPED: mpirun or $BUILD/mha-mpi is missing (run 'make mpi')" >&2
    [ "${CI:-}" = true ] && { echo "mpi_test: FAIL: CI=true needs the MPI tests" >&2; exit 1; }
    exit 0
fi
"$PY" -c "import numpy" 2>/dev/null || { echo "mpi_test: SKIPPED: numpy is missing" >&2; [ "${CI:-}" = true ] && exit 1; exit 0; }
MHA=$BUILD/mha
MPI=$BUILD/mha-mpi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# loopback only, no warnings about missing fabrics
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
T=$tmp
checks=0
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# --- fixtures: native checkpoints and inputs (numpy, tests/python/io_helpers.py)
PYTHONPATH="$here/python" "$PY" - "$T" <<'PYEOF' || { echo "mpi_test: fixtures failed" >&2; exit 1; }
import sys
import numpy as np
from io_helpers import write_safetensors
d = sys.argv[1]
rng = np.random.RandomState(77)
r = lambda *s: rng.uniform(-0.5, 0.5, size=s).astype(np.float32)
def layer(name, dm, h, hkv, dk, dv, din=None, meta=None, extra=None):
    din = din or dm
    w = {"w_q": r(dm, h * dk), "w_k": r(din, hkv * dk), "w_v": r(din, hkv * dv), "w_o": r(h * dv, dm),
         "b_q": r(h * dk), "b_k": r(hkv * dk), "b_v": r(hkv * dv), "b_o": r(dm), **(extra or {})}
    lab = lambda n: ",".join(str(i) for i in range(n))
    write_safetensors("%s/%s.safetensors" % (d, name), w,
                      {"n_heads": h, "n_kv_heads": hkv, "d_k": dk, "d_v": dv, "labels_q": lab(h),
                       "labels_k": lab(hkv), "labels_v": lab(hkv), "labels_o": lab(h), **(meta or {})})
layer("mha", 24, 12, 12, 3, 2)          # P = 1, 2, 3, 4 split h = h_kv = 12
layer("gqa", 16, 8, 4, 2, 3)            # P = 1, 2, 4: whole kv groups; P = 3: refused
layer("mqa2", 16, 8, 2, 2, 2)           # P = 4: each rank a copy of its kv head
layer("cross", 24, 12, 12, 3, 3, din=10)
layer("alibi", 16, 8, 4, 2, 2, meta={"alibi": 1})   # the paper's slopes: no alibi_slopes tensor
layer("whole", 16, 4, 4, 4, 4, meta={"qk_norm": "rms", "qk_norm_per_head": 1, "qk_norm_whole": 1},
      extra={"q_norm": 1 + r(4, 4), "k_norm": 1 + r(4, 4)})   # OLMo 2: one norm over all heads
# hf layout (nn.Linear (out, in)) of a GQA layer, and a native one whose
# head 5 has NaN in its W_Q columns: only the rank owning head 5 may fail
w = {"q_proj.weight": r(16, 16), "k_proj.weight": r(8, 16), "v_proj.weight": r(12, 16), "o_proj.weight": r(16, 24),
     "q_proj.bias": r(16), "o_proj.bias": r(16)}
write_safetensors(d + "/hf.safetensors", w, {"n_heads": 8, "n_kv_heads": 4})
w = {"w_q": r(16, 16), "w_k": r(16, 8), "w_v": r(16, 12), "w_o": r(24, 16)}
w["w_q"][3, 5 * 2 + 1] = np.nan
write_safetensors(d + "/nan5.safetensors", w, {"n_heads": 8, "n_kv_heads": 4})
# an hf directory whose config.json gives the head counts, RoPE and the soft-cap
import json, os
os.mkdir(d + "/hfdir")
write_safetensors(d + "/hfdir/model.safetensors",
                  {"model.layers.0.self_attn.q_proj.weight": r(16, 16), "model.layers.0.self_attn.k_proj.weight": r(8, 16),
                   "model.layers.0.self_attn.v_proj.weight": r(8, 16), "model.layers.0.self_attn.o_proj.weight": r(16, 16)})
json.dump({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16, "rope_theta": 50.0,
           "attn_logit_softcapping": 1.5}, open(d + "/hfdir/config.json", "w"))
# a BLOOM directory: config.json turns ALiBi on (the paper's slopes of all 8 heads)
os.mkdir(d + "/bloomdir")
write_safetensors(d + "/bloomdir/model.safetensors",
                  {"model.layers.0.self_attn.%s_proj.weight" % n: r(16, 16) for n in "qkvo"})
json.dump({"model_type": "bloom", "n_head": 8, "hidden_size": 16}, open(d + "/bloomdir/config.json", "w"))
# the same weights beside config.json files that differ (one per rank, MPMD):
# the ranks must compare what config.json gives the layer, not only the file
import shutil
shutil.copytree(d + "/hfdir", d + "/hfdir_theta")
json.dump({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16, "rope_theta": 60.0,
           "attn_logit_softcapping": 1.5}, open(d + "/hfdir_theta/config.json", "w"))
shutil.copytree(d + "/hfdir", d + "/capdir")
json.dump({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16, "attn_logit_softcapping": 1.5},
          open(d + "/capdir/config.json", "w"))
shutil.copytree(d + "/hfdir", d + "/capdir_b")
json.dump({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16, "attn_logit_softcapping": 0.5},
          open(d + "/capdir_b/config.json", "w"))
# ChatGLM 2/3: query_key_value holds [q; k; v] blocks, which its config.json names (the hf layout)
os.mkdir(d + "/glmdir")
g = "transformer.encoder.layers.0.self_attention."
write_safetensors(d + "/glmdir/model.safetensors", {g + "query_key_value.weight": r(32, 16),
                                                    g + "query_key_value.bias": r(32), g + "dense.weight": r(16, 16)})
json.dump({"model_type": "chatglm", "hidden_size": 16, "num_attention_heads": 4, "kv_channels": 4,
           "multi_query_attention": True, "multi_query_group_num": 2, "rope_ratio": 2},
          open(d + "/glmdir/config.json", "w"))
# CodeGen: qkv_proj's 4 row blocks [q; v; k] (the codegen layout, which config.json names), 8 heads of 2
os.mkdir(d + "/cgdir")
g = "transformer.h.0.attn."
write_safetensors(d + "/cgdir/model.safetensors", {g + "qkv_proj.weight": r(48, 16), g + "out_proj.weight": r(16, 16)})
json.dump({"model_type": "codegen", "n_embd": 16, "n_head": 8, "rotary_dim": 2}, open(d + "/cgdir/config.json", "w"))
# a sharded checkpoint (index + two files), and one whose second file
# holds other weights under the same index
wq, wk = r(16, 16), r(8, 16)
for name, scale in (("shdir", 1.0), ("shdir_b", 1.5)):
    os.mkdir(d + "/" + name)
    write_safetensors(d + "/%s/model-00001-of-00002.safetensors" % name,
                      {"model.layers.0.self_attn.q_proj.weight": wq, "model.layers.0.self_attn.k_proj.weight": wk})
    rs = np.random.RandomState(5)
    write_safetensors(d + "/%s/model-00002-of-00002.safetensors" % name,
                      {"model.layers.0.self_attn.%s_proj.weight" % n: scale * rs.uniform(-0.5, 0.5, (8 if n == "v" else 16, 16)).astype(np.float32)
                       for n in "vo"})
    json.dump({"weight_map": {"model.layers.0.self_attn.%s_proj.weight" % n: "model-0000%d-of-00002.safetensors" % (1 if n in "qk" else 2)
                              for n in "qkvo"}}, open(d + "/%s/model.safetensors.index.json" % name, "w"))
    json.dump({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16, "rope_theta": 50.0},
              open(d + "/%s/config.json" % name, "w"))
# a gpt-oss directory: every layer has (h) sink logits in self_attn.sinks
os.mkdir(d + "/ossdir")
write_safetensors(d + "/ossdir/model.safetensors",
                  {"model.layers.0.self_attn.q_proj.weight": r(16, 16), "model.layers.0.self_attn.k_proj.weight": r(8, 16),
                   "model.layers.0.self_attn.v_proj.weight": r(8, 16), "model.layers.0.self_attn.o_proj.weight": r(16, 16),
                   "model.layers.0.self_attn.sinks": 4 * r(4)})
json.dump({"model_type": "gpt_oss", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16,
           "head_dim": 4, "rope_theta": 150000.0}, open(d + "/ossdir/config.json", "w"))
# an OLMo 2 directory: q_norm.weight (h*d_k) and k_norm.weight (h_kv*d_k), one
# RMSNorm over the whole width (the hf names say so by their length)
os.mkdir(d + "/olmo2dir")
write_safetensors(d + "/olmo2dir/model.safetensors",
                  {**{"model.layers.0.self_attn.%s_proj.weight" % n: r(16, 16) for n in "qkvo"},
                   "model.layers.0.self_attn.q_norm.weight": 1 + r(16), "model.layers.0.self_attn.k_norm.weight": 1 + r(16)})
json.dump({"model_type": "olmo2", "num_attention_heads": 4, "num_key_value_heads": 4, "hidden_size": 16,
           "rope_theta": 500.0, "rms_norm_eps": 1e-6}, open(d + "/olmo2dir/config.json", "w"))
# StableLM 2 and Cohere directories: a LayerNorm of each head, StableLM's
# as one tensor per head (q_layernorm.norms.N.weight), Cohere's (h, d_k)
for name, cfg in (("slmdir", {"model_type": "stablelm", "qk_layernorm": True, "partial_rotary_factor": 0.5,
                              "layer_norm_eps": 0.1}),
                  ("coheredir", {"model_type": "cohere", "use_qk_norm": True, "layer_norm_eps": 0.1})):
    os.mkdir(d + "/" + name)
    t = {"model.layers.0.self_attn.%s_proj.weight" % n: r(8 if n in "kv" else 16, 16) for n in "qkvo"}
    p = "model.layers.0.self_attn."
    if name == "slmdir":
        t.update({p + "q_layernorm.norms.%d.weight" % i: 1 + r(4) for i in range(4)})
        t.update({p + "k_layernorm.norms.%d.weight" % i: 1 + r(4) for i in range(2)})
    else:
        t[p + "q_norm.weight"], t[p + "k_norm.weight"] = 1 + r(4, 4), 1 + r(2, 4)
    write_safetensors(d + "/%s/model.safetensors" % name, t)
    json.dump(dict(cfg, num_attention_heads=4, num_key_value_heads=2, hidden_size=16, rope_theta=50.0),
              open(d + "/%s/config.json" % name, "w"))
# an InternLM2 directory: wqkv holds megatron's rows per kv group, wo
os.mkdir(d + "/interndir")
write_safetensors(d + "/interndir/model.safetensors", {"model.layers.0.attention.wqkv.weight": r(32, 16),
                  "model.layers.0.attention.wqkv.bias": r(32), "model.layers.0.attention.wo.weight": r(16, 16)})
json.dump({"model_type": "internlm2", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16,
           "rope_theta": 50.0}, open(d + "/interndir/config.json", "w"))
# an MPT directory: Wqkv rows [q; k; v], out_proj, ALiBi from attn_config
os.mkdir(d + "/mptdir")
write_safetensors(d + "/mptdir/model.safetensors", {"transformer.blocks.0.attn.Wqkv.weight": r(48, 16),
                  "transformer.blocks.0.attn.out_proj.weight": r(16, 16)})
json.dump({"model_type": "mpt", "n_heads": 4, "d_model": 16, "attn_config": {"alibi": True, "alibi_bias_max": 8}},
          open(d + "/mptdir/config.json", "w"))
layer("mha_b", 24, 12, 12, 3, 2)          # mha's shapes, other weights
# gated attention (output_gate: Z^(r) *= sigmoid(x W_G + b_G)^(r) before W_O):
# native files with w_g (and b_g beside biases), an hf directory whose
# q_proj holds each head's query then gate rows (config.json's attn_output_gate)
def gated(name, dm, h, hkv, dk, dv, bias, din=None):
    din = din or dm
    w = {"w_q": r(dm, h * dk), "w_k": r(din, hkv * dk), "w_v": r(din, hkv * dv), "w_o": r(h * dv, dm),
         "w_g": r(dm, h * dv)}
    if bias:
        w.update({"b_q": r(h * dk), "b_k": r(hkv * dk), "b_v": r(hkv * dv), "b_o": r(dm), "b_g": r(h * dv)})
    write_safetensors("%s/%s.safetensors" % (d, name), w,
                      {"n_heads": h, "n_kv_heads": hkv, "d_k": dk, "d_v": dv, "output_gate": 1})
    return w
w = gated("gmha", 24, 6, 6, 3, 2, True)  # P = 1, 2, 3
write_safetensors(d + "/gmha_plain.safetensors", {k: v for k, v in w.items() if k not in ("w_g", "b_g")},
                  {"n_heads": 6, "n_kv_heads": 6, "d_k": 3, "d_v": 2})
gated("ggqa", 16, 8, 4, 2, 3, False)    # P = 1, 2, 4; P = 3 refused
gated("gcross", 24, 6, 6, 3, 3, True, din=10)
w = gated("gseq", 24, 6, 6, 3, 2, True)
w["w_g"] = w["w_g"] + 0.25               # gseq_b: gseq's weights but W_G
write_safetensors(d + "/gseq_b.safetensors", w, {"n_heads": 6, "n_kv_heads": 6, "d_k": 3, "d_v": 2, "output_gate": 1})
os.mkdir(d + "/gatedir")
gq = r(4 * 2 * 4, 16)                    # rows per head: 4 query rows, then 4 gate rows
write_safetensors(d + "/gatedir/model.safetensors",
                  {"model.layers.0.self_attn.q_proj.weight": gq, "model.layers.0.self_attn.k_proj.weight": r(8, 16),
                   "model.layers.0.self_attn.v_proj.weight": r(8, 16), "model.layers.0.self_attn.o_proj.weight": r(16, 16)})
json.dump({"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 16, "head_dim": 4,
           "attn_output_gate": True}, open(d + "/gatedir/config.json", "w"))
np.save(d + "/x.npy", r(2, 16, 24))
np.save(d + "/x16.npy", r(2, 16, 16))
np.save(d + "/pos16.npy", (np.arange(16) * 7 + 3).astype(np.int64))   # --positions, shared by both sequences
np.save(d + "/pos2x16.npy", np.stack([np.arange(16) * 7 + 3, np.arange(16) * 2 + 40]).astype(np.int64))  # (B,T)
np.save(d + "/x1.npy", r(16, 24))         # unbatched
np.save(d + "/kv.npy", r(2, 12, 10))
np.save(d + "/x_short.npy", r(2, 5, 24))
kpm = np.zeros((2, 16), bool); kpm[0, 3] = kpm[0, 10:] = True; kpm[1, :2] = True
np.save(d + "/kpm.npy", kpm)
kpm[1, 5] = True
np.save(d + "/kpm_b.npy", kpm)          # kpm with one more padded key
np.save(d + "/x_huge.npy", np.full((1, 8, 24), 1e30, np.float32))
np.save(d + "/kpm_cross.npy", np.arange(24).reshape(2, 12) % 5 == 1)
np.save(d + "/am.npy", np.triu(np.ones((16, 16), bool), 1) | (np.arange(16)[None, :] == 7))
# torch's add_bias_kv (bias_k, bias_v: one more key row), and the same file but bias_v
w = {"in_proj_weight": r(72, 24), "in_proj_bias": r(72), "out_proj.weight": r(24, 24), "out_proj.bias": r(24),
     "bias_k": r(1, 1, 24), "bias_v": r(1, 1, 24)}
write_safetensors(d + "/bkv.safetensors", w)
w["bias_v"] = w["bias_v"] + 1
write_safetensors(d + "/bkv_b.safetensors", w)
PYEOF

# mpirun -np P mha-mpi run ARGS, bounded in time; stdout/stderr in $T/out,err
mpi() {
    np=$1; shift
    timeout 120 mpirun --oversubscribe -np "$np" "$MPI" run "$@" >"$T/out" 2>"$T/err"
    rc=$?
    last="mpirun -np $np mha-mpi run $*"
}
# close A B: max|A-B| <= 1e-5 * (1 + max|B|) (NaN equal to NaN)
close() {
    checks=$((checks + 1))
    "$PY" - "$1" "$2" >"$T/close" <<'PYEOF' || fail "$last: $1 vs $2: $(cat "$T/close")"
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
if a.shape != b.shape:
    print("shape %s vs %s" % (a.shape, b.shape)); sys.exit(1)
tol = 1e-5 * (1 + np.nanmax(np.abs(b)))
if not (np.array_equal(np.isnan(a), np.isnan(b)) and np.nanmax(np.abs(a - b)) <= tol):
    print("max diff %g > %g" % (np.nanmax(np.abs(a - b)), tol)); sys.exit(1)
PYEOF
}
expect_ok() {
    checks=$((checks + 1))
    [ "$rc" -eq 0 ] || fail "$last: exit $rc; stderr: $(head -c 600 "$T/err")"
}
# expect_fail NP PATTERN: non-zero exit (not a timeout or a signal), and
# each of the NP ranks printed the same agreed error mentioning PATTERN
expect_fail() {
    checks=$((checks + 1))
    [ "$rc" -ne 0 ] || fail "$last: exit 0, want a failure"
    [ "$rc" -eq 124 ] && fail "$last: hung (killed by timeout)"
    n=$(grep -c "^mha-mpi run: \[rank [0-9]*\] " "$T/err")
    [ "$n" -eq "$1" ] || fail "$last: $n of $1 ranks reported the error: $(head -c 600 "$T/err")"
    grep -q -- "$2" "$T/err" || fail "$last: the error does not mention '$2': $(head -c 600 "$T/err")"
    [ "$(grep '^mha-mpi run: \[rank' "$T/err" | sed 's/^mha-mpi run: \[rank [0-9]*\] //' | sort -u | wc -l)" -eq 1 ] ||
        fail "$last: the ranks disagree: $(head -c 600 "$T/err")"
}
# single-process reference: mha run ARGS (outputs named by the caller)
ref() { "$MHA" run "$@" >"$T/ref_out" 2>&1 || fail "mha run $*: $(cat "$T/ref_out")"; }

# --- its own help ---------------------------------------------------------
mpi 2 --help
expect_ok
checks=$((checks + 1))
head -1 "$T/out" | grep -q "^usage: mha-mpi run .*--split heads|sequence" || fail "$last: usage line: $(head -1 "$T/out")"

# --- both splits against mha run ----------------------------------------
# case NAME P-LIST SPLITS WEIGHTS INPUT [more mha run flags]
case_() {
    name=$1 plist=$2 splits=$3 w=$4 x=$5; shift 5
    ref --weights "$T/$w.safetensors" --input "$T/$x.npy" --output "$T/r_$name.npy" "$@"
    for split in $splits; do
        for p in $plist; do
            mpi "$p" --split "$split" --weights "$T/$w.safetensors" --input "$T/$x.npy" --output "$T/y.npy" "$@"
            expect_ok
            close "$T/y.npy" "$T/r_$name.npy"
        done
    done
}
# decode NAME P-LIST WEIGHTS INPUT N [more flags for both]
decode() {
    name=$1 plist=$2 w=$3 x=$4 n=$5; shift 5
    ref --weights "$T/$w.safetensors" --input "$T/$x.npy" --output "$T/r_$name.npy" --causal "$@"
    for p in $plist; do
        mpi "$p" --decode "$n" --weights "$T/$w.safetensors" --input "$T/$x.npy" --output "$T/y.npy" --causal "$@"
        expect_ok
        close "$T/y.npy" "$T/r_$name.npy"
    done
}

# the C API given NULL pointers, P = 0, too many entries, options the
# ring does not do, a NaN in x: statuses and messages, no crash
api_test() {
    if [ -x "$BUILD/mpi_api_test" ]; then
        for p in 1 2 4; do
            checks=$((checks + 1))
            timeout 120 mpirun --oversubscribe -np $p "$BUILD/mpi_api_test" >"$T/out" 2>"$T/err" ||
                fail "mpirun -np $p mpi_api_test: exit $?: $(head -c 600 "$T/err")"
        done
    else
        fail "$BUILD/mpi_api_test is missing (make mpi-build)"
    fi
}

# MHA_MPI_TEST_QUICK=1 (make test-asan): one small P=2 run of each path
if [ -n "${MHA_MPI_TEST_QUICK:-}" ]; then
    case_ quick "2" "heads sequence" gqa x16 --causal --key-padding-mask "$T/kpm.npy"
    decode quick_dec "2" gqa x16 5
    case_ quick_gate "2" "heads sequence" gmha x --causal
    decode quick_gate_dec "2" gmha x 5
    mpi 2 --split heads --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/y.npy" --causal \
        --save-z "$T/z.npy" --save-probs "$T/p.npy"
    expect_ok
    mpi 2 --split sequence --weights "$T/missing.safetensors" --input "$T/x.npy" --output "$T/y.npy"
    expect_fail 2 "missing.safetensors"
    api_test
    echo "mpi_test (quick): $checks checks, $fails failed"
    [ "$fails" -eq 0 ]
    exit
fi
case_ mha "1 2 3 4" "heads sequence" mha x
case_ causal "1 2 3 4" "heads sequence" mha x --causal
case_ padded "2 3 4" "heads sequence" mha x --causal --key-padding-mask "$T/kpm.npy"
case_ boolmask "2 4" "heads sequence" mha x --attn-mask "$T/am.npy"
case_ unbatched "2 3" "heads sequence" mha x1 --causal
case_ gqa "1 2 4" "heads sequence" gqa x16 --causal
case_ gqa_rep "4" "heads" mqa2 x16 --causal
case_ hf "1 2 4 8" "heads sequence" hf x16 --causal   # each rank slices the hf tensors itself
case_ gqa_seq3 "3" "sequence" gqa x16 --causal
case_ cross "2 3 4" "heads sequence" cross x --kv-input "$T/kv.npy" --causal bottom-right
case_ cross_pad "2 4" "heads sequence" cross x --kv-input "$T/kv.npy" --key-padding-mask "$T/kpm_cross.npy"
case_ ablate "2 3 4" "heads sequence" mha x --causal --ablate 1=zero,5=scale:0.5,7=mean
case_ nanrows "2 4" "heads sequence" mha x --attn-mask "$T/am.npy" --key-padding-mask "$T/kpm.npy" --masked-rows nan
case_ bias_kv "2 4" "heads sequence" bkv x --causal --heads 12    # torch's add_bias_kv: one more key row
decode dec_bias_kv "2" bkv x 4 --heads 12

# --- gated attention (output_gate): each shard gates its heads with its
# column blocks of W_G (and b_G); the ring gates its own query rows before
# W_O. Both refused the layer before. MHA with biases over P = 1, 2, 3, GQA
# without over P = 1, 2, 4, cross-attention, ablations (after the gate),
# the captured Z (gated), decode; heads permuted in the file
case_ gate_mha "1 2 3" "heads sequence" gmha x --causal
case_ gate_gqa "1 2 4" "heads sequence" ggqa x16 --causal
case_ gate_cross "2 3" "heads sequence" gcross x --kv-input "$T/kv.npy"
case_ gate_ablate "2 3" "heads sequence" gmha x --causal --ablate 1=zero,4=mean
ref --weights "$T/gmha.safetensors" --input "$T/x.npy" --output "$T/r.npy" --causal --save-z "$T/rz.npy" \
    --save-contributions "$T/rc.npy"
for split in heads sequence; do
    mpi 2 --split $split --weights "$T/gmha.safetensors" --input "$T/x.npy" --output "$T/y.npy" --causal \
        --save-z "$T/z.npy" --save-contributions "$T/c.npy"
    expect_ok
    close "$T/y.npy" "$T/r.npy"; close "$T/z.npy" "$T/rz.npy"; close "$T/c.npy" "$T/rc.npy"
done
decode dec_gate_mha "1 2 3" gmha x 5
decode dec_gate_gqa "2 4" ggqa x16 3
"$MHA" permute --order 2,3,0,1,6,7,4,5 "$T/ggqa.safetensors" "$T/ggqa_perm.safetensors" >"$T/out" 2>&1 ||
    fail "mha permute of a gated layer: $(cat "$T/out")"
case_ gate_perm "2 4" "heads sequence" ggqa_perm x16 --causal
last="a gated layer with its heads permuted" close "$T/r_gate_perm.npy" "$T/r_gate_gqa.npy"
decode dec_gate_perm "2" ggqa_perm x16 4
# hf: q_proj rows per head [query; gate], read as config.json's attn_output_gate says
ref --weights "$T/gatedir" --input "$T/x16.npy" --output "$T/r_gatedir.npy" --causal
for p in 1 2 4; do
    mpi $p --split heads --weights "$T/gatedir" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    close "$T/y.npy" "$T/r_gatedir.npy"
done
mpi 2 --split sequence --weights "$T/gatedir" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_gatedir.npy"
mpi 2 --decode 5 --weights "$T/gatedir" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_gatedir.npy"
# the gate changes Y here: gmha_plain is gmha without W_G and b_G
ref --weights "$T/gmha_plain.safetensors" --input "$T/x.npy" --output "$T/r_gmha_plain.npy" --causal
checks=$((checks + 1))
"$PY" -c "import sys, numpy as np; sys.exit(int(np.abs(np.load(sys.argv[1]) - np.load(sys.argv[2])).max() < 1e-2))" \
    "$T/r_gmha_plain.npy" "$T/r_gate_mha.npy" || fail "the gate left mha run's Y of gmha unchanged"

# config.json beside an hf checkpoint: head counts, RoPE and soft-cap as mha run reads them
ref --weights "$T/hfdir" --input "$T/x16.npy" --output "$T/r_hfdir.npy" --causal
for p in 1 2; do
    mpi $p --weights "$T/hfdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    close "$T/y.npy" "$T/r_hfdir.npy"
done
mpi 2 --decode 4 --weights "$T/hfdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_hfdir.npy"
# ChatGLM: every rank's shard reads the blocks config.json names (before: megatron's rows per group)
ref --weights "$T/glmdir" --input "$T/x16.npy" --output "$T/r_glm.npy" --causal
mpi 2 --split heads --weights "$T/glmdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_glm.npy"
# CodeGen: each shard's heads from their blocks of qkv_proj, inside one block (8 ranks: 1 head), a
# whole block (4) and across blocks (2); before, the shard loader refused the layout
ref --weights "$T/cgdir" --input "$T/x16.npy" --output "$T/r_cg.npy" --causal
for p in 2 4 8; do
    mpi $p --split heads --weights "$T/cgdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    close "$T/y.npy" "$T/r_cg.npy"
done
# ALiBi from config.json (BLOOM): each shard takes its global heads' slopes
# (a shard given the default slopes of an h/P-head layer was 0.1 off)
ref --weights "$T/bloomdir" --input "$T/x16.npy" --output "$T/r_bloom.npy" --causal
for p in 2 4; do
    mpi $p --split heads --weights "$T/bloomdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    close "$T/y.npy" "$T/r_bloom.npy"
    mpi $p --decode 3 --weights "$T/bloomdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    close "$T/y.npy" "$T/r_bloom.npy"
done
# a sharded checkpoint: each rank reads its heads through the index
ref --weights "$T/shdir" --input "$T/x16.npy" --output "$T/r_sh.npy" --causal
for p in 1 2; do
    mpi $p --split heads --weights "$T/shdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    close "$T/y.npy" "$T/r_sh.npy"
done
# gpt-oss's sinks from config.json (model_type gpt_oss): mha run takes them
# as --sinks sinks would, and each shard its heads' entries (both ran
# without them, silently; mha-mpi has no --sinks)
ref --weights "$T/ossdir" --input "$T/x16.npy" --output "$T/r_oss.npy" --causal --sinks sinks
ref --weights "$T/ossdir" --input "$T/x16.npy" --output "$T/r_oss_cfg.npy" --causal
last="mha run on a gpt-oss directory without --sinks"
close "$T/r_oss_cfg.npy" "$T/r_oss.npy"
for p in 1 2 4; do
    mpi $p --split heads --weights "$T/ossdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    close "$T/y.npy" "$T/r_oss.npy"
done
mpi 2 --decode 3 --weights "$T/ossdir" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_oss.npy"

# --- KV-cache decode, head-parallel: prefill T-N tokens, decode N one at a
# time; each rank caches its kv heads. Equals the causal forward of mha run.
decode dec_mha "1 2 4" mha x 5
decode dec_all "2" mha x 16                  # no prefill: every token decoded
decode dec_gqa "1 2 4" gqa x16 7
decode dec_rep "4" mqa2 x16 3                # each rank a copy of its kv head
decode dec_unbatched "2" mha x1 4
decode dec_ablate "2 4" gqa x16 6 --ablate 1=zero,6=scale:0.5
# the cache of a rank holds its kv heads only: B*(h_kv/P)*128 slots*(d_k+d_v)*4
for p in 2 4; do
    mpi $p --decode 4 --stats --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/y.npy" --causal
    expect_ok
    checks=$((checks + 1))
    want=$((2 * 16 * 16 * 4)) cache=$((2 * (4 / p) * 128 * (2 + 3) * 4))
    [ "$(grep -c "sent_bytes=$want formula_bytes=$want .* cache_bytes=$cache\$" "$T/out")" -eq $p ] ||
        fail "$last: want sent_bytes=$want cache_bytes=$cache on $p ranks: $(cat "$T/out")"
done

# --- ALiBi with the paper's slopes (they depend on h): each shard gets its
# global heads' slopes, not those of an h/P-head layer
case_ alibi "2 4" "heads" alibi x16 --causal
decode dec_alibi "2 4" alibi x16 3
# the labels of the slopes (and sinks) are the contract's too: a file whose
# slopes alone were moved (mha permute --block s) ran silently, each rank
# with its heads' slopes out of order (Q/O, K/V labels were compared);
# the same file with every block moved runs
"$MHA" permute --block s --order 1,0,2,3,4,5,6,7 "$T/alibi.safetensors" "$T/alibi_s.safetensors" >/dev/null &&
    "$MHA" permute --order 1,0,2,3,4,5,6,7 "$T/alibi.safetensors" "$T/alibi_all.safetensors" >/dev/null &&
    "$MHA" permute --block s --order 0,1,3,2 --sinks sinks "$T/ossdir" "$T/oss_s.safetensors" >/dev/null ||
    fail "mha permute of the ALiBi and sinks fixtures"
for p in 1 2; do
    mpi $p --split heads --weights "$T/alibi_s.safetensors" --input "$T/x16.npy" --output "$T/y_s.npy" --causal
    expect_fail $p "rank 0: head contract broken in this rank's shard: the score parameters (ALiBi slope, sink) of head 0 have label 1; expected 0"
done
mpi 4 --decode 3 --weights "$T/oss_s.safetensors" --input "$T/x16.npy" --output "$T/y_s.npy" --causal
expect_fail 4 "rank 2: head contract broken in this rank's shard: the score parameters (ALiBi slope, sink) of head 2 have label 3; expected 2"
checks=$((checks + 1))
[ ! -e "$T/y_s.npy" ] || fail "a refused run wrote $T/y_s.npy"
ref --weights "$T/alibi_all.safetensors" --input "$T/x16.npy" --output "$T/r_alibi_all.npy" --causal
mpi 2 --split heads --weights "$T/alibi_all.safetensors" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_alibi_all.npy"
# mha run's variant flags: those that make the layer (--split heads; the
# ring refuses RoPE and ALiBi) and those of a call (both splits)
case_ vflags "2 4" "heads" gqa x16 --causal --rope halves --rope-theta 500 --softcap 2 --alibi
decode dec_vflags "2 4" gqa x16 3 --rope interleaved --softcap 2 --alibi
case_ vpos "2 4" "heads" gqa x16 --causal --rope halves --positions "$T/pos16.npy"
# --decode with --positions (B,T): each call takes its own columns (before, every call read the
# (B,T) array as its (B,n) one: the prefill's rows from the wrong places, each step position [b])
decode dec_vpos "2 4" gqa x16 3 --rope halves --positions "$T/pos2x16.npy"
decode dec_vpos_alibi "2" gqa x16 5 --alibi --positions "$T/pos2x16.npy"
decode dec_vpos_longrope "2" gqa x16 4 --rope halves --positions "$T/pos2x16.npy" \
    --rope-scale longrope:original_max_position_embeddings=30,factor=4,short_factor=2,long_factor=7
case_ vcall "2 4" "heads sequence" gqa x16 --causal --window 5 --sink-tokens 2 --scale 0.3
# Llama 4's chunked attention: the ring's tiles by global position, the shards' caches by cache position
case_ vchunk "2 4" "heads sequence" gqa x16 --causal --chunk 3
decode dec_chunk "2 4" gqa x16 3 --chunk 3
# StreamingLLM's sink keys (--sink-tokens with --window) under --decode: each shard's cache is a
# ring of the window plus the sinks (the full cache refused every call: "options.sink_tokens=2 but
# the cache keeps 0"); every token decoded, sinks beyond T
decode dec_sinktok "2 4" gqa x16 5 --window 4 --sink-tokens 2
decode dec_sinktok_all "2" gqa x16 16 --window 2 --sink-tokens 20 --rope halves
mpi 2 --split sequence --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/y.npy" --rope halves
expect_fail 2 "does not support the layer's RoPE"
# clip_qkv (OLMo 1, DBRX, MPT): --clip-qkv on both splits (the ring clamps
# each rank's projections) and decode; a native file that declares it,
# whose metadata every rank's shard reads (--split heads loads its heads
# from the file); the clamp changes Y here
case_ vclip "2 4" "heads sequence" gqa x16 --causal --clip-qkv 0.2
decode dec_vclip "2 4" gqa x16 3 --clip-qkv 0.2
"$MHA" convert --from native --to native --clip-qkv 0.2 "$T/gqa.safetensors" "$T/gqa_clip.safetensors" \
    >"$T/out" 2>&1 || fail "mha convert --clip-qkv 0.2: $(cat "$T/out")"
case_ fclip "2 4" "heads sequence" gqa_clip x16 --causal
last="clip_qkv file vs flag" close "$T/r_fclip.npy" "$T/r_vclip.npy"
checks=$((checks + 1))
"$PY" -c "import sys, numpy as np; sys.exit(int(np.abs(np.load(sys.argv[1]) - np.load(sys.argv[2])).max() < 1e-3))" \
    "$T/r_vclip.npy" "$T/r_gqa.npy" || fail "--clip-qkv 0.2 left mha run's Y unchanged"
# Llama 4's query temperature: each shard's layer scales its queries (by
# --positions too, in decode); the ring refuses it; the temperature changes Y
case_ vtemp "2 4" "heads" gqa x16 --causal --attn-temperature 3,0.4
decode dec_temp "2 4" gqa x16 3 --attn-temperature 3,0.4 --positions "$T/pos2x16.npy"
checks=$((checks + 1))
"$PY" -c "import sys, numpy as np; sys.exit(int(np.abs(np.load(sys.argv[1]) - np.load(sys.argv[2])).max() < 1e-3))" \
    "$T/r_vtemp.npy" "$T/r_gqa.npy" || fail "--attn-temperature 3,0.4 left mha run's Y unchanged"
mpi 2 --split sequence --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/y.npy" \
    --attn-temperature 3,0.4
expect_fail 2 "does not support the layer's query temperature"
# --zero-attn, a load option the file does not record, reaches every shard
# (Y, and the probabilities over S+1 keys)
ref --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/r.npy" --causal --zero-attn --save-probs "$T/rp.npy"
for p in 2 4; do
    mpi $p --split heads --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/y.npy" --causal --zero-attn \
        --save-probs "$T/p.npy"
    expect_ok
    close "$T/y.npy" "$T/r.npy"; close "$T/p.npy" "$T/rp.npy"
done

# --- captures: rank 0 assembles Z, contributions (and probs, heads only)
ref --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/r.npy" --causal --ablate 2=zero \
    --save-z "$T/rz.npy" --save-contributions "$T/rc.npy" --save-probs "$T/rp.npy"
for p in 2 4; do
    mpi $p --split heads --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/y.npy" --causal \
        --ablate 2=zero --save-z "$T/z.npy" --save-contributions "$T/c.npy" --save-probs "$T/p.npy"
    expect_ok
    close "$T/y.npy" "$T/r.npy"; close "$T/z.npy" "$T/rz.npy"; close "$T/c.npy" "$T/rc.npy"; close "$T/p.npy" "$T/rp.npy"
    mpi $p --split sequence --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/y.npy" --causal \
        --ablate 2=zero --save-z "$T/z.npy" --save-contributions "$T/c.npy"
    expect_ok
    close "$T/y.npy" "$T/r.npy"; close "$T/z.npy" "$T/rz.npy"; close "$T/c.npy" "$T/rc.npy"
done

# --- --stats: bytes per rank against the formulas, computed here --------
# heads: one allreduce of Y, B*T*d_model*4; sequence: (P-1) K/V blocks of
# B*(S/P)*h_kv*(d_k+d_v)*4 bytes each.
for p in 2 4; do
    mpi $p --split heads --stats --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/y.npy"
    expect_ok
    want=$((2 * 16 * 24 * 4))
    checks=$((checks + 1))
    [ "$(grep -c "sent_bytes=$want formula_bytes=$want " "$T/out")" -eq $p ] || fail "$last: want sent_bytes=$want on $p ranks: $(cat "$T/out")"
    mpi $p --split sequence --stats --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/y.npy"
    expect_ok
    want=$(((p - 1) * 2 * (16 / p) * 4 * (2 + 3) * 4))
    checks=$((checks + 1))
    [ "$(grep -c "sent_bytes=$want formula_bytes=$want " "$T/out")" -eq $p ] || fail "$last: want sent_bytes=$want on $p ranks: $(cat "$T/out")"
done

# --- faults: every rank ends with the same error, none hangs -------------
# (outputs go to an empty folder: a failed run must leave nothing there)
mkdir "$T/fo"
mpi 3 --split heads --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy"
expect_fail 3 "h_kv=4"
mpi 3 --split sequence --weights "$T/mha.safetensors" --input "$T/x_short.npy" --output "$T/fo/y.npy"
expect_fail 3 "T >= 6"
mpi 2 --split heads --weights "$T/missing.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy"
expect_fail 2 "missing.safetensors"
# a file name with a newline or an escape: one line per rank, as the CLI's
# errors (the rank reports printed the library's message raw: a newline
# split it, an escape sequence reached the terminal)
mpi 2 --split heads --weights "$T/w
x.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy"
expect_fail 2 "rank 0: .*cannot open '$T/w?x.safetensors'"
esc=$(printf '%s/e\033[31m.safetensors' "$T")
mpi 2 --split sequence --weights "$esc" --input "$T/x.npy" --output "$T/fo/y.npy"
expect_fail 2 "cannot open '$T/e?\[31m.safetensors'"
checks=$((checks + 1))
! grep -q "$(printf '\033')" "$T/err" || fail "$last: an escape reached stderr"
# --positions is an input too: an output naming it was not compared with
# it (the run replaced the positions with Y, exit 0)
cp "$T/pos16.npy" "$T/pos_in.npy" && cp "$T/pos16.npy" "$T/pos_keep.npy"
mpi 2 --split heads --weights "$T/gqa.safetensors" --input "$T/x16.npy" --causal --rope halves \
    --positions "$T/pos_in.npy" --output "$T/pos_in.npy"
expect_fail 2 "--output '$T/pos_in.npy' is the same file as --positions"
checks=$((checks + 1))
cmp -s "$T/pos_in.npy" "$T/pos_keep.npy" || fail "$last: replaced the positions"
# a file problem found before the load exits 1, as in mha run (it was 2,
# the code of a usage error, whatever the problem)
mpi 2 --split heads --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/fo"
expect_fail 2 "cannot write --output '$T/fo': it is a directory"
checks=$((checks + 1))
[ "$rc" -eq 1 ] || fail "$last: exit $rc, want 1 (a file problem)"
# '-' is no file name here: mha run writes an array to standard output,
# mha-mpi refuses it on every rank (rank 0 wrote a file named '-'; mpirun
# forwards rank 0's output through a terminal, which changes bytes)
mpi 2 --split heads --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy" --save-z -
expect_fail 2 "--save-z '-': mha-mpi writes no output to standard output"
checks=$((checks + 1))
[ "$rc" -eq 2 ] && [ ! -e ./- ] || fail "$last: exit $rc (want 2), or a file named '-'"
# rank 0 holds every output at once: each, and their sum, within --max-output-gib (mha run's
# limit, default half the memory), refused before any work (rank 0 allocated them unchecked: an
# overcommitted --save-probs ended with its process killed in the gather)
mpi 2 --split heads --weights "$T/gqa.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy" --causal \
    --save-probs "$T/fo/p.npy" --max-output-gib 1e-5
expect_fail 2 "rank 0: --save-probs would hold 1.53e-05 GiB (4096 float32 values), above the limit of 1e-05 GiB"
[ "$rc" -eq 2 ] || fail "$last: exit $rc, want 2"
# one rank given another file (MPMD): caught on rank 1, reported by both
timeout 120 mpirun --oversubscribe -np 1 "$MPI" run --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy" \
    : -np 1 "$MPI" run --weights "$T/mha.safetensors" --input "$T/nope.npy" --output "$T/fo/y.npy" >"$T/out" 2>"$T/err"
rc=$? last="MPMD with a missing input on rank 1"
expect_fail 2 "rank 1: .*nope.npy"
# shapes that differ between ranks
timeout 120 mpirun --oversubscribe -np 1 "$MPI" run --split sequence --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy" \
    : -np 1 "$MPI" run --split sequence --weights "$T/mha.safetensors" --input "$T/x1.npy" --output "$T/fo/y.npy" >"$T/out" 2>"$T/err"
rc=$? last="MPMD with a different input shape on rank 1"
expect_fail 2 "B = 1 here but 2 on rank 0"
# flags and file contents that differ between ranks: one agreed error on
# every rank (never an MPI abort or a hang), and an existing output kept
echo EXISTING >"$T/fo/keep.npy"
mpmd() { # mpmd "FLAGS OF RANK 0" "FLAGS OF RANK 1"
    timeout 120 mpirun --oversubscribe -np 1 "$MPI" run $1 : -np 1 "$MPI" run $2 >"$T/out" 2>"$T/err"
    rc=$? last="MPMD: rank 0 '$1', rank 1 '$2'"
}
G="--weights $T/mha.safetensors --input $T/x.npy --output $T/fo/keep.npy --causal"
mpmd "$G" "$G --decode 3"
expect_fail 2 "rank 1: --decode = 3 here but 0 on rank 0"
mpmd "$G --split heads" "$G --split sequence"
expect_fail 2 "rank 1: --split sequence = 1 here but 0 on rank 0"
mpmd "$G" "$G --stats"
expect_fail 2 "rank 1: --stats = 1"
mpmd "$G --ablate 1=zero" "$G --ablate 2=zero"
expect_fail 2 "rank 1: checksum of --ablate"
mpmd "$G" "$G --save-probs $T/fo/p.npy"
expect_fail 2 "rank 1: --save-probs given"
mpmd "$G" "--weights $T/mha.safetensors --input $T/x.npy --output $T/fo/keep.npy --causal bottom-right"
expect_fail 2 "rank 1: checksum of --causal"
mpmd "$G --key-padding-mask $T/kpm.npy" "$G --key-padding-mask $T/kpm_b.npy"
expect_fail 2 "rank 1: checksum of --key-padding-mask"
mpmd "$G" "--weights $T/mha_b.safetensors --input $T/x.npy --output $T/fo/keep.npy --causal"
expect_fail 2 "rank 1: checksum of the checkpoint file"
H="--input $T/x16.npy --output $T/fo/keep.npy --causal"
# the same index over other shard files: the files are compared, not only
# the index (each rank ran with its own shard files' heads, silently)
mpmd "--weights $T/shdir $H" "--weights $T/shdir_b $H"
expect_fail 2 "rank 1: checksum of the checkpoint file"
# checkpoints of other head counts (hfdir 4 heads, gqa 8; both d_model 16): named by the count
# before any rank cuts its heads (each cut its own split, and the gather of the labels, counts
# that differ, ended in an MPI abort: MPI_ERR_TRUNCATE)
mpmd "--weights $T/hfdir $H" "--weights $T/gqa.safetensors $H"
expect_fail 2 "rank 1: h = 8 here but 4 on rank 0"
# the ring's ranks hold the whole layer: its W_G is compared too (gseq_b
# differs from gseq in W_G alone)
mpmd "--split sequence --weights $T/gseq.safetensors --input $T/x.npy --output $T/fo/keep.npy --causal" \
     "--split sequence --weights $T/gseq_b.safetensors --input $T/x.npy --output $T/fo/keep.npy --causal"
expect_fail 2 "rank 1: checksum of the weights"
# the ring's ranks given add_bias_kv files that differ in bias_v alone: the extra key row is part
# of the weights' checksum (each rank attended its own rows to its own row, silently, 0.7 off)
mpmd "--split sequence --weights $T/bkv.safetensors --heads 12 --input $T/x.npy --output $T/fo/keep.npy --causal" \
     "--split sequence --weights $T/bkv_b.safetensors --heads 12 --input $T/x.npy --output $T/fo/keep.npy --causal"
expect_fail 2 "rank 1: checksum of the weights"
# a gated GQA layer that P = 3 cannot split: the head split's refusal
mpi 3 --split heads --weights "$T/ggqa.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy" --causal
expect_fail 3 "h_kv=4"
# the same file beside another config.json (rope_theta; soft-cap under the
# ring): each rank ran silently with its own settings before
mpmd "--weights $T/hfdir $H" "--weights $T/hfdir_theta $H"
expect_fail 2 "rank 1: checksum of the variants (config.json"
mpmd "--weights $T/hfdir $H --decode 3" "--weights $T/hfdir_theta $H --decode 3"
expect_fail 2 "rank 1: checksum of the variants (config.json"
mpmd "--split sequence --weights $T/capdir $H" "--split sequence --weights $T/capdir_b $H"
expect_fail 2 "rank 1: checksum of the variants (config.json"
# clip_qkv that differs between ranks (here by the flag; config.json's or
# the file's alike): the layer's clip_qkv is part of the variants' checksum
mpmd "$G --clip-qkv 0.2" "$G --clip-qkv 0.3"
expect_fail 2 "rank 1: checksum of the variants (config.json"
mpmd "$G --attn-temperature 3,0.4" "$G --attn-temperature 3,0.5"
expect_fail 2 "rank 1: checksum of the variants (config.json"
# the rule alone (Llama 4's floor((p + 1) / F), Ministral 3's floor(p / F)):
# before, the ranks ran silently, each head group with its own rule
mpmd "$G --attn-temperature 3,0.4" "$G --attn-temperature 3,0.4,ministral3"
expect_fail 2 "rank 1: checksum of the variants (config.json"
checks=$((checks + 1))
[ "$(cat "$T/fo/keep.npy")" = EXISTING ] || fail "a failed run replaced an existing --output"
rm -f "$T/fo/keep.npy"
# --help on one rank only: an agreed usage error, printed by every rank
mpmd "$G" "--help"
expect_fail 2 "rank 1: --help was given here but not on every rank"
[ "$rc" -eq 2 ] || fail "$last: exit $rc, want 2"
# what the ring cannot do is refused before any work, in CLI terms
mpi 2 --split sequence --weights "$T/hfdir" --input "$T/x16.npy" --output "$T/fo/y.npy" --causal
expect_fail 2 "does not support the layer's RoPE; expected --split heads"
mpi 2 --split sequence --weights "$T/mha.safetensors" --input "$T/x_huge.npy" --output "$T/fo/y.npy"
expect_fail 2 "overflow fp32 .*expected smaller inputs or weights, or --split heads"
# a failing allocation on rank 1 (test hook MHA_MPI_FAIL_ALLOC)
for split in heads sequence; do
    MHA_MPI_FAIL_ALLOC=1 mpi 3 --split $split --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy"
    expect_fail 3 "rank 1: no memory"
done
# a rank reads only its heads: the NaN of head 5 stops the rank that owns it
# (the lowest failing rank names it), not the ranks before it
mpi 2 --split heads --weights "$T/nan5.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy"
expect_fail 2 "rank 1: .*w_q\[.*\] = nan"
mpi 4 --split heads --weights "$T/nan5.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy"
expect_fail 4 "rank 2: .*w_q\[.*\] = nan"
# a QK-norm over the whole width needs every head: refused by the head
# split (and decode) for P > 1, on every rank; P = 1 holds every head
mpi 2 --split heads --weights "$T/whole.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy" --causal
expect_fail 2 "qk_norm_whole .*needs every head"
mpi 2 --decode 3 --weights "$T/whole.safetensors" --input "$T/x16.npy" --output "$T/fo/y.npy" --causal
expect_fail 2 "qk_norm_whole .*needs every head"
case_ whole1 "1" "heads" whole x16 --causal
# the same from an hf directory (OLMo 2): the shard of P = 1 keeps the
# whole-width norm (it read the (h*d_k) weights as per-head ones: 0.6 off)
ref --weights "$T/olmo2dir" --input "$T/x16.npy" --output "$T/r_olmo2.npy" --causal
mpi 1 --split heads --weights "$T/olmo2dir" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_olmo2.npy"
mpi 1 --decode 3 --weights "$T/olmo2dir" --input "$T/x16.npy" --output "$T/y.npy" --causal
expect_ok
close "$T/y.npy" "$T/r_olmo2.npy"
mpi 2 --split heads --weights "$T/olmo2dir" --input "$T/x16.npy" --output "$T/fo/y.npy" --causal
expect_fail 2 "qk_norm_whole .*needs every head"
# StableLM's and Cohere's LayerNorm of each head travels with the head
# (the shard dropped StableLM's norms.N tensors before it read them);
# InternLM2's wqkv rows per kv group as megatron's
for dir in slmdir coheredir interndir mptdir; do
    ref --weights "$T/$dir" --input "$T/x16.npy" --output "$T/r_$dir.npy" --causal
    for np_ in 2 4; do
        mpi $np_ --split heads --weights "$T/$dir" --input "$T/x16.npy" --output "$T/y.npy" --causal
        expect_ok
        close "$T/y.npy" "$T/r_$dir.npy"
    done
done
# --decode: usage errors (exit 2) on every rank
mpi 2 --decode 3 --split sequence --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy" --causal
expect_fail 2 "expected --split heads"
[ "$rc" -eq 2 ] || fail "$last: exit $rc, want 2"
mpi 2 --decode 17 --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy" --causal
expect_fail 2 "expected 1..16"
mpi 2 --decode 3 --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy"
expect_fail 2 "expected --causal"
mpi 2 --decode 3 --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy" --causal --ablate 2=mean
expect_fail 2 "--decode with --ablate 2=mean"
[ "$rc" -eq 2 ] || fail "$last: exit $rc, want 2"
# --save-probs with --split sequence: a usage error (exit 2) before any file is read
mpi 2 --split sequence --weights "$T/mha.safetensors" --input "$T/x.npy" --output "$T/fo/y.npy" --causal \
    --save-probs "$T/fo/p.npy"
expect_fail 2 "expected --split heads, or no --save-probs"
[ "$rc" -eq 2 ] || fail "$last: exit $rc, want 2"
checks=$((checks + 1))
[ -z "$(ls -A "$T/fo")" ] || fail "failed runs left files behind: $(ls -A "$T/fo")"

api_test

echo "mpi_test: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
