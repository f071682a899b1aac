"""Train gated attention with attention dropout (Qwen3-Next's output gate,
nn.MultiheadAttention's dropout), forward and backward in libmha.

    python3 examples/train_gated_dropout.py    (from the repository, after `make lib`)

Task: copy the token of a random earlier position that the query names —
token t_i and a pointer p_i < i; predict t at position p_i. Model: token
and position embeddings, one causal mha.nn.Attention(output_gate=True,
dropout=0.1) with RoPE and RMS QK-norm (a Qwen3-Next attention layer), a
linear head. The same model is written a second time in plain PyTorch
(Qwen3NextAttention's math: q_proj holds each head's query then its gate,
torch's own dropout) from the same initial weights, and both are trained
on the same batches. Dropout draws differ between the two (the library's
draw is its own), so the curves are not compared step by step; the script
checks (exit 1 otherwise) that

* before training, in eval mode (no dropout), both give the same loss
  (within 1e-5): the same layer;
* after training, both reach an eval loss below LOSS_GOAL, and libmha's is
  within RATIO_LIMIT of torch's (dropout and the gate train the same way);
* in training mode libmha's dropout is real: two forwards of the same
  batch differ, and the same torch.manual_seed repeats one exactly.
"""
import copy
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mha.nn  # noqa: E402

VOCAB, T, E, HEADS, KV_HEADS = 12, 12, 32, 4, 2
BATCH, STEPS, LR, P_DROP = 64, 150, 1e-2, 0.1
LOSS_GOAL, RATIO_LIMIT = 0.25, 3.0
D = E // HEADS


class TorchGatedAttention(torch.nn.Module):
    """Qwen3NextAttention's attention in PyTorch, parameters named as
    mha.nn.Attention's: RMS q/k norm per head, rotate_half RoPE, GQA, causal,
    dropout on the probabilities, each head's output times sigmoid(gate)."""

    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(E, 2 * HEADS * D, bias=False)
        self.k_proj = torch.nn.Linear(E, KV_HEADS * D, bias=False)
        self.v_proj = torch.nn.Linear(E, KV_HEADS * D, bias=False)
        self.o_proj = torch.nn.Linear(HEADS * D, E, bias=False)
        self.q_norm, self.k_norm = torch.nn.Module(), torch.nn.Module()
        self.q_norm.weight = torch.nn.Parameter(torch.ones(D))
        self.k_norm.weight = torch.nn.Parameter(torch.ones(D))

    @staticmethod
    def rope(x):  # x (B,heads,T,D): pairs (i, i + D/2), theta 10000
        inv = 1.0 / 10000.0 ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
        f = torch.arange(x.shape[2], dtype=torch.float32)[:, None] * inv
        cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
        return x * cos + torch.cat((-x[..., D // 2:], x[..., :D // 2]), -1) * sin

    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def forward(self, x, causal=True):  # x (B,T,E) -> (B,T,E)
        B, n, _ = x.shape
        q, gate = self.q_proj(x).view(B, n, HEADS, 2 * D).chunk(2, dim=-1)  # (B,T,h,D) each
        k = self.k_proj(x).view(B, n, KV_HEADS, D).transpose(1, 2)
        v = self.v_proj(x).view(B, n, KV_HEADS, D).transpose(1, 2)
        q = self.rope(self.norm(q.transpose(1, 2), self.q_norm.weight))
        k = self.rope(self.norm(k, self.k_norm.weight))
        k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.nn.functional.dropout(s.softmax(-1), P_DROP, self.training)
        z = (p @ v).transpose(1, 2).reshape(B, n, HEADS * D)
        return self.o_proj(z * torch.sigmoid(gate.reshape(B, n, HEADS * D)))


class Pointer(torch.nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, E)
        self.ptr = torch.nn.Embedding(T, E)
        self.pos = torch.nn.Parameter(torch.randn(T, E) * 0.5)
        self.attn = attention
        self.head = torch.nn.Linear(E, VOCAB)

    def forward(self, tokens, pointers):  # (B,T), (B,T) -> logits (B,T,VOCAB)
        x = self.tok(tokens) + self.ptr(pointers) + self.pos
        return self.head(self.attn(x, causal=True))


def batch(gen):
    tokens = torch.randint(0, VOCAB, (BATCH, T), generator=gen)
    pointers = (torch.rand(BATCH, T, generator=gen) * torch.arange(1, T + 1)).long()  # p_i <= i
    return tokens, pointers, tokens.gather(1, pointers)


def loss_of(model, data):
    tokens, pointers, target = data
    return torch.nn.functional.cross_entropy(model(tokens, pointers).reshape(-1, VOCAB), target.reshape(-1))


def train(model, batches, seed):
    torch.manual_seed(seed)  # the dropout draws of this run
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    for data in batches:
        opt.zero_grad()
        loss_of(model, data).backward()
        opt.step()


def main():
    torch.manual_seed(0)
    ours = Pointer(mha.nn.Attention(E, HEADS, KV_HEADS, rope={"pairing": "halves", "theta": 10000.0},
                                    qk_norm="rms", output_gate=True, dropout=P_DROP))
    theirs = copy.deepcopy(ours)
    theirs.attn = TorchGatedAttention()
    theirs.load_state_dict(ours.state_dict())
    gen = torch.Generator().manual_seed(1)
    batches = [batch(gen) for _ in range(STEPS)]
    held_out = batch(gen)
    ours.eval(), theirs.eval()
    with torch.no_grad():
        before = (loss_of(ours, held_out).item(), loss_of(theirs, held_out).item())
    t0 = time.perf_counter()
    train(ours, batches, 2)
    t1 = time.perf_counter()
    train(theirs, batches, 2)
    t2 = time.perf_counter()
    ours.eval(), theirs.eval()
    with torch.no_grad():
        after = (loss_of(ours, held_out).item(), loss_of(theirs, held_out).item())
        ours.train()
        torch.manual_seed(3)
        y1 = loss_of(ours, held_out).item()
        torch.manual_seed(3)
        y2 = loss_of(ours, held_out).item()
        y3 = loss_of(ours, held_out).item()
    print(f"eval loss before: libmha {before[0]:.5f}  torch {before[1]:.5f}")
    print(f"eval loss after {STEPS} steps with dropout {P_DROP}: libmha {after[0]:.4f}  torch {after[1]:.4f}")
    print(f"time: libmha {t1 - t0:.2f} s, torch {t2 - t1:.2f} s")
    fails = []
    if abs(before[0] - before[1]) > 1e-5 * max(1.0, before[1]):
        fails.append(f"the two layers differ before training: {before[0]:.6f} against {before[1]:.6f}")
    if not (after[0] < LOSS_GOAL and after[1] < LOSS_GOAL):
        fails.append(f"eval loss after training {after[0]:.4f} / {after[1]:.4f}; expected both < {LOSS_GOAL}")
    if not after[0] < RATIO_LIMIT * max(after[1], 1e-3):
        fails.append(f"libmha's eval loss {after[0]:.4f} is beyond {RATIO_LIMIT}x torch's {after[1]:.4f}")
    if not (y1 == y2 and y1 != y3):
        fails.append(f"training-mode losses {y1}, {y2} (same seed), {y3} (next draw): dropout is not seeded or "
                     "not drawn")
    for f in fails:
        print("FAIL:", f)
    if fails:
        sys.exit(1)
    print("ok: the same layer before training; both train under dropout to an eval loss below "
          f"{LOSS_GOAL}; the draw is seeded")


if __name__ == "__main__":
    main()
