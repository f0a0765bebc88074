#!/usr/bin/env python3
"""Writes the golden vectors of the augmentation operations: torchvision v2's functional calls
on small uint8 images (random, smooth, flat and a real photo), with the parameters the policies
draw (every magnitude bin's value of TrivialAugmentWide, RandAugment and AutoAugment, both
signs) and random colour-jitter and erasing parameters.

usage: python3 tests/augment/make_vectors.py [--seed S] [--out DIR]
       (needs torch and torchvision 0.26, numpy, Pillow; the committed vectors are seed 23's;
       another seed and GPUFEED_AUGMENT_VECTORS=DIR on the unit test compare with torchvision
       afresh, e.g. on a machine where it is installed)
writes: DIR/vectors.txt (default tests/augment), one line per image or call, and
        DIR/vectors.bin, the bytes of each (HWC, uint8) in the same order:
        `input H W`                    an input image
        `case INPUT FN ARGS...`        FN applied to input INPUT; its output image
        (ARGS as `src/augment/tests.rs` reads them; floats written as Python's repr)
"""
import math
import os

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2 import InterpolationMode

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
NEAREST = InterpolationMode.NEAREST


def inputs(rng):
    noise = rng.integers(0, 256, (13, 19, 3), dtype=np.uint8)
    square = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    y, x = np.mgrid[0:18, 0:24]
    smooth = np.stack([x * 10, y * 13, (x + y) * 5], -1) + rng.integers(0, 12, (18, 24, 3))
    smooth = smooth.clip(0, 255).astype(np.uint8)
    photo = Image.open(os.path.join(ROOT, "assets", "chelsea.png")).convert("RGB")
    photo = np.asarray(photo.resize((24, 24), Image.BILINEAR), np.uint8)
    flat = (100 + rng.integers(0, 6, (10, 12, 3))).astype(np.uint8)
    flat[..., 2] = 77  # one constant channel
    return [noise, square, smooth, photo, flat]


def linspace(a, b, n):
    return [float(v) for v in torch.linspace(a, b, n)]


def cases(rng, h, w):
    """(fn name, args for the text file, the call) for an image of h x w."""
    out = []
    fills = [[0, 0, 0], [255, 128, 7]]
    shears = linspace(0.0, 0.99, 31) + linspace(0.0, 0.3, 10)
    for m in rng.choice(shears, 6, replace=False):
        for sign in (1, -1):
            deg = math.degrees(math.atan(sign * m))
            fill = fills[int(rng.integers(2))]
            axis = int(rng.integers(2))
            shear = [deg, 0.0] if axis == 0 else [0.0, deg]
            out.append(("shear", [shear[0], shear[1], *fill],
                        lambda im, shear=shear, fill=fill: F.affine(
                            im, angle=0.0, translate=[0, 0], scale=1.0, shear=shear,
                            interpolation=NEAREST, fill=fill if any(fill) else None, center=[0, 0])))
    for t in [0, 1, 5, 15, 16, -7, -32, 9, 33]:
        fill = fills[int(rng.integers(2))]
        axis = int(rng.integers(2))
        tr = [t, 0] if axis == 0 else [0, t]
        out.append(("translate", [tr[0], tr[1], *fill],
                    lambda im, tr=tr, fill=fill: F.affine(
                        im, angle=0.0, translate=tr, scale=1.0, shear=[0.0, 0.0],
                        interpolation=NEAREST, fill=fill if any(fill) else None)))
    angles = linspace(0.0, 135.0, 31) + linspace(0.0, 30.0, 10)
    for a in list(rng.choice(angles, 8, replace=False)) + [90.0, -90.0, 180.0, 0.0, 45.0]:
        for sign in (1, -1):
            angle = sign * a
            fill = fills[int(rng.integers(2))]
            out.append(("rotate", [angle, *fill],
                        lambda im, angle=angle, fill=fill: F.rotate(
                            im, angle=angle, interpolation=NEAREST,
                            fill=fill if any(fill) else None)))
    enhance = linspace(0.0, 0.99, 31) + linspace(0.0, 0.9, 10)
    for name, fn in [("brightness", F.adjust_brightness), ("saturation", F.adjust_saturation),
                     ("contrast", F.adjust_contrast), ("sharpness", F.adjust_sharpness)]:
        factors = [1.0 + s * m for m in rng.choice(enhance, 4, replace=False) for s in (1, -1)]
        factors += [float(v) for v in rng.uniform(0.0, 2.5, 3)] + [0.0, 1.0]
        for f in factors:
            out.append((name, [f], lambda im, fn=fn, f=f: fn(im, f)))
    for hue in [float(v) for v in rng.uniform(-0.5, 0.5, 6)] + [0.0, 0.5, -0.5]:
        out.append(("hue", [hue], lambda im, hue=hue: F.adjust_hue(im, hue)))
    for bits in range(0, 9):
        out.append(("posterize", [bits], lambda im, bits=bits: F.posterize(im, bits)))
    for m in linspace(1.0, 0.0, 31)[::3] + linspace(1.0, 0.0, 10)[::2]:
        threshold = 255.0 * m
        out.append(("solarize", [threshold], lambda im, t=threshold: F.solarize(im, t)))
    out.append(("autocontrast", [], F.autocontrast))
    out.append(("equalize", [], F.equalize))
    out.append(("invert", [], F.invert))
    for _ in range(3):
        eh, ew = int(rng.integers(1, h)), int(rng.integers(1, w))
        i, j = int(rng.integers(0, h - eh + 1)), int(rng.integers(0, w - ew + 1))
        v = [int(x) for x in rng.integers(0, 256, 3)]
        out.append(("erase", [i, j, eh, ew, *v],
                    lambda im, a=(i, j, eh, ew, v): F.erase(
                        im, a[0], a[1], a[2], a[3], torch.tensor(a[4], dtype=torch.float32)[:, None, None])))
    return out


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=23)
    parser.add_argument("--out", default=HERE)
    options = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(options.seed)
    lines = [f"# torch {torch.__version__}, torchvision {torchvision.__version__}"]
    blob = bytearray()
    images = inputs(rng)
    for k, img in enumerate(images):
        h, w, _ = img.shape
        lines.append(f"input {h} {w}")
        blob += img.tobytes()
    for k, img in enumerate(images):
        h, w, _ = img.shape
        chw = torch.from_numpy(img.copy()).permute(2, 0, 1).contiguous()
        # Every call on the two first images (noise, square); a share of them on the others.
        all_cases = cases(rng, h, w)
        keep = all_cases if k < 2 else [c for c in all_cases if rng.random() < 0.4 or c[0] in (
            "autocontrast", "equalize", "hue", "contrast")]
        for name, args, call in keep:
            out = call(chw.clone())
            assert out.dtype == torch.uint8 and out.shape == chw.shape, name
            lines.append(" ".join(["case", str(k), name] + [repr(float(a)) if isinstance(a, (float, np.floating)) else str(int(a)) for a in args]))
            blob += out.permute(1, 2, 0).contiguous().numpy().tobytes()
    os.makedirs(options.out, exist_ok=True)
    with open(os.path.join(options.out, "vectors.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(options.out, "vectors.bin"), "wb") as f:
        f.write(bytes(blob))
    print(f"{sum(l.startswith('case') for l in lines)} cases, {len(blob)} bytes")


if __name__ == "__main__":
    main()
