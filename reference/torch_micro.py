#!/usr/bin/env python3
"""A compact PyTorch replica of dpcap's `micro` captioner training step: a timing reference.

Same shapes as CaptionerConfig::named("micro") (image 32, patch 8, encoder width 64, depth 2,
2 heads; decoder width 64, depth 1, 2 heads; vocab 256, seq 12), the same init (Linear and
embedding/position weights N(0, 0.02), biases 0, LayerNorm 1/0), AdamW (beta 0.9/0.95,
eps 1e-8, decoupled weight decay 0.005) with linear warmup then cosine decay to 0, on random
synthetic batches (N(0,1) images, captions as CaptionBatch::random builds them).

--mode dp: per-example gradients via torch.func (vmap of grad), clipping to C = 1, Gaussian
noise sigma*C on the sum, division by the expected batch size L (= --batch).
--mode plain: ordinary mean-loss backward.

Prints seconds per step (after --warmup untimed steps). Nothing here is checked against the
Rust code; it exists for side-by-side timings (docs/coordinator.md, session 4).

    python reference/torch_micro.py --mode dp --batch 1500 --steps 5
"""

import argparse
import math
import time

import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

IMAGE, PATCH, WIDTH, DEPTH, HEADS = 32, 8, 64, 2, 2
DEC_WIDTH, DEC_DEPTH, DEC_HEADS, VOCAB, SEQ = 64, 1, 2, 256, 12
INIT_STD, LN_EPS, PAD = 0.02, 1e-5, 0


class Attention(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.heads = heads

    def forward(self, x, memory=None, causal=False):
        b, t, d = x.shape
        memory = x if memory is None else memory
        split = lambda y: y.reshape(b, y.shape[1], self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(memory)), split(self.v(memory))
        # Explicit attention: SDPA has no vmap batching rule on CPU (a per-example loop).
        scores = q @ k.transpose(2, 3) / math.sqrt(d // self.heads)
        if causal:
            t, s = scores.shape[-2:]
            scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1), float("-inf"))
        out = scores.softmax(-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, t, d))


class Block(torch.nn.Module):
    def __init__(self, d, heads, decoder):
        super().__init__()
        self.ln1, self.attn = torch.nn.LayerNorm(d, eps=LN_EPS), Attention(d, heads)
        self.decoder = decoder
        if decoder:
            self.ln_cross, self.cross = torch.nn.LayerNorm(d, eps=LN_EPS), Attention(d, heads)
        self.ln2 = torch.nn.LayerNorm(d, eps=LN_EPS)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x, memory=None):
        x = x + self.attn(self.ln1(x), causal=self.decoder)
        if self.decoder:
            x = x + self.cross(self.ln_cross(x), memory)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Captioner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        n = (IMAGE // PATCH) ** 2
        self.patch_embed = torch.nn.Linear(3 * PATCH * PATCH, WIDTH)
        self.enc_pos = torch.nn.Parameter(torch.randn(n, WIDTH) * INIT_STD)
        self.enc_blocks = torch.nn.ModuleList(Block(WIDTH, HEADS, False) for _ in range(DEPTH))
        self.enc_norm = torch.nn.LayerNorm(WIDTH, eps=LN_EPS)
        self.bridge = torch.nn.Linear(WIDTH, DEC_WIDTH)
        self.token_embed = torch.nn.Parameter(torch.randn(VOCAB, DEC_WIDTH) * INIT_STD)
        self.dec_pos = torch.nn.Parameter(torch.randn(SEQ - 1, DEC_WIDTH) * INIT_STD)
        self.dec_blocks = torch.nn.ModuleList(Block(DEC_WIDTH, DEC_HEADS, True) for _ in range(DEC_DEPTH))
        self.dec_norm = torch.nn.LayerNorm(DEC_WIDTH, eps=LN_EPS)
        self.head = torch.nn.Linear(DEC_WIDTH, VOCAB)
        for m in self.modules():
            if isinstance(m, torch.nn.Linear):
                torch.nn.init.normal_(m.weight, std=INIT_STD)
                torch.nn.init.zeros_(m.bias)

    def losses(self, images, tokens):
        """Per-example mean token cross-entropy over non-PAD targets."""
        b, c, h, w = images.shape
        g = h // PATCH
        patches = images.reshape(b, c, g, PATCH, g, PATCH).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, -1)
        x = self.patch_embed(patches) + self.enc_pos
        for blk in self.enc_blocks:
            x = blk(x)
        memory = self.bridge(self.enc_norm(x))
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        y = self.token_embed[inputs] + self.dec_pos
        for blk in self.dec_blocks:
            y = blk(y, memory)
        logits = self.head(self.dec_norm(y))
        nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        mask = (targets != PAD).to(nll.dtype)
        return (nll * mask).sum(1) / mask.sum(1).clamp_min(1.0)


