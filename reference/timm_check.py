"""Checks `dpctl export --format timm` against timm itself.

Builds `timm.models.VisionTransformer` from the arguments the export records in its metadata
(`timm.model_args`, LayerNorm eps `timm.norm_eps`), loads the exported state dict with
`strict=True`, runs it on the images of the `--check-vectors` file and compares
`forward_features` (every token after the final norm) and the pooled output `model(images)`
with our encoder's tokens and features from the same file. Exits 1 if any value differs by
more than --tolerance (absolute, default 1e-4).

    python reference/timm_check.py ENCODER.safetensors CHECK.safetensors
    python reference/timm_check.py ENCODER.safetensors CHECK.safetensors --keys-out KEYS.json

`--keys-out` writes timm's own state-dict names and shapes for that configuration: the fixture
`ml/tests/data/timm_vit_micro_keys.json` that the Rust test compares the export against.
"""

import argparse
import functools
import json
import sys

import safetensors
import safetensors.torch
import timm
import torch


def metadata(path):
    with safetensors.safe_open(path, framework="pt") as f:
        return f.metadata() or {}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("encoder")
    parser.add_argument("check_vectors")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--keys-out")
    args = parser.parse_args()

    meta = metadata(args.encoder)
    model_args = json.loads(meta["timm.model_args"])
    eps = float(meta["timm.norm_eps"])
    model = timm.models.VisionTransformer(**model_args, norm_layer=functools.partial(torch.nn.LayerNorm, eps=eps))
    model.eval()
    if args.keys_out:
        keys = {name: list(t.shape) for name, t in model.state_dict().items()}
        with open(args.keys_out, "w") as f:
            json.dump({"timm": timm.__version__, "model_args": model_args, "keys": keys}, f, indent=1)
    model.load_state_dict(safetensors.torch.load_file(args.encoder), strict=True)

    vectors = safetensors.torch.load_file(args.check_vectors)
    with torch.no_grad():
        tokens = model.forward_features(vectors["images"])
        features = model(vectors["images"])
    report = {
        "timm": timm.__version__,
        "torch": torch.__version__,
        "privacy": meta.get("dpcap.privacy"),
        "notice": meta.get("dpcap.notice"),
        "tokens_shape": list(tokens.shape),
        "tokens_max_abs_diff": (tokens - vectors["tokens"]).abs().max().item(),
        "features_max_abs_diff": (features - vectors["features"]).abs().max().item(),
        "features_max_abs": vectors["features"].abs().max().item(),
    }
    print(json.dumps(report, indent=1))
    ok = max(report["tokens_max_abs_diff"], report["features_max_abs_diff"]) <= args.tolerance
    print("PASS" if ok else f"FAIL: a difference above {args.tolerance}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
