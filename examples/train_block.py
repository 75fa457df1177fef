"""Training with flashjit's attention: a small causal transformer block learns to continue
repeated phrases with flashjit.torch.scaled_dot_product_attention and with each of PyTorch's
attention kernels that run here (flash, memory-efficient, cuDNN, math), from the same seed and
data; the loss curves are printed side by side. The dtype's noise is measured, not assumed: two
exact kernels' curves drift apart in bf16 (rounding, amplified by the optimiser), so the
yardstick is how far PyTorch's kernels lie from each other. A kernel's distance is the mean,
over the other PyTorch kernels, of the mean absolute difference of the losses; flashjit's must
be at most twice the largest of theirs (as FlashAttention's tests allow twice a plain
implementation's error). The exit status says whether it was.

    python examples/train_block.py [--steps 300] [--device cuda] [--dtype bf16]
    (flashjit importable: pip install . , or PYTHONPATH=python with FLASHJIT_LIB)"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

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


def sdpa_on(backend):
    """PyTorch's attention on one of its kernels; grouped heads are repeated for the kernels
    that take none (the same attention)."""

    def attention(q, k, v, **kw):
        if kw.pop("enable_gqa", False) and k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, **kw)
    return attention


def mean_gap(a, b):
    return sum(abs(x - y) for x, y in zip(a, b)) / len(a)


runs = {"flashjit": train(fjt.scaled_dot_product_attention)}
for name, backend in {"flash": SDPBackend.FLASH_ATTENTION,
                      "efficient": SDPBackend.EFFICIENT_ATTENTION,
                      "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}.items():
    try:
        runs[name] = train(sdpa_on(backend))
    except RuntimeError as e:  # the kernel does not run on this device or dtype
        print(f"{name}: not run ({str(e).splitlines()[0][:70]})")
peers = [n for n in runs if n != "flashjit"]
if len(peers) < 2:
    raise SystemExit("fewer than two of PyTorch's kernels ran: no measure of the noise")

print(f"{'step':>5}" + "".join(f" {n:>9}" for n in runs))
for i in list(range(0, args.steps, max(args.steps // 15, 1))) + [args.steps - 1]:
    print(f"{i:5d}" + "".join(f" {runs[n][i]:9.4f}" for n in runs))


def distance(name):
    """The mean, over PyTorch's kernels other than `name`, of the mean |loss difference|."""
    others = [p for p in peers if p != name]
    return sum(mean_gap(runs[name], runs[p]) for p in others) / len(others)


noise = max(distance(p) for p in peers)
ours = distance("flashjit")
ok = ours <= 2 * noise
print("distance from PyTorch's kernels: " +
      ", ".join(f"{n} {distance(n):.4g}" for n in runs) +
      f"; flashjit {ours:.4g} against twice the largest of PyTorch's ({2 * noise:.4g}): "
      f"{'agree' if ok else 'DIFFER'}")
raise SystemExit(0 if ok else 1)
