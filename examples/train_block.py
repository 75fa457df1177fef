"""Training with flashjit's attention: a small causal transformer block learns to continue
repeated phrases, once with flashjit.torch.scaled_dot_product_attention and once with
PyTorch's, from the same seed and data; the loss curves are printed side by side. The
dtype's noise is measured, not assumed: a third run uses another of PyTorch's attention kernels
(memory-efficient; math on the CPU), and flashjit's curve must stay as close to SDPA's default
as that one does (mean absolute difference of the losses at most twice the kernels' own, plus
1e-3). The exit status says whether it did.

    python examples/train_block.py [--steps 300] [--device cuda] [--dtype bf16]
    (flashjit importable: pip install . , or PYTHONPATH=python with FLASHJIT_LIB)"""
import argparse

import torch
import torch.nn.functional as F

import flashjit.torch as fjt

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--dim", type=int, default=256)
ap.add_argument("--heads", type=int, default=4)
ap.add_argument("--kv-heads", type=int, default=2)
args = ap.parse_args()
dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
VOCAB = 512


class Block(torch.nn.Module):
    """Token and position embeddings, one pre-norm attention + MLP block with grouped-query
    heads, and a head."""

    def __init__(self, attention):
        super().__init__()
        d, self.h, self.hkv = args.dim, args.heads, args.kv_heads
        self.attention = attention
        self.embed = torch.nn.Embedding(VOCAB, d)
        self.pos = torch.nn.Embedding(args.seq, d)
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q = torch.nn.Linear(d, d)
        self.kv = torch.nn.Linear(d, 2 * d // self.h * self.hkv)
        self.o = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                       torch.nn.Linear(4 * d, d))
        self.out = torch.nn.Linear(d, VOCAB)

    def forward(self, tokens):
        b, s = tokens.shape
        x = self.embed(tokens) + self.pos(torch.arange(s, device=tokens.device))
        y = self.norm1(x)
        q = self.q(y).view(b, s, self.h, -1).transpose(1, 2)
        k, v = self.kv(y).view(b, s, 2, self.hkv, -1).permute(2, 0, 3, 1, 4)
        a = self.attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, -1))
        x = x + self.mlp(self.norm2(x))
        return self.out(x)


def train(attention):
    torch.manual_seed(0)
    model = Block(attention).to(args.device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    bank = torch.randint(0, VOCAB, (64, 16), generator=data)  # phrases to learn
    losses = []
    for _ in range(args.steps):
        # Each sequence repeats one phrase of the bank.
        phrase = bank[torch.randint(0, len(bank), (args.batch,), generator=data)]
        tokens = phrase.repeat(1, args.seq // 16 + 1)[:, :args.seq + 1].to(args.device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def other_sdpa(q, k, v, **kw):
    """PyTorch's attention on another of its kernels: the noise between two exact kernels."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = SDPBackend.EFFICIENT_ATTENTION if q.is_cuda else SDPBackend.MATH
    if kw.pop("enable_gqa", False):  # that kernel takes no grouped heads: repeat them
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def mean_gap(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


ours = train(fjt.scaled_dot_product_attention)
theirs = train(F.scaled_dot_product_attention)
other = train(other_sdpa)
print(f"{'step':>5} {'flashjit':>9} {'sdpa':>9} {'sdpa-2':>9}")
for i in list(range(0, args.steps, max(args.steps // 15, 1))) + [args.steps - 1]:
    print(f"{i:5d} {ours[i]:9.4f} {theirs[i]:9.4f} {other[i]:9.4f}")
gap, noise = mean_gap(ours, theirs), mean_gap(other, theirs)
ok = gap <= 2 * noise + 1e-3
print(f"mean |loss difference| from SDPA: flashjit {gap:.4g}, SDPA's other kernel {noise:.4g} "
      f"(first {ours[0]:.3f}, last {ours[-1]:.3f} vs {theirs[-1]:.3f}): "
      f"{'agree' if ok else 'DIFFER'}")
raise SystemExit(0 if ok else 1)
