#!/usr/bin/env python3
"""Independent PyTorch reference for dpcap's `micro` captioner.

Rebuilds the captioner of worker/src/model/{captioner,encoder,layers}.rs in plain PyTorch
(float64 arithmetic on float32-rounded weights and inputs), with the deterministic weights
and inputs of ml/tests/reference.rs, and computes what that test checks:

* losses            per-example mean token cross-entropy over non-PAD targets (PAD = 0)
* norms             per-example L2 norms of the gradient of each example's own loss
* clipping_norm     C, chosen between the examples' norms (10.0)
* sum_norms         per-parameter L2 norms of sum_i g_i
* clipped_sum_norms per-parameter L2 norms of sum_i c_i g_i, c_i = min(1, C / (||g_i|| + 1e-6))

Usage (see reference/README.md):
    python reference/captioner_reference.py                       # print the JSON
    python reference/captioner_reference.py --out PATH            # write the JSON
    python reference/captioner_reference.py --check ml/tests/data/captioner_reference.json
"""

import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

SOURCE = "reference/captioner_reference.py (PyTorch, float64 on f32-rounded inputs)"

# `micro` (CaptionerConfig::named("micro")).
IMAGE, PATCH, WIDTH, DEPTH, HEADS = 32, 8, 64, 2, 2
DEC_WIDTH, DEC_DEPTH, DEC_HEADS, VOCAB, SEQ = 64, 1, 2, 256, 12
LN_EPS = 1e-5
PAD = 0
NORM_EPSILON = 1e-6
CLIPPING_NORM = 10.0

TOKENS = [
    [1, 5, 9, 13, 20, 2, 0, 0, 0, 0, 0, 0],
    [1, 7, 8, 2, 0, 0, 0, 0, 0, 0, 0, 0],
    [1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 2, 0],
]

DT = torch.float64


