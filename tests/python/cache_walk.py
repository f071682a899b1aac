"""Model-based random walk over the KV cache API (mha.Cache), with an
oracle that recomputes every answer from scratch.

The model keeps, per sequence of the cache, each token's K and V as the
cache's storage type reads them back (combo_oracle.round_store: fp32,
fp16, int8 blocks of 32), the position it was stored with, and which
ring slot holds which cache index. Each call's outputs are recomputed in
float64 over the sequence's whole visible history (causal, the ring's
window, StreamingLLM sink tokens, window_left, chunk_size, a tree mask's
paths, the layer's extra keys and variants), never from the library's
own numbers; the heads follow mha_layer_permute_heads through a map to
the original heads. Written from include/mha.h, docs/CACHE.md and
docs/VARIANTS.md.

Every step is checked: y and the captures (z, contributions, probs by
slot) against the oracle, lengths, and for an operation the API must
refuse, the error's class and that the cache is unchanged: a clone taken
before the failed call and the cache after it give the same bits for
the next step, which the oracle (that never saw the failed call) checks.

walk(seed, steps) runs one walk and returns its statistics; the tests
(test_cache_walk.py) run many, and `python3 tests/python/cache_walk.py
SEEDS STEPS` soaks by hand.
"""
import math
import os
import sys

import numpy as np
import torch

import mha
import combo_oracle as O
from combo_oracle import divisors, rand_weights
from conftest import KERNELS

TOL = {"float32": 2e-5, "float16": 2e-3, "int8": 3e-2}
DTYPES = ("float32", "float16", "int8")


class WalkFailure(AssertionError):
    pass


# ------------------------------------------------------------ generators

