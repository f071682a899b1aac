"""A training step of today's attention layer: mha.nn.Attention (libmha's
forward and fast backward through the tape) against the same layer written
in PyTorch the way the model families write it (Hugging Face Llama / Qwen 3
style: nn.Linear projections, RMS QK-norm of each head, rotate_half RoPE,
GQA by repeat_interleave, a causal mask, matmul-softmax-matmul), fp32,
the same weights and inputs. Checks that both give the same y and
gradients (max error relative to the largest value <= 1e-4), then times
forward + backward of <dy, y>, the two implementations alternating round by
round, and prints one RESULT line each and their ratio.

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/nn_modern_step.py [--B 4 --T 512 --d 768 --h 12 --h-kv 4]
                                                                [--rounds 7] [--threads 2] [--gate 1]

--gate 1: gated attention as Qwen3NextAttention writes it (q_proj gives
each head's query then its gate; Z * sigmoid(gate) before o_proj).
--dropout p: attention dropout in training mode on both sides (torch's
F.dropout on the probabilities; the library's own seeded draw): the two
draw different entries, so the same-numbers check runs in eval mode.

torch 1.13 has no fused attention for this layer on the CPU, so the torch
side is what a model's own attention module runs. Legend: B batch, T
tokens, d d_model, h heads, h_kv kv heads, hd = d / h.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import mha.nn  # noqa: E402


class TorchAttention(torch.nn.Module):
    """The layer in plain PyTorch, parameters named as mha.nn.Attention's."""

    def __init__(self, d, h, h_kv, theta, eps, gate, dropout):
        super().__init__()
        hd = d // h
        self.h, self.h_kv, self.hd, self.theta, self.eps, self.gate = h, h_kv, hd, theta, eps, gate
        self.dropout = dropout
        self.q_proj = torch.nn.Linear(d, (2 if gate else 1) * h * hd, bias=False)
        self.k_proj = torch.nn.Linear(d, h_kv * hd, bias=False)
        self.v_proj = torch.nn.Linear(d, h_kv * hd, bias=False)
        self.o_proj = torch.nn.Linear(h * hd, d, bias=False)
        self.q_norm = torch.nn.Module()
        self.q_norm.weight = torch.nn.Parameter(torch.ones(hd))
        self.k_norm = torch.nn.Module()
        self.k_norm.weight = torch.nn.Parameter(torch.ones(hd))

    def rope(self, x):  # x (B,heads,T,hd): rotate_half pairs (i, i + hd/2)
        T, hd = x.shape[2], self.hd
        inv = 1.0 / self.theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        f = torch.arange(T, dtype=torch.float32)[:, None] * inv  # (T, hd/2)
        cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
        rot = torch.cat((-x[..., hd // 2:], x[..., : hd // 2]), -1)
        return x * cos + rot * sin

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def forward(self, x):  # x (B,T,d) -> (B,T,d)
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, -1)  # (B,T,h,hd), or (B,T,h,2hd): query then gate
        if self.gate:
            q, g = q.chunk(2, dim=-1)
            g = g.reshape(B, T, self.h * self.hd)  # (B,T,h*hd) the gate's logits
        q = q.transpose(1, 2)  # (B,h,T,hd)
        k = self.k_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)  # (B,h_kv,T,hd)
        v = self.v_proj(x).view(B, T, self.h_kv, self.hd).transpose(1, 2)
        q, k = self.rope(self.norm(q, self.q_norm.weight)), self.rope(self.norm(k, self.k_norm.weight))
        rep = self.h // self.h_kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        s = q @ k.transpose(-1, -2) / self.hd ** 0.5  # (B,h,T,T)
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        p = torch.nn.functional.dropout(s.softmax(-1), self.dropout, self.training)
        z = (p @ v).transpose(1, 2).reshape(B, T, self.h * self.hd)
        return self.o_proj(z * torch.sigmoid(g) if self.gate else z)


def step(m, x, dy):
    """forward + backward of <dy, y>; y and the gradients."""
    m.zero_grad(set_to_none=True)
    x.grad = None
    y = m(x, causal=True) if isinstance(m, mha.nn.Attention) else m(x)
    (y * dy).sum().backward()
    return y.detach(), [x.grad] + [p.grad for _, p in sorted(m.named_parameters())]


def main():
    ap = argparse.ArgumentParser()
    for name, v in (("B", 4), ("T", 512), ("d", 768), ("h", 12), ("h-kv", 4), ("rounds", 7), ("threads", 2),
                    ("gate", 0)):
        ap.add_argument("--" + name, type=int, default=v)
    ap.add_argument("--dropout", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    theta, eps = 10000.0, 1e-6
    ref = TorchAttention(a.d, a.h, a.h_kv, theta, eps, a.gate, a.dropout)
    with torch.no_grad():
        ref.q_norm.weight.uniform_(0.5, 1.5), ref.k_norm.weight.uniform_(0.5, 1.5)
    ours = mha.nn.Attention(a.d, a.h, a.h_kv, rope=dict(pairing="halves", theta=theta), qk_norm="rms",
                            qk_norm_eps=eps, output_gate=bool(a.gate), dropout=a.dropout)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(a.B, a.T, a.d, requires_grad=True)
    dy = torch.randn(a.B, a.T, a.d)
    # --- the same numbers first (in eval mode: no dropout, whose draws differ)
    ref.eval(), ours.eval()
    (y0, g0), (y1, g1) = step(ref, x, dy), step(ours, x, dy)
    ref.train(), ours.train()
    errs = [(float((p - q).abs().max()) / max(float(p.abs().max()), 1e-30)) for p, q in zip([y0] + g0, [y1] + g1)]
    if max(errs) > 1e-4:
        sys.exit(f"nn_modern_step: mha.nn.Attention and the torch layer differ (worst relative {max(errs):.3g})")
    # --- timed rounds, alternating
    t = {"torch": [], "mha": []}
    for _ in range(a.rounds):
        for name, m in (("torch", ref), ("mha", ours)):
            t0 = time.perf_counter()
            step(m, x, dy)
            t[name].append(time.perf_counter() - t0)
    shape = (f"B={a.B} T={a.T} d_model={a.d} h={a.h} h_kv={a.h_kv} threads={a.threads} gate={a.gate} "
             f"dropout={a.dropout}")
    for name in t:
        print(f"RESULT kind=nn_modern_step impl={name} {shape} median_s={statistics.median(t[name]):.6f} "
              f"min_s={min(t[name]):.6f} runs={a.rounds}")
    print(f"mha.nn.Attention vs torch (forward + backward, RoPE + RMS QK-norm + GQA{' + output gate' * a.gate}"
          f"{f' + dropout {a.dropout}' * (a.dropout > 0)}, causal): "
          f"{statistics.median(t['torch']) / statistics.median(t['mha']):.2f}x (median), "
          f"{min(t['torch']) / min(t['mha']):.2f}x (min); worst relative difference {max(errs):.2g}")


if __name__ == "__main__":
    main()
