#!/usr/bin/python3
"""tree_speculative_decoding.py — greedy decoding of a toy one-layer
language model (token embeddings, one RoPE attention layer with GQA, a
residual and a readout), done twice:

- plainly: at every step the whole sequence recomputed by Layer.forward
  (causal, no cache): the oracle;
- by tree speculative decoding (Medusa / EAGLE / SpecInfer style): a draft
  model (the same layer with perturbed weights) proposes a small tree of
  next tokens; the target verifies the whole tree in ONE cached call
  (Cache.forward with keep_mask: each draft sees the cache and its own
  ancestors, positions at the tree's depths); the longest path the target
  agrees with is kept (Cache.compact) and the target's own next token is
  taken after it.

The two token sequences must be identical; the example prints how many
target calls the tree needed against one per token, and fails if no
verification accepted a draft or if no compaction had to move a token (so
both features are really exercised).

    /usr/bin/python3 examples/tree_speculative_decoding.py
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mha  # noqa: E402

D, H, H_KV, VOCAB, PROMPT, NEW = 64, 8, 2, 40, 6, 40


def make_layer(rng, base=None, noise=0.0):
    layer = mha.Layer(D, H, n_kv_heads=H_KV, rope={"pairing": "halves"}, bias=False)
    if base is None:
        w = {n: rng.uniform(-5.0, 5.0, s).astype(np.float32) / np.sqrt(s[0])
             for n, s in mha.Layer._weight_shapes(type("C", (), layer.config)).items() if n.startswith("w_")}
    else:
        w = {n: (a + noise * rng.standard_normal(a.shape) / np.sqrt(a.shape[0])).astype(np.float32)
             for n, a in base.items()}
    layer.set_weights(w)
    return layer, w


rng = np.random.default_rng(1)
target, w_target = make_layer(rng)
draft, _ = make_layer(rng, w_target, noise=0.3)  # a cheaper model would do; this one is merely wrong sometimes
emb = rng.standard_normal((VOCAB, D)).astype(np.float32)
readout = (rng.standard_normal((D, VOCAB)) / np.sqrt(D)).astype(np.float32)


def logits(layer, tokens):
    """Next-token logits after every prefix of tokens, no cache: (len, VOCAB)."""
    x = emb[tokens][None]
    return ((x + layer.forward(x, causal=True)) @ readout)[0]


prompt = list(rng.integers(0, VOCAB, PROMPT))

# --- the oracle: plain greedy decoding, the whole sequence recomputed each step
plain = list(prompt)
for _ in range(NEW):
    plain.append(int(np.argmax(logits(target, plain)[-1])))

# --- tree speculative decoding
def draft_tree(seq):
    """A tree over the pending token seq[-1] (node 0): the draft's two best
    children, two grandchildren under the first, one more under the first
    of those. Returns tokens and parents (parents first)."""
    tokens, parents = [seq[-1]], [-1]

    def best(path, k):
        return list(np.argsort(-logits(draft, seq + path)[-1])[:k])

    c = best([], 2)
    tokens += c
    parents += [0, 0]
    g = best([c[0]], 2)
    tokens += g
    parents += [1, 1]
    tokens.append(best([c[0], g[0]], 1)[0])
    parents.append(3)
    return [int(t) for t in tokens], parents


def tree_mask(parents):
    n = len(parents)
    m = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            m[i, j], j = True, parents[j]
    return m


def depth(parents, i):
    return int(tree_mask(parents)[i].sum()) - 1


cache = mha.Cache(target, capacity=PROMPT + NEW + 8)
x = emb[prompt[:-1]]
cache.forward(x)  # everything but the pending token
seq, calls, accepted_drafts, moved, siblings = list(prompt), 0, 0, 0, 0
while len(seq) < PROMPT + NEW:
    base = cache.length(0)  # = len(seq) - 1: the pending token seq[-1] is not cached yet
    tokens, parents = draft_tree(seq)
    pos = np.array([base + depth(parents, i) for i in range(len(tokens))], dtype=np.int32)
    xt = emb[tokens]
    out = (xt + cache.forward(xt, keep_mask=tree_mask(parents), positions=pos)) @ readout  # one target call
    calls += 1
    path, node = [0], 0
    while True:  # follow the children the target agrees with
        want = int(np.argmax(out[node]))
        kids = [i for i, p in enumerate(parents) if p == node and tokens[i] == want]
        if not kids or len(seq) + len(path) > PROMPT + NEW:
            break
        node = kids[0]
        path.append(node)
    cache.compact(0, base, path)  # the accepted path at positions base, base+1, ...
    moved += path != list(range(len(path)))
    siblings += any(i in (2, 4) for i in path)  # a draft's second choice was right
    accepted_drafts += len(path) - 1
    seq += [tokens[i] for i in path[1:]] + [int(np.argmax(out[node]))]
seq = seq[:PROMPT + NEW]

print(f"greedy tokens  {plain[PROMPT:]}")
print(f"tree decoding  {seq[PROMPT:]}")
print(f"{NEW} tokens in {calls} target calls ({NEW / calls:.2f} tokens per call), "
      f"{accepted_drafts} drafts accepted, {moved} compactions moved tokens, {siblings} paths through a "
      f"second choice")
assert seq == plain, "tree speculative decoding must give exactly the greedy tokens"
assert accepted_drafts > 0, "no draft was ever accepted: the tree was not exercised"
assert moved > 0, "no compaction moved a token: pick another seed"
assert siblings > 0, "no path went through a second choice: the tree was no better than a chain"
print("ok: identical to plain greedy decoding")
