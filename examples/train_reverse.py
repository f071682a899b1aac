"""Train a tiny model to reverse a sequence, with libmha's attention layer.

    python3 examples/train_reverse.py          (from the repository, after `make lib`)

Model: token embedding + learned position embedding -> one
mha.nn.MultiheadAttention (self-attention, forward and backward in libmha)
-> a linear head giving each position's token. Reversing needs exactly what
attention does: position i must read the token at position T-1-i.

The same model is built a second time with torch.nn.MultiheadAttention from
the same initial weights and trained on the same batches with the same
optimizer. The script checks (exit 1 otherwise) that the two loss curves
agree within LOSS_RTOL for the first FOLLOW_STEPS steps (they drift apart
later only through fp32 rounding, amplified by training), and that
libmha's model gets its final loss below LOSS_GOAL.
"""
import copy
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mha.nn  # noqa: E402

VOCAB, T, E, HEADS = 10, 8, 32, 4
BATCH, STEPS, LR = 64, 60, 1e-2
FOLLOW_STEPS, LOSS_RTOL = 30, 1e-3
LOSS_GOAL = 0.05


class Reverser(torch.nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, E)
        self.pos = torch.nn.Parameter(torch.randn(T, E) * 0.5)
        self.attn = attention
        self.head = torch.nn.Linear(E, VOCAB)

    def forward(self, tokens):  # tokens (B,T) -> logits (B,T,VOCAB)
        x = self.tok(tokens) + self.pos
        y, _ = self.attn(x, x, x, need_weights=False)
        return self.head(y)


def train(model, batches):
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for tokens in batches:
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens.flip(1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    torch.manual_seed(0)
    ours = Reverser(mha.nn.MultiheadAttention(E, HEADS, batch_first=True))
    theirs = copy.deepcopy(ours)
    theirs.attn = torch.nn.MultiheadAttention(E, HEADS, batch_first=True)
    theirs.load_state_dict(ours.state_dict())  # identical initial weights, torch's layer
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, VOCAB, (BATCH, T), generator=gen) for _ in range(STEPS)]

    t0 = time.time()
    l_ours = train(ours, batches)
    t1 = time.time()
    l_theirs = train(theirs, batches)
    t2 = time.time()
    for s in list(range(0, STEPS, 10)) + [STEPS - 1]:
        print(f"step {s:4d}  loss libmha {l_ours[s]:.5f}  torch {l_theirs[s]:.5f}")
    print(f"time: libmha {t1 - t0:.2f} s, torch {t2 - t1:.2f} s ({STEPS} steps)")

    worst = max(abs(a - b) / abs(b) for a, b in zip(l_ours[:FOLLOW_STEPS], l_theirs[:FOLLOW_STEPS]))
    ok = True
    if not worst <= LOSS_RTOL:
        print(f"FAIL: the loss curves differ by {worst:.3g} (relative) in the first {FOLLOW_STEPS} "
              f"steps; expected <= {LOSS_RTOL}")
        ok = False
    if not l_ours[-1] < LOSS_GOAL:
        print(f"FAIL: final loss {l_ours[-1]:.4f}; expected < {LOSS_GOAL}")
        ok = False
    if ok:
        print(f"ok: curves agree within {worst:.2g} (relative) for {FOLLOW_STEPS} steps; "
              f"final loss {l_ours[-1]:.4f} < {LOSS_GOAL}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
