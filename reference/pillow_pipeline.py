#!/usr/bin/env python3
"""Pillow reference for worker/src/data/pipeline.rs's eval path, and its benchmark.

For every JPEG in a directory (read into memory first, so disk is not timed): Pillow open →
convert("RGB") → resize the shorter side to SIDE with Image.BICUBIC (torchvision's Resize:
long side = int(SIDE * long / short)) → centre crop SIDE×SIDE (torchvision's CenterCrop: offset
round((resized - SIDE) / 2), Python rounding) → numpy float32, (x/255 - mean)/std with CLIP's
mean/std → channel-major [3, SIDE, SIDE]. Single-threaded; prints one JSON line
{"images", "seconds", "images_per_s", ...} (the median pass of --passes).

--draft asks libjpeg for DCT-scaled decoding (img.draft("RGB", (SIDE, SIDE))): a decode at
1/2, 1/4 or 1/8 size when the image is large enough. It changes the pixels, so it is for
information only, not the like-for-like comparison.

--write-jpegs DIR --count N generates the benchmark's test JPEGs (500×375, quality 90,
gradients + noise + shapes) from a fixed seed, so the Rust bench and this script read the same
files. --dump FILE writes the first image's tensor as raw little-endian float32, to compare with
the Rust pipeline's output.

Needs Pillow and numpy (pip install pillow numpy).
"""

import argparse
import io
import json
import os
import statistics
import sys
import time

import numpy as np
from PIL import Image, ImageDraw

MEAN = np.array([0.48145466, 0.4578275, 0.40821073], dtype=np.float32)
STD = np.array([0.26862954, 0.26130258, 0.27577711], dtype=np.float32)


def write_jpegs(out_dir, count, width=500, height=375, seed=20240607):
    """Natural-ish test pictures: a random two-colour gradient, soft noise, random shapes."""
    os.makedirs(out_dir, exist_ok=True)
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    for i in range(count):
        a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        angle = rng.uniform(0, 2 * np.pi)
        t = (np.cos(angle) * xs / width + np.sin(angle) * ys / height + 1.0) / 2.0
        img = (1 - t)[..., None] * a + t[..., None] * b
        # Noise at two scales: fine grain and blotches (upsampled coarse noise).
        img += rng.normal(0, 6, (height, width, 3))
        coarse = rng.normal(0, 18, (height // 25 + 1, width // 25 + 1, 3))
        img += np.kron(coarse, np.ones((25, 25, 1)))[:height, :width]
        pic = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(pic)
        for _ in range(int(rng.integers(4, 12))):
            x0, y0 = rng.uniform(-50, width), rng.uniform(-50, height)
            x1, y1 = x0 + rng.uniform(20, 200), y0 + rng.uniform(20, 150)
            fill = tuple(int(v) for v in rng.integers(0, 256, 3))
            kind = rng.integers(0, 3)
            if kind == 0:
                draw.ellipse([x0, y0, x1, y1], fill=fill)
            elif kind == 1:
                draw.rectangle([x0, y0, x1, y1], fill=fill, outline=(0, 0, 0), width=2)
            else:
                draw.polygon([(x0, y1), ((x0 + x1) / 2, y0), (x1, y1)], fill=fill)
        pic.save(os.path.join(out_dir, f"img{i:04d}.jpg"), "JPEG", quality=90)


def process(data, side, draft):
    img = Image.open(io.BytesIO(data))
    if draft:
        img.draft("RGB", (side, side))
    img = img.convert("RGB")
    w, h = img.size
    if w <= h:
        new_w, new_h = side, int(side * h / w)
    else:
        new_w, new_h = int(side * w / h), side
    img = img.resize((new_w, new_h), Image.BICUBIC)
    left = int(round((new_w - side) / 2.0))
    top = int(round((new_h - side) / 2.0))
    img = img.crop((left, top, left + side, top + side))
    x = np.asarray(img, dtype=np.float32) / 255.0
    x = (x - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", help="directory of JPEGs (read) or, with --write-jpegs, ignored")
    parser.add_argument("--side", type=int, default=224)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--draft", action="store_true", help="JPEG DCT-scaled decoding (information only)")
    parser.add_argument("--dump", help="write the first image's tensor here as raw f32 LE")
    parser.add_argument("--write-jpegs", metavar="DIR", help="generate the test JPEGs into DIR and exit")
    parser.add_argument("--count", type=int, default=200)
    args = parser.parse_args()

    if args.write_jpegs:
        write_jpegs(args.write_jpegs, args.count)
        print(json.dumps({"written": args.count, "dir": args.write_jpegs}))
        return

    names = sorted(n for n in os.listdir(args.dir) if n.lower().endswith((".jpg", ".jpeg")))
    if not names:
        sys.exit(f"no .jpg files in {args.dir}")
    blobs = []
    for n in names:
        with open(os.path.join(args.dir, n), "rb") as f:
            blobs.append(f.read())

    if args.dump:
        process(blobs[0], args.side, args.draft).astype("<f4").tofile(args.dump)

    times = []
    for _ in range(args.passes):
        start = time.perf_counter()
        for data in blobs:
            out = process(data, args.side, args.draft)
            assert out.shape == (3, args.side, args.side)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    print(json.dumps({
        "impl": "pillow" + ("+draft" if args.draft else ""),
        "pillow": Image.__version__,
        "images": len(blobs),
        "seconds": round(seconds, 4),
        "images_per_s": round(len(blobs) / seconds, 1),
        "passes": [round(t, 4) for t in times],
    }))


if __name__ == "__main__":
    main()