def rand_cfg(rng, long=False):
    """A layer: the torch family (bias, add_bias_kv, add_zero_attn) or the
    variants family (RoPE without seq-dependent scaling, ALiBi, softcap,
    sink logits, QK-norm, clip_qkv, temperature, output gate). long: also
    16 and 32 query heads (the decode kernels' grouped units)."""
    h = int(rng.choice([1, 2, 3, 4, 6, 8] + ([16, 32] if long else [])))
    g = int(rng.choice(divisors(h)))
    d_k = int(rng.choice([2, 4, 6, 8, 12, 16, 40] if rng.random() < 0.9 else [33, 36, 64]))
    d_v = d_k if rng.random() < 0.6 else int(rng.choice([2, 4, 5, 8, 12, 33]))
    cfg = dict(d_model=int(rng.choice([8, 12, 16, 24])), n_heads=h, n_kv_heads=g, d_k=d_k, d_v=d_v,
               bias=bool(rng.random() < 0.6))
    if rng.random() < 0.35:
        cfg["add_bias_kv"] = bool(rng.random() < 0.7)
        cfg["add_zero_attn"] = bool(rng.random() < 0.5)
        return cfg
    if rng.random() < 0.55 and d_k >= 2:
        r = d_k - d_k % 2 if rng.random() < 0.5 else int(rng.choice(list(range(2, d_k + 1, 2))))
        rope = dict(pairing=str(rng.choice(["halves", "interleaved"])), dim=r,
                    theta=float(rng.choice([10000.0, 100.0])))
        sc = str(rng.choice(["none", "none", "linear", "llama3", "yarn"]))
        if sc == "linear":
            rope.update(scaling="linear", factor=2.0)
        elif sc == "llama3":
            rope.update(scaling="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_positions=16)
        elif sc == "yarn":
            rope.update(scaling="yarn", factor=4.0, original_max_positions=16)
        cfg["rope"] = rope
    if rng.random() < 0.35:
        cfg["alibi"] = True
    if rng.random() < 0.3:
        cfg["softcap"] = float(rng.choice([0.7, 5.0]))
    if rng.random() < 0.3:
        cfg["sinks"] = True
    if rng.random() < 0.3:
        cfg["qk_norm"] = str(rng.choice(["rms", "layer"]))
        kind = rng.choice(["shared", "per_head", "whole"])
        cfg["qk_norm_per_head"] = bool(kind != "shared")
        cfg["qk_norm_whole"] = bool(kind == "whole")
    if rng.random() < 0.2:
        cfg["clip_qkv"] = float(rng.choice([0.5, 2.0]))
    if rng.random() < 0.2:
        cfg["temperature"] = (int(rng.choice([1, 3])), 0.5, str(rng.choice(["llama4", "ministral3"])))
    if rng.random() < 0.15:
        cfg["output_gate"] = True
    return cfg



def rand_perm(rng, h, g):
    """A head permutation that keeps kv groups whole (new head i = old perm[i])."""
    rep = h // g
    gp = rng.permutation(g)
    perm = []
    for ng in range(g):
        inner = rng.permutation(rep) if rng.random() < 0.5 else np.arange(rep)
        perm += [int(gp[ng]) * rep + int(k) for k in inner]
    return perm


# ------------------------------------------------------------------ model
class Seq:
    """One sequence: per cache index its K (g,d_k) and V (g,d_v) as stored,
    its stored position; slot -> the cache index last written there."""

    def __init__(self):
        self.k, self.v, self.pos, self.slot = [], [], [], {}

    def __len__(self):
        return len(self.k)

    def copy(self):
        s = Seq()
        s.k, s.v, s.pos, s.slot = list(self.k), list(self.v), list(self.pos), dict(self.slot)
        return s

    def truncate(self, n):
        del self.k[n:], self.v[n:], self.pos[n:]


class Model:
    def __init__(self, B, cap, window, n_sink, kdt, vdt):
        self.B, self.cap, self.W, self.ns, self.kdt, self.vdt = B, cap, window, n_sink, kdt, vdt
        self.seqs = [Seq() for _ in range(B)]

    def copy(self):
        m = Model(self.B, self.cap, self.W, self.ns, self.kdt, self.vdt)
        m.seqs = [s.copy() for s in self.seqs]
        return m

    def slot_of(self, j):
        if not self.W or j < self.ns:
            return j
        return self.ns + (j - self.ns) % (self.cap - self.ns)

    def stored(self, b, j):
        s = self.seqs[b]
        return 0 <= j < len(s) and s.slot.get(self.slot_of(j)) == j

    def append(self, b, k, v, pos):
        s = self.seqs[b]
        j = len(s)
        s.k.append(k), s.v.append(v), s.pos.append(int(pos))
        s.slot[self.slot_of(j)] = j

    def lengths(self):
        return [len(s) for s in self.seqs]

    def next_needs(self, n):
        """First cache index the next token of a length-n sequence reads
        (the sinks are never evicted), as docs/CACHE.md's truncate rule."""
        need = max(0, n - (self.W - 1)) if self.W else 0
        return max(need, self.ns) if self.W else 0

    def rollback_ok(self, b, n):
        return all(self.stored(b, j) for j in range(self.next_needs(n), n))

    def ok(self, b, j, t, wl, chunk):
        """Whether a query at index t sees the key at index j <= t."""
        inside = True
        if self.W:
            inside &= j >= t - (self.W - 1) or j < self.ns
        if wl is not None and wl >= 0:
            inside &= j >= t - wl or j < self.ns
        if chunk:
            inside &= j // chunk == t // chunk
        return inside


# ----------------------------------------------------------------- oracle
class Oracle:
    def __init__(self, cfg, w):
        self.cfg, self.w = cfg, w
        self.h, self.g, self.dk, self.dv = cfg["n_heads"], cfg["n_kv_heads"], cfg["d_k"], cfg["d_v"]
        self.W64 = {n: torch.as_tensor(np.asarray(a, np.float64)) for n, a in w.items()}
        self.slopes = None
        if cfg.get("alibi"):
            self.slopes = np.asarray(w["alibi_slopes"] if "alibi_slopes" in w else O.alibi_default(self.h),
                                     np.float64)

    def project(self, x, pos):
        """q (n,h,d_k) with the temperature, k (n,g,d_k), v (n,g,d_v),
        gate (n,h*d_v) or None: rows x (n,d_model) at positions pos."""
        cfg, W = self.cfg, self.W64
        h, g, dk, dv = self.h, self.g, self.dk, self.dv
        X = torch.as_tensor(np.asarray(x, np.float64))[None]
        n = X.shape[1]
        q = X @ W["w_q"] + (W["b_q"] if "b_q" in W else 0)
        k = X @ W["w_k"] + (W["b_k"] if "b_k" in W else 0)
        v = X @ W["w_v"] + (W["b_v"] if "b_v" in W else 0)
        c = cfg.get("clip_qkv") or 0.0
        if c:
            q, k, v = q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)
        q, k, v = q.reshape(1, n, h, dk), k.reshape(1, n, g, dk), v.reshape(1, n, g, dv)
        kind = cfg.get("qk_norm", "none")
        if kind != "none":
            ph, wh = cfg.get("qk_norm_per_head", False), cfg.get("qk_norm_whole", False)
            q = O.qk_norm(q, W["q_norm"], kind, ph, wh, 1e-6)
            k = O.qk_norm(k, W["k_norm"], kind, ph, wh, 1e-6)
        P = np.asarray(pos, np.int64)[None]
        if cfg.get("rope"):
            q, k = O.rope_apply(q, P, cfg["rope"], 1), O.rope_apply(k, P, cfg["rope"], 1)
        tf = O.temperature(P, cfg.get("temperature"))
        if tf is not None:
            q = q * tf[:, :, None, None]
        gate = None
        if cfg.get("output_gate"):
            gate = torch.sigmoid(X @ W["w_g"] + (W["b_g"] if "b_g" in W else 0))[0].numpy()
        return q[0].numpy(), k[0].numpy(), v[0].numpy(), gate

    def attend_row(self, seq, t, qrow, vis, scale, plain=False, kvmap=None, masked_row="zero"):
        """z (h,d_v) and p (h,len(vis)), extra (h,n_extra) of the query rows
        qrow (h,d_k) at cache index t over the keys at indices vis of seq.
        plain: mha_cache_attend (no softcap, ALiBi, sinks or extra keys).
        kvmap[r]: the stored (original) kv head query head r reads."""
        cfg, h, g = self.cfg, self.h, self.g
        rep = h // g
        K = np.array([seq.k[j] for j in vis]).reshape(len(vis), g, self.dk)
        V = np.array([seq.v[j] for j in vis]).reshape(len(vis), g, self.dv)
        P = np.array([seq.pos[j] for j in vis], np.int64)
        extra_k, extra_v = [], []
        if not plain and cfg.get("add_bias_kv"):
            extra_k.append(np.asarray(self.w["bias_k"], np.float64).reshape(g, self.dk))
            extra_v.append(np.asarray(self.w["bias_v"], np.float64).reshape(g, self.dv))
        if not plain and cfg.get("add_zero_attn"):
            extra_k.append(np.zeros((g, self.dk)))
            extra_v.append(np.zeros((g, self.dv)))
        z = np.zeros((h, self.dv))
        p = np.zeros((h, len(vis)))
        px = np.zeros((h, len(extra_k)))
        cap = 0.0 if plain else (cfg.get("softcap") or 0.0)
        for r in range(h):
            gr = kvmap[r] if kvmap is not None else r // rep
            s = K[:, gr] @ qrow[r] * scale
            if cap:
                s = cap * np.tanh(s / cap)
            if not plain and self.slopes is not None:
                s = s - self.slopes[r] * np.abs(seq.pos[t] - P)
            se = np.array([ek[gr] @ qrow[r] * scale for ek in extra_k])
            allv = np.concatenate([s, se])
            if not len(allv):  # no key: a zero row (NaN with masked_row 'nan' and no sink logit)
                if masked_row == "nan" and not (not plain and cfg.get("sinks")):
                    z[r] = np.nan
                continue
            m = allv.max()
            sink = None
            if not plain and cfg.get("sinks"):
                sink = float(self.w["sinks"][r])
                m = max(m, sink)
            e = np.exp(allv - m)
            den = e.sum() + (math.exp(sink - m) if sink is not None else 0.0)
            pr = e / den
            p[r], px[r] = pr[:len(vis)], pr[len(vis):]
            z[r] = pr[:len(vis)] @ V[:, gr] + sum(pr[len(vis) + i] * extra_v[i][gr] for i in range(len(extra_v)))
        return z, p, px


