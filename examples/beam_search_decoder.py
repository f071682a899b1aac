#!/usr/bin/python3
"""beam_search_decoder.py — an encoder-decoder's decoder layer, decoded by
beam search twice: by PyTorch, recomputing every beam's whole prefix with
torch.nn.MultiheadAttention at each step (self-attention, causal, and
cross-attention over the encoder's output), and by libmha with two caches:
mha.Cache for the self-attention (Cache.reorder follows the beams) and
mha.Cache(cross=True) holding the encoder output's K and V, projected once
(set_memory). The beams, their tokens and scores must agree.

    /usr/bin/python3 examples/beam_search_decoder.py
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mha  # noqa: E402

D, H, VOCAB, S, BEAMS, STEPS, BOS = 32, 4, 24, 12, 4, 10, 0
REORDERS = []  # every step's beam_idx, both searches


def model(seed=0):
    torch.manual_seed(seed)
    self_attn = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
    cross_attn = torch.nn.MultiheadAttention(D, H, batch_first=True).eval()
    with torch.no_grad():  # weights large enough that attention decides the next token
        for p in list(self_attn.parameters()) + list(cross_attn.parameters()):
            p.uniform_(-0.6, 0.6)
    emb = torch.randn(VOCAB, D) * 0.5
    memory = torch.randn(1, S, D) * 2  # what an encoder would give for one input
    return self_attn, cross_attn, emb, memory


def positions(t):
    """Sinusoidal embeddings (t, D) of positions 0..t-1 (added to the tokens)."""
    p = torch.arange(t, dtype=torch.float32)[:, None]
    f = torch.exp(-np.log(1e4) * torch.arange(0, D, 2, dtype=torch.float32) / D)
    return torch.cat([torch.sin(p * f), torch.cos(p * f)], dim=1)


def beam_search(next_logprobs, reorder):
    """Plain beam search: BEAMS hypotheses from BOS; next_logprobs(tokens
    (BEAMS, t), every beam's tokens so far) -> (BEAMS, VOCAB) log
    probabilities of the next; reorder(beam_idx) after each selection.
    Returns the beams' tokens and scores, best first."""
    tokens = np.full((BEAMS, 1), BOS)
    scores = np.array([0.0] + [-np.inf] * (BEAMS - 1))  # the first step expands beam 0 only
    for _ in range(STEPS):
        lp = next_logprobs(tokens) + scores[:, None]  # (BEAMS, VOCAB)
        best = np.argsort(-lp, axis=None, kind="stable")[:BEAMS]
        beam_idx, tok = best // VOCAB, best % VOCAB
        reorder(beam_idx)
        REORDERS.append(beam_idx.tolist())
        tokens = np.concatenate([tokens[beam_idx], tok[:, None]], axis=1)
        scores = lp[beam_idx, tok]
    return tokens, scores


def torch_decoder(self_attn, cross_attn, emb, memory):
    """Every step recomputes each beam's whole prefix (nn.MultiheadAttention
    keeps no cache; the cross-attention projects the memory again)."""
    def next_logprobs(tokens):
        t = tokens.shape[1]
        x = emb[torch.from_numpy(tokens)] + positions(t)  # (BEAMS, t, D)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        with torch.no_grad():
            h = x + self_attn(x, x, x, attn_mask=causal, need_weights=False)[0]
            mem = memory.expand(BEAMS, -1, -1)
            h = h + cross_attn(h, mem, mem, need_weights=False)[0]
            return torch.log_softmax(h[:, -1] @ emb.T * 2, dim=-1).double().numpy()

    return next_logprobs, lambda beam_idx: None  # nothing kept between steps


def mha_decoder(self_attn, cross_attn, emb, memory):
    """One token per beam and step: the self-attention cache grows by one,
    the cross-attention memory is attended as projected once."""
    sd = lambda m: {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}  # noqa: E731
    self_layer = mha.from_torch_state_dict(sd(self_attn), num_heads=H, batch_first=True)
    cross_layer = mha.from_torch_state_dict(sd(cross_attn), num_heads=H, batch_first=True)
    cache = mha.Cache(self_layer, batch=BEAMS, capacity=STEPS + 1)
    mem = mha.Cache(cross_layer, batch=BEAMS, capacity=S, cross=True)
    mem.set_memory(np.repeat(memory.numpy(), BEAMS, axis=0))
    e, pos = emb.numpy(), positions(STEPS + 1).numpy()

    def next_logprobs(tokens):
        t = tokens.shape[1] - 1  # the last token's position; the cache holds the ones before
        assert cache.lengths() == [t] * BEAMS
        x = (e[tokens[:, -1]] + pos[t])[:, None, :].astype(np.float32)  # (BEAMS, 1, D)
        h = x + cache.forward(self_layer, x)
        h = h + mem.forward(cross_layer, h)
        logits = torch.from_numpy(h[:, 0] @ e.T * 2)
        return torch.log_softmax(logits, dim=-1).double().numpy()

    # the beams of one input share its memory: only the self-attention cache
    # follows them (a batch of inputs would reorder the memory too, whose rows
    # then move as the beams do)
    return next_logprobs, cache.reorder


def main():
    parts = model()
    want_tokens, want_scores = beam_search(*torch_decoder(*parts))
    got_tokens, got_scores = beam_search(*mha_decoder(*parts))
    print("beam | torch tokens (score)          | mha tokens (score)")
    for b in range(BEAMS):
        print(f"{b}    | {want_tokens[b].tolist()} ({want_scores[b]:.5f}) | {got_tokens[b].tolist()} ({got_scores[b]:.5f})")
    assert (got_tokens == want_tokens).all(), "the beams differ"
    moved = sum(r != sorted(r) or len(set(r)) < BEAMS for r in REORDERS[STEPS + 1:])
    assert moved, "no step reordered the beams: the example would not show Cache.reorder at work"
    print(f"{moved} of {STEPS - 1} steps after the first reordered the beams (repeats or swaps)")
    err = float(np.abs(got_scores - want_scores).max())
    assert err < 1e-4, f"scores differ by {err:.3g}"
    print(f"beam_search_decoder: {BEAMS} beams x {STEPS} steps agree with torch (scores within {err:.1e})")


if __name__ == "__main__":
    main()