def random_batch(b, gen):
    """N(0,1) images and captions like CaptionBatch::random (BOS 1, words, EOS 2, PAD)."""
    images = torch.randn(b, 3, IMAGE, IMAGE, generator=gen)
    tokens = torch.zeros(b, SEQ, dtype=torch.long)
    for i in range(b):
        n = 3 + (i * 7) % (SEQ - 3)
        tokens[i, 0] = 1
        for j in range(1, n):
            tokens[i, j] = 3 + (i * 131 + j * 71) % (VOCAB - 3)
        tokens[i, n] = 2
    return images, tokens


def lr_at(step, peak, warmup, total):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * peak * (1 + math.cos(math.pi * progress))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("dp", "plain"), default="dp")
    ap.add_argument("--batch", type=int, default=1500, help="batch size, also the expected L in DP mode")
    ap.add_argument("--steps", type=int, default=5, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--sigma", type=float, default=0.845, help="noise multiplier (DP mode)")
    ap.add_argument("--clip", type=float, default=1.0, help="clipping norm C (DP mode)")
    ap.add_argument("--chunk", type=int, default=500, help="examples per vmap chunk (DP mode)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    model = Captioner()
    names = [n for n, _ in model.named_parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.005)
    total = args.warmup + args.steps
    warmup_steps = max(1, total // 10)

    def example_loss(params, image, tokens):
        return functional_call(model, params, (image.unsqueeze(0), tokens.unsqueeze(0)), {}, strict=True)[0]

    model.forward = model.losses  # functional_call invokes forward
    per_example_grad = vmap(grad(example_loss), in_dims=(None, 0, 0))

    def dp_step(images, tokens):
        params = {n: p.detach() for n, p in model.named_parameters()}
        total_grad = {n: torch.zeros_like(p) for n, p in params.items()}
        for s in range(0, images.shape[0], args.chunk):
            g = per_example_grad(params, images[s : s + args.chunk], tokens[s : s + args.chunk])
            sq = sum(g[n].flatten(1).pow(2).sum(1) for n in names)
            factors = (args.clip / (sq.sqrt() + 1e-6)).clamp(max=1.0)
            for n in names:
                total_grad[n] += torch.einsum("b,b...->...", factors, g[n])
        for n, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * args.sigma * args.clip
            p.grad = (total_grad[n] + noise) / args.batch

    def plain_step(images, tokens):
        opt.zero_grad(set_to_none=True)
        model.losses(images, tokens).mean().backward()

    times = []
    for step in range(total):
        images, tokens = random_batch(args.batch, gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, warmup_steps, total)
        t0 = time.perf_counter()
        (dp_step if args.mode == "dp" else plain_step)(images, tokens)
        opt.step()
        dt = time.perf_counter() - t0
        with torch.no_grad():
            loss = model.losses(images[:256], tokens[:256]).mean().item()
        timed = step >= args.warmup
        if timed:
            times.append(dt)
        print(f"step {step:3d} {'' if timed else '(warmup) '}{dt:.3f} s  loss {loss:.4f}", flush=True)
    if times:
        print(
            f"{args.mode}: batch {args.batch}, {torch.get_num_threads()} threads, torch {torch.__version__}: "
            f"{sum(times) / len(times):.3f} s per step (mean of {len(times)})"
        )


if __name__ == "__main__":
    main()