# ------------------------------------------------------------------- walk
class Walk:
    def __init__(self, seed, steps, long_share=0.0):
        self.seed, self.steps, self.long_share = seed, steps, long_share
        self.rng = np.random.default_rng(seed)
        self.stats = {"steps": 0, "ops": {}, "worst": {}, "refused": {}}
        self.history = []

    # ------------------------------------------------------------ helpers
    def note(self, op):
        self.history.append(op)
        self.stats["ops"][op.split(":")[0]] = self.stats["ops"].get(op.split(":")[0], 0) + 1

    def fail(self, msg):
        raise WalkFailure(f"seed {self.seed} step {self.stats['steps']}: {msg}\n"
                          f"cfg={self.cfg} cache={self.cache_desc}\nlast ops: {self.history[-12:]}")

    def check(self, cond, msg):
        if not cond:
            self.fail(msg)

    def setup(self):
        rng = self.rng
        self.long = rng.random() < self.long_share
        self.cfg = rand_cfg(rng, self.long)
        self.layer = mha.Layer(**self.cfg)
        self.w = rand_weights(rng, self.layer)
        self.layer.set_weights(self.w)
        self.oracle = Oracle(self.cfg, self.w)
        cfg = self.cfg
        self.h, self.g = cfg["n_heads"], cfg["n_kv_heads"]
        self.explicit = bool(cfg.get("rope") or cfg.get("alibi") or cfg.get("temperature")) and rng.random() < 0.5
        self.scrambled = self.explicit and rng.random() < 0.3
        B = int(rng.integers(1, 5))
        kdt = str(rng.choice(DTYPES))
        vdt = kdt if rng.random() < 0.6 else str(rng.choice(DTYPES))
        r = rng.random()
        if self.long:  # several 128-slot storage chunks, rings of them wrapping
            if r < 0.4:
                window, n_sink, cap = 0, 0, int(rng.integers(200, 900))
            else:
                window = int(rng.integers(60, 300))
                n_sink = int(rng.integers(1, 5)) if rng.random() < 0.4 else 0
                cap = window + n_sink + int(rng.integers(0, 200))
        elif r < 0.45:
            window, n_sink, cap = 0, 0, int(rng.integers(30, 200))
        else:
            window = int(rng.integers(1, 9)) if rng.random() < 0.85 else int(rng.integers(100, 140))
            n_sink = int(rng.integers(1, 4)) if rng.random() < 0.4 else 0
            cap = window + n_sink + int(rng.integers(0, 6) if rng.random() < 0.8 else rng.integers(6, 140))
        self.cache = mha.Cache(self.layer, batch=B, capacity=cap, dtype=kdt, v_dtype=vdt, window=window,
                               sink_tokens=n_sink)
        self.model = Model(B, cap, window, n_sink, kdt, vdt)
        self.cur = list(range(self.h))  # current head i = original head cur[i]
        self.nextpos = [0] * B
        self.wl = int(rng.integers(0, 6)) if rng.random() < 0.15 else None
        self.chunk = int(rng.integers(1, 6)) if not n_sink and rng.random() < 0.15 else 0
        self.cache_desc = dict(B=B, cap=cap, window=window, n_sink=n_sink, kdt=kdt, vdt=vdt, wl=self.wl,
                               chunk=self.chunk, explicit=self.explicit, scrambled=self.scrambled, long=self.long)
        self.tol = max(TOL[kdt], TOL[vdt])
        self.key = kdt + "/" + vdt

    def set_env(self):
        rng = self.rng
        if rng.random() < 0.1:
            os.environ["MHA_KERNELS"] = str(rng.choice(KERNELS))
        if rng.random() < 0.05:
            mha.set_num_threads(int(rng.choice([1, 2])))

    def kvmap(self):
        rep = self.h // self.g
        return [self.cur[i] // rep for i in range(self.h)]

    def err(self, got, want, what):
        """got within the storage types' tolerance of want, relative to
        max |want|; NaN exactly where want has it (masked_row 'nan')."""
        nan = np.isnan(want)
        self.check(np.array_equal(np.isnan(got), nan), f"{what}: NaN at other elements than the oracle's")
        got, want = np.where(nan, 0.0, got), np.where(nan, 0.0, want)
        scale = np.abs(want).max() + 1e-3
        e = float(np.abs(got - want).max() / scale) if got.size else 0.0
        self.stats["worst"][self.key] = max(self.stats["worst"].get(self.key, 0.0), e)
        self.check(np.all(np.isfinite(got)), f"{what}: non-finite output")
        self.check(e <= self.tol, f"{what}: relative error {e:.3g} > {self.tol} ({self.key})")

    def check_lengths(self, what):
        got = self.cache.lengths()
        self.check(got == self.model.lengths(), f"{what}: lengths {got}, model {self.model.lengths()}")

    # -------------------------------------------------- inputs of a call
    def positions(self, B, T, n_new, depth=None, given=None):
        """Each new token's position: given (explicit, with gaps of 1-3),
        base + depth for a tree, else its cache index (what the cache
        stores when the call passes none)."""
        given = self.explicit if given is None else given
        pos = np.zeros((B, T), np.int32)
        for b in range(B):
            if depth is not None:
                pos[b] = self.nextpos[b] + np.asarray(depth[b])
            elif given and self.scrambled:
                pos[b] = self.rng.integers(0, 300, T)  # any order, repeats: RoPE and ALiBi read them as given
            elif given:
                gaps = self.rng.integers(1, 4, T)
                pos[b] = self.nextpos[b] + np.cumsum(gaps) - gaps[0]
            else:
                pos[b] = len(self.model.seqs[b]) + np.arange(T)
        return pos

    def counts(self, T, ragged):
        B = self.model.B
        n = [int(self.rng.integers(0, T + 1)) if ragged else T for _ in range(B)]
        return n

    # --------------------------------------------------------- the oracle
    def expect(self, x, n_new, pos, trees=None, wl=None, chunk=0, interventions=None, scale=0.0, masked_row="zero"):
        """Appends the call's tokens to the model; returns y (B,T,d_model),
        z (B,T,h*d_v), contributions (h,B,T,d_model), probs (B,h,T,cap+extra)."""
        m, o, h = self.model, self.oracle, self.h
        B, T = x.shape[0], x.shape[1]
        dv = o.dv
        sc = scale if scale else 1.0 / math.sqrt(o.dk)
        n_extra = int(bool(self.cfg.get("add_bias_kv"))) + int(bool(self.cfg.get("add_zero_attn")))
        Z = np.zeros((B, T, h, dv))
        PR = np.zeros((B, h, T, m.cap + n_extra))
        gates = {}
        inv = [0] * h
        for i, r in enumerate(self.cur):
            inv[r] = i
        for b in range(B):
            nb = n_new[b]
            if not nb:
                continue
            q, k, v, gate = o.project(x[b, :nb], pos[b, :nb])
            gates[b] = gate
            seq = m.seqs[b]
            L0 = len(seq)
            kst, vst = O.round_store(k, m.kdt, o.dk), O.round_store(v, m.vdt, dv)
            before = [m.stored(b, j) for j in range(L0)]
            for i in range(nb):
                m.append(b, kst[i], vst[i], pos[b, i])
            for i in range(nb):
                t = L0 + i
                if trees is not None:
                    tree = trees[b]
                    anc = [j for j in range(i + 1) if tree[i][j]]
                    rank = {L0 + j: L0 + r for r, j in enumerate(anc)}
                    tp = L0 + sum(1 for j in anc if j < i)  # its own place on the path it sees
                    keys = [(j, j) for j in range(L0)] + [(L0 + j, rank[L0 + j]) for j in anc]
                else:
                    tp = t
                    keys = [(j, j) for j in range(t + 1)]
                vis = [j for j, jp in keys if m.ok(b, jp, tp, wl, chunk)]
                for j in vis:
                    if j < L0 and not before[j]:
                        self.fail(f"model: query {t} of sequence {b} needs index {j}, not stored")
                zr, pr, px = o.attend_row(seq, t, q[i], vis, sc, masked_row=masked_row)
                Z[b, i] = zr
                for r in range(h):
                    ci = inv[r]
                    for jj, j in enumerate(vis):
                        PR[b, ci, i, m.slot_of(j)] = pr[r, jj]
                    PR[b, ci, i, m.cap:] = px[r]
        # current head order, gate, interventions, W_O
        Zc = Z[:, :, self.cur]  # (B,T,h,dv)
        if self.cfg.get("output_gate"):
            for b, gt in gates.items():
                G = gt.reshape(-1, self.h, dv)[:, self.cur]
                Zc[b, :n_new[b]] *= G
        live = np.zeros((B, T), bool)
        for b in range(B):
            live[b, :n_new[b]] = True
        if interventions:
            for i, it in interventions.items():
                if it == "zero":
                    Zc[:, :, i] = 0
                elif it == "mean":
                    if not live.any():
                        continue
                    mean = Zc[:, :, i][live].mean(0)
                    Zc[live, i] = mean  # over the call's new rows, every sequence's
                elif it[0] == "scale":
                    Zc[:, :, i] *= it[1]
                else:
                    Zc[:, :, i] = it[1]
            Zc[~live] = 0
        Wo = np.asarray(self.w["w_o"], np.float64).reshape(h, dv, -1)[self.cur]
        contrib = np.einsum("btid,ido->ibto", Zc, Wo)
        y = contrib.sum(0) + (np.asarray(self.w["b_o"], np.float64) if "b_o" in self.w else 0.0)
        y[~live] = 0
        return y, Zc.reshape(B, T, h * dv), contrib, PR

    # ----------------------------------------------------------- the ops
    def op_forward(self, failing=None):
        rng, m = self.rng, self.model
        B = m.B
        big = rng.random() < (0.25 if self.long else 0.12)
        T = int(rng.integers(2, 200 if self.long else 25)) if big else int(rng.choice([1, 1, 1, 2, 3]))
        ragged = B > 1 and rng.random() < 0.3
        n_new = self.counts(T, ragged)
        if not m.W:
            room = [m.cap - len(s) for s in m.seqs]
            if any(n_new[b] > room[b] for b in range(B)):
                if rng.random() < 0.3:
                    return self.op_refused_capacity(T, n_new)
                if min(room) < 1:
                    b = int(np.argmin(room))
                    self.truncate_to(b, int(rng.integers(0, len(m.seqs[b]) + 1)))
                    return
                T = min(T, min(room))
                n_new = [min(n, T) for n in n_new]
        x = rng.normal(0, 1, (B, T, self.cfg["d_model"])).astype(np.float32)
        pos = self.positions(B, T, n_new)
        kw = {}
        if self.explicit:
            kw["positions"] = pos
        if self.wl is not None:
            kw["window_left"] = self.wl
        if self.chunk:
            kw["chunk_size"] = self.chunk
        ivs = None
        if rng.random() < 0.1:
            ivs = {}
            for _ in range(int(rng.integers(1, 3))):
                i = int(rng.integers(0, self.h))
                kind = rng.choice(["zero", "mean", "scale", "replace"])
                if kind == "scale":
                    ivs[i] = ("scale", float(rng.uniform(-2, 2)))
                elif kind == "replace":
                    ivs[i] = ("replace", rng.normal(0, 1, (B, T, self.oracle.dv)).astype(np.float32))
                else:
                    ivs[i] = str(kind)
            kw["interventions"] = ivs
        scale = float(rng.choice([0.0, 0.0, 0.0, 0.3]))
        if scale:
            kw["scale"] = scale
        capture = [c for c in ("z", "contributions", "probs") if rng.random() < 0.3]
        self.note(f"forward:T={T} n={n_new}{' iv' if ivs else ''}")
        y, caps = self.run_forward(x, n_new if ragged else None, capture, kw)
        want = self.expect(x, n_new, pos, wl=self.wl, chunk=self.chunk, interventions=ivs, scale=scale)
        self.compare(y, caps, want, n_new)
        for b in range(B):
            if n_new[b]:
                self.nextpos[b] = int(pos[b, n_new[b] - 1]) + 1
        self.check_lengths("forward")

    def run_forward(self, x, n_new, capture, kw):
        """cache.forward; with one sequence, half the time in the binding's
        (T,d_model) form (positions (T,), keep_mask (T,T), a replace value
        (T,d_v), n_new an int), its results given their batch axis back."""
        if self.model.B == 1 and self.rng.random() < 0.5:
            kw = dict(kw)
            if "positions" in kw:
                kw["positions"] = np.asarray(kw["positions"])[0]
            if "keep_mask" in kw and np.ndim(kw["keep_mask"]) == 3:
                kw["keep_mask"] = kw["keep_mask"][0]
            if "interventions" in kw:
                kw["interventions"] = {i: (("replace", it[1][0]) if isinstance(it, tuple) and it[0] == "replace"
                                           else it) for i, it in kw["interventions"].items()}
            n = None if n_new is None else int(n_new[0])
            out = self.cache.forward(self.layer, x[0], n_new=n, capture=capture or (), **kw)
            y, caps = out if capture else (out, {})
            unsq = {"z": lambda a: a[None], "probs": lambda a: a[None], "contributions": lambda a: a[:, None]}
            return y[None], {k: unsq[k](a) for k, a in caps.items()}
        out = self.cache.forward(self.layer, x, n_new=n_new, capture=capture or (), **kw)
        return out if capture else (out, {})

    def compare(self, y, caps, want, n_new):
        wy, wz, wc, wp = want
        self.err(y, wy, "y")
        if "z" in caps:
            self.err(caps["z"], wz, "captured z")
        if "contributions" in caps:
            self.err(caps["contributions"], wc, "captured contributions")
        if "probs" in caps:
            d = float(np.abs(caps["probs"] - wp).max())
            tol = 1e-5 if self.model.kdt == "float32" else 3e-2
            self.check(d <= tol, f"captured probs off by {d:.3g}")

    def truncate_to(self, b, n):
        m = self.model
        ok = self.model.rollback_ok(b, n)
        self.note(f"truncate:{b}->{n} of {len(m.seqs[b])}{'' if ok else ' (refused)'}")
        try:
            self.cache.truncate(b, n)
        except mha.ArgumentError as e:
            self.check(not ok, f"truncate({b}, {n}) refused, the model allows it: {e}")
            self.stats["refused"]["truncate"] = self.stats["refused"].get("truncate", 0) + 1
            self.check_lengths("refused truncate")
            return
        self.check(ok, f"truncate({b}, {n}) accepted, the model refuses it (the next window needs evicted keys)")
        m.seqs[b].truncate(n)
        self.nextpos[b] = m.seqs[b].pos[-1] + 1 if n else 0
        self.check_lengths("truncate")

    def op_truncate(self):
        rng, m = self.rng, self.model
        b = int(rng.integers(0, m.B))
        L = len(m.seqs[b])
        near = rng.random() < 0.7
        n = int(rng.integers(max(0, L - 4) if near else 0, L + 1))
        self.truncate_to(b, n)

    def op_reset(self):
        b = int(self.rng.integers(-1, self.model.B))
        self.note(f"reset:{b}")
        self.cache.reset(b)
        for bb in range(self.model.B):
            if b in (-1, bb):
                self.model.seqs[bb] = Seq()
                self.nextpos[bb] = 0
        self.check_lengths("reset")

    def op_reorder(self):
        B = self.model.B
        src = [int(v) for v in self.rng.integers(0, B, B)] if self.rng.random() < 0.6 else \
            [int(v) for v in self.rng.permutation(B)]
        self.note(f"reorder:{src}")
        self.cache.reorder(src)
        old = self.model.seqs
        self.model.seqs = [old[s].copy() for s in src]
        self.nextpos = [self.nextpos[s] for s in src]
        self.check_lengths("reorder")

    def op_clone(self):
        """Clone; the original takes another step (checked against the
        model's copy) and is freed; the walk goes on with the clone."""
        self.note("clone")
        clone = self.cache.copy()
        saved_model, saved_next = self.model.copy(), list(self.nextpos)
        if self.rng.random() < 0.5 and self.room_for(1):
            self.op_forward()  # on the original
        self.cache.close()
        self.cache, self.model, self.nextpos = clone, saved_model, saved_next
        self.check_lengths("clone")

    def op_save_load(self, tmp):
        """Saved and loaded: the next step gives the bits of the original's."""
        self.note("save/load")
        path = os.path.join(tmp, f"walk{self.seed}.safetensors")
        self.cache.save(path)
        original = self.cache
        self.cache = mha.Cache.load(path, self.layer)
        os.unlink(path)
        self.check_lengths("load")
        self.same_state(original, "save/load", refused=False)

    def op_threads(self):
        """The same call on a clone with one thread and on the cache with
        two: the same bits (docs/CACHE.md: results never depend on the
        thread count)."""
        m = self.model
        T = int(self.rng.integers(1, 40))
        if not self.room_for(T):
            return
        if m.W:
            T = min(T, m.cap - m.ns - m.W + 1)
        self.note(f"threads:T={T}")
        x = self.rng.normal(0, 1, (m.B, T, self.cfg["d_model"])).astype(np.float32)
        pos = self.positions(m.B, T, [T] * m.B)
        kw = dict(positions=pos) if self.explicit else {}
        if self.wl is not None:
            kw["window_left"] = self.wl
        if self.chunk:
            kw["chunk_size"] = self.chunk
        snap = self.cache.copy()
        mha.set_num_threads(1)
        y1 = snap.forward(self.layer, x, **kw)
        snap.close()
        mha.set_num_threads(2)
        y2 = self.cache.forward(self.layer, x, **kw)
        self.check(np.array_equal(y1, y2), "1 and 2 threads give other bits")
        want = self.expect(x, [T] * m.B, pos, wl=self.wl, chunk=self.chunk)
        self.compare(y2, {}, want, [T] * m.B)
        for b in range(m.B):
            self.nextpos[b] = int(pos[b, -1]) + 1
        self.check_lengths("threads")

    def op_permute(self):
        perm = rand_perm(self.rng, self.h, self.g)
        self.note(f"permute:{perm}")
        self.layer.permute_heads(perm)
        self.cur = [self.cur[p] for p in perm]
        if any(self.model.lengths()) and self.rng.random() < 0.5 and perm_moves_kv(perm, self.h, self.g) and \
                self.room_for(1):
            # the layer alone permuted: refused, nothing changed (the clone
            # taken before follows the same permutation)
            x = self.rng.normal(0, 1, (self.model.B, 1, self.cfg["d_model"])).astype(np.float32)
            snap = self.cache.copy()
            try:
                self.cache.forward(self.layer, x)
            except mha.ContractError:
                pass
            else:
                self.fail("a forward with the layer permuted and the cache not: accepted")
            self.check_lengths("refused contract")
            self.cache.permute_heads(perm)
            snap.permute_heads(perm)
            self.same_state(snap, "contract")
        elif any(self.model.lengths()):
            self.cache.permute_heads(perm)
        elif self.rng.random() < 0.5:
            self.cache.permute_heads(perm)  # an empty cache adopts the layer's labels: either way
        self.check_lengths("permute")

    def room_for(self, n):
        m = self.model
        return bool(m.W) or all(m.cap - len(s) >= n for s in m.seqs)

    def op_tree(self):
        """A tree of drafts verified in one call, then a compaction."""
        rng, m = self.rng, self.model
        B = m.B
        piece = m.cap - m.ns - m.W + 1 if m.W else None
        T = int(rng.integers(1, 7))
        if piece is not None and T > piece and rng.random() < 0.7:
            T = piece
        if not self.room_for(T):
            return
        trees = []
        general = rng.random() < 0.25  # any lower-triangular mask: a row may keep neither its parent nor itself
        for b in range(B if rng.random() < 0.5 else 1):
            if general:
                trees.append(np.tril(rng.random((T, T)) < 0.6))
                continue
            parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, T)]
            tree = np.zeros((T, T), bool)
            for i in range(T):
                j = i
                while j >= 0:
                    tree[i, j] = True
                    j = parent[j]
            trees.append(tree)
        mask = np.stack(trees)
        trees = [trees[b if len(trees) > 1 else 0] for b in range(B)]
        depth = [[int(trees[b][i, :i].sum()) for i in range(T)] for b in range(B)]
        ragged = B > 1 and rng.random() < 0.3
        n_new = self.counts(T, ragged)
        x = rng.normal(0, 1, (B, T, self.cfg["d_model"])).astype(np.float32)
        kw = dict(keep_mask=mask if len(mask) > 1 else mask[0])
        if self.cfg.get("rope") or self.cfg.get("alibi") or self.cfg.get("temperature"):
            pos = self.positions(B, T, n_new, depth=depth)
            kw["positions"] = pos
        else:
            pos = self.positions(B, T, n_new, given=False)  # stored with its cache index
        if self.wl is not None:
            kw["window_left"] = self.wl
        if self.chunk:
            kw["chunk_size"] = self.chunk
        capture = ["probs"] if rng.random() < 0.3 else []
        masked_row = str(rng.choice(["zero", "nan"])) if general else "zero"
        if masked_row == "nan":
            kw["masked_row"] = "nan"
        lost = self.tree_loses(trees, n_new)
        self.note(f"tree:T={T} n={n_new}{' (refused)' if lost else ''}")
        snap = self.cache.copy() if piece is not None and T > piece else None
        try:
            y, caps = self.run_forward(x, n_new if ragged else None, capture, kw)
        except mha.ArgumentError as e:
            self.check(lost is not None, f"tree call refused, the model keeps every key it needs: {e}")
            self.check("keep_mask" in str(e) and "new token" in str(e), f"tree call refused: {e}")
            self.stats["refused"]["tree"] = self.stats["refused"].get("tree", 0) + 1
            self.same_state(snap, "tree")
            return
        self.check(lost is None, f"tree call accepted, but storing it overwrites {lost}")
        if snap is not None:
            snap.close()
        L0 = [len(s) for s in self.model.seqs]
        want = self.expect(x, n_new, pos, trees=trees, wl=self.wl, chunk=self.chunk, masked_row=masked_row)
        self.compare(y, caps, want, n_new)
        self.check_lengths("tree")
        # keep a path (or any increasing subset, or nothing) of each sequence
        for b in range(B):
            if not n_new[b]:
                continue
            r = rng.random()
            if r < 0.6:
                node = int(rng.integers(0, n_new[b]))
                keep = [j for j in range(node + 1) if trees[b][node][j]]
            elif r < 0.85:
                keep = sorted(int(v) for v in rng.choice(n_new[b], int(rng.integers(0, n_new[b] + 1)),
                                                          replace=False))
            else:
                continue  # keep the whole call, as a chain
            self.compact(b, L0[b], keep)

    def tree_loses(self, trees, n_new):
        """None, or (sequence, new token, index) of a key a tree row attends
        that storing the call's later ring pieces overwrites before the row
        is attended (docs/CACHE.md: such a call is refused)."""
        m = self.model
        if not m.W:
            return None
        piece = m.cap - m.ns - m.W + 1
        for b in range(m.B):
            seq = m.seqs[b]
            L0, nb = len(seq), n_new[b]
            slots = dict(seq.slot)
            for t0 in range(0, nb, piece):
                t1 = min(t0 + piece, nb)
                for i in range(t0, t1):
                    slots[m.slot_of(L0 + i)] = L0 + i
                for i in range(t0, t1):
                    anc = [j for j in range(i + 1) if trees[b][i][j]]
                    rank = {L0 + j: L0 + r for r, j in enumerate(anc)}
                    tp = L0 + sum(1 for j in anc if j < i)
                    keys = [(j, j) for j in range(L0)] + [(L0 + j, rank[L0 + j]) for j in anc]
                    for j, jp in keys:
                        if m.ok(b, jp, tp, self.wl, self.chunk) and slots.get(m.slot_of(j)) != j:
                            if j < L0 and not m.stored(b, j):
                                self.fail(f"model: tree row {i} of sequence {b} needs {j}, evicted before")
                            return (b, i, j)
        return None

    def compact(self, b, first, keep):
        m = self.model
        seq = m.seqs[b]
        L = len(seq)
        ok = (not keep or all(m.stored(b, j) for j in range(max(first, m.ns), L))) and \
            m.rollback_ok(b, first + len(keep)) if first + len(keep) <= L else False
        self.note(f"compact:{b} first={first} keep={keep} of {L}{'' if ok else ' (refused)'}")
        try:
            self.cache.compact(b, first, keep)
        except mha.ArgumentError as e:
            self.check(not ok, f"compact refused, the model allows it: {e}")
            self.stats["refused"]["compact"] = self.stats["refused"].get("compact", 0) + 1
            self.check_lengths("refused compact")
            return
        self.check(ok, "compact accepted, the model refuses it")
        k = seq.k[:first] + [seq.k[first + i] for i in keep]
        v = seq.v[:first] + [seq.v[first + i] for i in keep]
        p = seq.pos[:first] + [seq.pos[first + i] for i in keep]
        seq.k, seq.v, seq.pos = k, v, p
        for i in range(len(keep)):
            seq.slot[m.slot_of(first + i)] = first + i
        self.nextpos[b] = seq.pos[-1] + 1 if seq.pos else 0
        self.check_lengths("compact")

    def op_compact(self):
        """mha_cache_compact anywhere: a random first and kept subset."""
        rng, m = self.rng, self.model
        b = int(rng.integers(0, m.B))
        L = len(m.seqs[b])
        first = int(rng.integers(max(0, L - 12) if rng.random() < 0.7 else 0, L + 1))
        n = L - first
        keep = sorted(int(v) for v in rng.choice(n, int(rng.integers(0, n + 1)), replace=False)) if n else []
        self.compact(b, first, keep)

    def op_append_attend(self):
        """The two halves: append given K/V, then attend given queries."""
        rng, m, o = self.rng, self.model, self.oracle
        B = m.B
        T = int(rng.integers(1, 4))
        piece = m.cap - m.ns - m.W + 1 if m.W else None
        if piece is not None:
            T = min(T, piece)
        if not self.room_for(T):
            return
        n_new = self.counts(T, B > 1 and rng.random() < 0.3)
        k = rng.normal(0, 1, (B, T, self.g * o.dk)).astype(np.float32)
        v = rng.normal(0, 1, (B, T, self.g * o.dv)).astype(np.float32)
        self.note(f"append:T={T} n={n_new}")
        self.cache.append(k, v, n_new=n_new)
        # the cache stores kv head g (current order) in original kv head cur_kv[g]
        rep = self.h // self.g
        cur_kv = [self.cur[gg * rep] // rep for gg in range(self.g)]
        for b in range(B):
            for i in range(n_new[b]):
                kk = np.zeros((self.g, o.dk))
                vv = np.zeros((self.g, o.dv))
                kk[cur_kv] = k[b, i].reshape(self.g, o.dk)
                vv[cur_kv] = v[b, i].reshape(self.g, o.dv)
                j = len(m.seqs[b])
                m.append(b, O.round_store(kk, m.kdt, o.dk), O.round_store(vv, m.vdt, o.dv), j)
            if n_new[b]:
                self.nextpos[b] = len(m.seqs[b])  # appended keys are stored at their cache positions
        self.check_lengths("append")
        # attend: queries at the last n of each sequence
        na = [int(rng.integers(0, min(len(s), T) + 1)) for s in m.seqs]
        if not any(na):
            return
        Ta = max(na)
        q = rng.normal(0, 1, (B, Ta, self.h * o.dk)).astype(np.float32)
        scale = float(rng.choice([0.0, 0.5]))
        ok = all(self.attend_ok(b, na[b]) for b in range(B))
        self.note(f"attend:n={na}{'' if ok else ' (refused)'}")
        try:
            z = self.cache.attend(q, n_new=na, scale=scale)
        except mha.ArgumentError as e:
            self.check(not ok, f"attend refused, the model allows it: {e}")
            return
        self.check(ok, "attend accepted, the model refuses it")
        want = np.zeros((B, Ta, self.h, o.dv))
        sc = scale if scale else 1.0 / math.sqrt(o.dk)
        kvmap = self.kvmap()
        for b in range(B):
            L = len(m.seqs[b])
            for i in range(na[b]):
                t = L - na[b] + i
                vis = [j for j in range(t + 1) if m.ok(b, j, t, None, 0)]
                zr, _, _ = o.attend_row(m.seqs[b], t, q[b, i].reshape(self.h, o.dk), vis, sc, plain=True,
                                        kvmap=kvmap)
                want[b, i] = zr
        self.err(z, want.reshape(B, Ta, -1), "attend z")

    def attend_ok(self, b, n):
        m = self.model
        L = len(m.seqs[b])
        if n == 0:
            return True
        need = m.next_needs(L - n)  # the first query's window
        return all(m.stored(b, j) for j in range(need, L))

    # ----------------------------------------------------- refused calls
    def expect_refusal(self, call, exc, what):
        snap = self.cache.copy()
        try:
            call()
        except exc:
            pass
        except mha.MhaError as e:
            self.fail(f"{what}: raised {type(e).__name__} ({e}); expected {exc.__name__}")
        else:
            self.fail(f"{what}: accepted; expected {exc.__name__}")
        self.stats["refused"][what] = self.stats["refused"].get(what, 0) + 1
        self.check_lengths(f"after {what}")
        self.same_state(snap, what)

    def same_state(self, snap, what, refused=True):
        """The next decode step gives the same bits on the cache and on a
        clone taken before the refused call (and the oracle checks it)."""
        what = f"a refused {what}" if refused else what
        m = self.model
        if not self.room_for(1):
            snap.close()
            return
        x = self.rng.normal(0, 1, (m.B, 1, self.cfg["d_model"])).astype(np.float32)
        pos = self.positions(m.B, 1, [1] * m.B)
        kw = dict(positions=pos) if self.explicit else {}
        if self.wl is not None:
            kw["window_left"] = self.wl
        if self.chunk:
            kw["chunk_size"] = self.chunk
        y0 = snap.forward(self.layer, x, **kw)
        snap.close()
        y = self.cache.forward(self.layer, x, **kw)
        self.check(np.array_equal(y, y0, equal_nan=True),
                   f"after {what}: the cache gives other bits than the one before it")
        want = self.expect(x, [1] * m.B, pos, wl=self.wl, chunk=self.chunk)
        self.compare(y, {}, want, [1] * m.B)
        for b in range(m.B):
            self.nextpos[b] = int(pos[b, 0]) + 1
        self.check_lengths(f"after {what}")

    def op_refused_capacity(self, T, n_new):
        x = self.rng.normal(0, 1, (self.model.B, T, self.cfg["d_model"])).astype(np.float32)
        self.note(f"refused:capacity T={T} n={n_new}")
        self.expect_refusal(lambda: self.cache.forward(self.layer, x, n_new=n_new), mha.ArgumentError, "capacity")

    def op_refused(self):
        rng, m = self.rng, self.model
        B, D = m.B, self.cfg["d_model"]
        kinds = ["nan", "truncate", "reorder", "n_new", "compact", "upper_tree", "fp16", "shape", "scores"]
        if m.ns:
            kinds.append("chunk_sinks")
        if m.W:
            kinds.append("append_ring")
        kind = str(rng.choice(kinds))
        T = int(rng.integers(1, 4))
        if kind not in ("truncate", "reorder", "compact", "append_ring") and not self.room_for(T):
            return  # a refusal for another reason than the one tested
        x = rng.normal(0, 1, (B, T, D)).astype(np.float32)
        self.note(f"refused:{kind}")
        if kind == "nan":
            b = int(rng.integers(0, B))
            x[b, int(rng.integers(0, T)), int(rng.integers(0, D))] = float(rng.choice([np.nan, np.inf]))
            self.expect_refusal(lambda: self.cache.forward(self.layer, x), mha.NonFiniteError, kind)
        elif kind == "truncate":
            b = int(rng.integers(0, B))
            n = int(rng.choice([-1, len(m.seqs[b]) + 1 + int(rng.integers(0, 3))]))
            self.expect_refusal(lambda: self.cache.truncate(b, n), mha.ArgumentError, kind)
        elif kind == "reorder":
            src = [int(v) for v in rng.integers(0, B, B)]
            src[int(rng.integers(0, B))] = int(rng.choice([-1, B]))
            self.expect_refusal(lambda: self.cache.reorder(src), mha.ArgumentError, kind)
        elif kind == "n_new":
            n = [int(rng.integers(0, T + 1)) for _ in range(B)]
            n[int(rng.integers(0, B))] = T + 1
            self.expect_refusal(lambda: self.cache.forward(self.layer, x, n_new=n), mha.ArgumentError, kind)
        elif kind == "compact":
            b = int(rng.integers(0, B))
            L = len(m.seqs[b])
            if L < 2:
                return
            first = int(rng.integers(0, L - 1))
            keep = [1, 0] if rng.random() < 0.5 else [L - first]
            self.expect_refusal(lambda: self.cache.compact(b, first, keep), mha.ArgumentError, kind)
        elif kind == "upper_tree":
            if T < 2:
                return
            mask = np.tril(np.ones((T, T), bool))
            i = int(rng.integers(0, T - 1))
            mask[i, int(rng.integers(i + 1, T))] = True
            self.expect_refusal(lambda: self.cache.forward(self.layer, x, keep_mask=mask), mha.ArgumentError, kind)
        elif kind == "fp16":
            if "float16" not in (m.kdt, m.vdt) or self.cfg.get("clip_qkv") or self.cfg.get("qk_norm", "none") != "none":
                return
            xb = x * np.float32(3e5)
            self.expect_refusal(lambda: self.cache.forward(self.layer, xb), mha.NonFiniteError, kind)
        elif kind == "shape":
            other = mha.Layer(d_model=D, n_heads=self.h, n_kv_heads=self.g, d_k=self.oracle.dk + 1,
                              d_v=self.oracle.dv)
            self.expect_refusal(lambda: self.cache.forward(other, x), mha.ShapeError, kind)
            other.close()
        elif kind == "scores":
            if self.cfg.get("clip_qkv") or self.cfg.get("qk_norm", "none") != "none" or self.cfg.get("softcap"):
                return
            xb = x * np.float32(1e18)
            self.expect_refusal(lambda: self.cache.forward(self.layer, xb), mha.NonFiniteError, kind)
        elif kind == "chunk_sinks":
            self.expect_refusal(lambda: self.cache.forward(self.layer, x, chunk_size=2), mha.ArgumentError, kind)
        elif kind == "append_ring":
            o = self.oracle
            n = m.cap - m.ns - m.W + 2
            k = rng.normal(0, 1, (B, n, self.g * o.dk)).astype(np.float32)
            v = rng.normal(0, 1, (B, n, self.g * o.dv)).astype(np.float32)
            self.expect_refusal(lambda: self.cache.append(k, v), mha.ArgumentError, kind)

    # --------------------------------------------------------------- run
    def run(self, tmp):
        kernels, threads = os.environ.get("MHA_KERNELS"), mha.get_num_threads()
        self.setup()
        rng = self.rng
        try:
            for step in range(self.steps):
                self.stats["steps"] += 1
                self.set_env()
                r = rng.random()
                empty = not any(self.model.lengths())
                if empty or r < 0.45:
                    self.op_forward()
                elif r < 0.55:
                    self.op_truncate()
                elif r < 0.58:
                    self.op_reset()
                elif r < 0.63:
                    self.op_reorder()
                elif r < 0.66:
                    self.op_clone()
                elif r < 0.68:
                    self.op_save_load(tmp)
                elif r < 0.72:
                    self.op_permute()
                elif r < 0.80:
                    self.op_tree()
                elif r < 0.84:
                    self.op_append_attend()
                elif r < 0.88:
                    self.op_compact()
                elif r < 0.90:
                    self.op_threads()
                else:
                    self.op_refused()
        finally:
            self.cache.close()
            self.layer.close()
            mha.set_num_threads(threads)
            if kernels is None:
                os.environ.pop("MHA_KERNELS", None)
            else:
                os.environ["MHA_KERNELS"] = kernels
        return self.stats


def perm_moves_kv(perm, h, g):
    rep = h // g
    return any(perm[gg * rep] // rep != gg for gg in range(g))


def walk(seed, steps, tmp, long_share=0.0):
    return Walk(seed, steps, long_share).run(tmp)


if __name__ == "__main__":
    import tempfile
    import time
    first, n_seeds = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (0, 50)
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    long_share = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    worst, ops, refused, t0, fails = {}, {}, {}, time.time(), 0
    with tempfile.TemporaryDirectory() as tmp:
        for s in range(first, first + n_seeds):
            try:
                st = walk(s, steps, tmp, long_share)
            except Exception as e:
                fails += 1
                print("FAIL", type(e).__name__, e, flush=True)
                continue
            for k, v in st["worst"].items():
                worst[k] = max(worst.get(k, 0.0), v)
            for k, v in st["ops"].items():
                ops[k] = ops.get(k, 0) + v
            for k, v in st["refused"].items():
                refused[k] = refused.get(k, 0) + v
    print(f"{n_seeds} seeds x {steps} steps, {fails} failed, {time.time() - t0:.0f} s")
    print("ops", ops)
    print("refused", refused)
    print("worst", {k: f"{v:.2e}" for k, v in sorted(worst.items())})