def param_specs():
    """(name, shape) in ParamSet registration order; Linear weights are [d_in, d_out]."""
    specs = []

    def linear(name, d_in, d_out):
        specs.append((f"{name}.weight", (d_in, d_out)))
        specs.append((f"{name}.bias", (d_out,)))

    def layer_norm(name, d):
        specs.append((f"{name}.gamma", (d,)))
        specs.append((f"{name}.beta", (d,)))

    def attention(name, d):
        for p in ("q", "k", "v", "o"):
            linear(f"{name}.{p}", d, d)

    def block(name, d, decoder):
        layer_norm(f"{name}.ln1", d)
        attention(f"{name}.attn", d)
        if decoder:
            layer_norm(f"{name}.ln_cross", d)
            attention(f"{name}.cross", d)
        layer_norm(f"{name}.ln2", d)
        linear(f"{name}.fc1", d, 4 * d)
        linear(f"{name}.fc2", 4 * d, d)

    patches = (IMAGE // PATCH) ** 2
    linear("encoder.patch_embed", 3 * PATCH * PATCH, WIDTH)
    specs.append(("encoder.positions", (patches, WIDTH)))
    for i in range(DEPTH):
        block(f"encoder.blocks.{i}", WIDTH, False)
    layer_norm("encoder.norm", WIDTH)
    linear("bridge", WIDTH, DEC_WIDTH)
    specs.append(("decoder.token_embed", (VOCAB, DEC_WIDTH)))
    specs.append(("decoder.positions", (SEQ - 1, DEC_WIDTH)))
    for i in range(DEC_DEPTH):
        block(f"decoder.blocks.{i}", DEC_WIDTH, True)
    layer_norm("decoder.norm", DEC_WIDTH)
    linear("decoder.head", DEC_WIDTH, VOCAB)
    return specs


def reference_params():
    """Parameter k at flat index i: 0.15*sin(0.37 i + 1.3 k + 0.1) (+1 for gammas), evaluated
    in torch float32 (float32 arange, Python-float scalars, float32 sin), then widened to
    float64. This is how the fixture was made; it differs from the Rust test's own f32
    evaluation (f32 constants, libm sinf) in the last ulp of some weights, which moves the
    losses by about 5e-7 relative, well inside the Rust test's 1e-5."""
    params = {}
    for k, (name, shape) in enumerate(param_specs()):
        n = math.prod(shape)
        i = torch.arange(n, dtype=torch.float32)
        base = 1.0 if name.endswith("gamma") else 0.0
        values = base + 0.15 * torch.sin(0.37 * i + 1.3 * k + 0.1)
        params[name] = values.reshape(shape).to(DT)
    return params


def reference_batch():
    """Image b at flat index j of [3, 32, 32] is sin(0.013 j + b), in float32, then float64."""
    pixels = 3 * IMAGE * IMAGE
    j = torch.arange(pixels, dtype=torch.float32)
    images = torch.stack([torch.sin(0.013 * j + b) for b in range(len(TOKENS))])
    return images.reshape(len(TOKENS), 3, IMAGE, IMAGE).to(DT), torch.tensor(TOKENS, dtype=torch.long)


# ----------------------------------------------------------------------------- the model


def linear(p, name, x):
    return x @ p[f"{name}.weight"] + p[f"{name}.bias"]


def layer_norm(p, name, x):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as burn's var_mean_bias
    return (x - mean) / torch.sqrt(var + LN_EPS) * p[f"{name}.gamma"] + p[f"{name}.beta"]


def attention(p, name, x, memory, heads, causal):
    b, t, d = x.shape
    memory = x if memory is None else memory
    s = memory.shape[1]
    dh = d // heads

    def split(y):
        return y.reshape(b, y.shape[1], heads, dh).transpose(1, 2)

    q = split(linear(p, f"{name}.q", x))
    k = split(linear(p, f"{name}.k", memory))
    v = split(linear(p, f"{name}.v", memory))
    scores = q @ k.transpose(2, 3) / math.sqrt(dh)
    if causal:
        future = torch.triu(torch.ones(t, s, dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(future, -1e9)
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
    return linear(p, f"{name}.o", out)


def block(p, name, x, heads, memory=None, decoder=False):
    x = x + attention(p, f"{name}.attn", layer_norm(p, f"{name}.ln1", x), None, heads, decoder)
    if decoder:
        x = x + attention(p, f"{name}.cross", layer_norm(p, f"{name}.ln_cross", x), memory, heads, False)
    h = linear(p, f"{name}.fc1", layer_norm(p, f"{name}.ln2", x))
    return x + linear(p, f"{name}.fc2", F.gelu(h))  # exact (erf) GELU


def patchify(images, patch):
    """[B, 3, H, W] -> [B, N, 3*p*p], patches row-major, channel-major within a patch."""
    b, c, h, w = images.shape
    gh, gw = h // patch, w // patch
    x = images.reshape(b, c, gh, patch, gw, patch).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, gh * gw, c * patch * patch)


def losses(p, images, tokens):
    x = linear(p, "encoder.patch_embed", patchify(images, PATCH)) + p["encoder.positions"]
    for i in range(DEPTH):
        x = block(p, f"encoder.blocks.{i}", x, HEADS)
    memory = linear(p, "bridge", layer_norm(p, "encoder.norm", x))

    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    y = p["decoder.token_embed"][inputs] + p["decoder.positions"]
    for i in range(DEC_DEPTH):
        y = block(p, f"decoder.blocks.{i}", y, DEC_HEADS, memory=memory, decoder=True)
    logits = linear(p, "decoder.head", layer_norm(p, "decoder.norm", y))
    logp = torch.log_softmax(logits, dim=-1).gather(2, targets.unsqueeze(2)).squeeze(2)
    mask = (targets != PAD).to(DT)
    return -(logp * mask).sum(1) / mask.sum(1).clamp_min(1.0)


# ----------------------------------------------------------------------------- the numbers


def compute():
    params = reference_params()
    names = list(params)
    images, tokens = reference_batch()
    per_example_losses, grads = [], []
    for b in range(len(TOKENS)):
        p = {n: v.clone().requires_grad_(True) for n, v in params.items()}
        loss = losses(p, images[b : b + 1], tokens[b : b + 1])[0]
        g = torch.autograd.grad(loss, [p[n] for n in names])
        per_example_losses.append(loss.item())
        grads.append(dict(zip(names, g)))
    norms = [math.sqrt(sum(float((g[n] ** 2).sum()) for n in names)) for g in grads]
    factors = [min(1.0, CLIPPING_NORM / (nrm + NORM_EPSILON)) for nrm in norms]

    def sum_norms(weights):
        return {n: float(torch.linalg.vector_norm(sum(w * g[n] for w, g in zip(weights, grads)))) for n in names}

    return {
        "source": SOURCE,
        "losses": per_example_losses,
        "norms": norms,
        "clipping_norm": CLIPPING_NORM,
        "sum_norms": sum_norms([1.0] * len(grads)),
        "clipped_sum_norms": sum_norms(factors),
    }


def rel(got, want):
    # Gradients that are zero in exact arithmetic (attention key biases, by softmax's shift
    # invariance) come out as rounding noise, ~1e-19..1e-22, in both; the 1e-12 floor makes
    # those compare absolutely, as the Rust test's 1e-6 floor does.
    return abs(got - want) / max(abs(want), 1e-12)


def check(result, fixture, tolerances):
    ok = True
    for field in ("losses", "norms"):
        dev = max(rel(g, w) for g, w in zip(result[field], fixture[field]))
        good = len(result[field]) == len(fixture[field]) and dev <= tolerances[field]
        ok &= good
        print(f"{field:18s} max relative deviation {dev:.3e} (tolerance {tolerances[field]:.0e}) {'ok' if good else 'FAIL'}")
    good = result["clipping_norm"] == fixture["clipping_norm"]
    ok &= good
    print(f"{'clipping_norm':18s} {result['clipping_norm']} vs {fixture['clipping_norm']} {'ok' if good else 'FAIL'}")
    for field in ("sum_norms", "clipped_sum_norms"):
        if set(result[field]) != set(fixture[field]):
            print(f"{field}: parameter names differ: {sorted(set(result[field]) ^ set(fixture[field]))}")
            ok = False
            continue
        devs = {n: rel(result[field][n], fixture[field][n]) for n in fixture[field]}
        worst = max(devs, key=devs.get)
        good = devs[worst] <= tolerances[field]
        ok &= good
        print(f"{field:18s} max relative deviation {devs[worst]:.3e} at {worst} (tolerance {tolerances[field]:.0e}) {'ok' if good else 'FAIL'}")
        nonzero = {n: d for n, d in devs.items() if abs(fixture[field][n]) >= 1e-12}
        worst_nz = max(nonzero, key=nonzero.get)
        print(f"{'':18s} over the {len(nonzero)} parameters whose norm is not zero in exact arithmetic: {nonzero[worst_nz]:.3e} at {worst_nz}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the JSON here (default: print it)")
    ap.add_argument("--check", metavar="FIXTURE", help="compare against an existing fixture")
    args = ap.parse_args()
    torch.set_default_dtype(DT)
    result = compute()
    if args.check:
        with open(args.check) as f:
            fixture = json.load(f)
        tol = {"losses": 1e-6, "norms": 1e-5, "sum_norms": 1e-3, "clipped_sum_norms": 1e-3}
        ok = check(result, fixture, tol)
        print("matches the fixture" if ok else "DOES NOT match the fixture")
        if not ok:
            sys.exit(1)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    elif not args.check:
        print(text)


if __name__ == "__main__":
    main()
