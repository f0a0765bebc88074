#!/usr/bin/env python3
"""Fidelity of gpufeed's CPU stage against torchvision's (Pillow) on a whole folder.

Runs `gpufeed run DIR --cpu --dtype f32 --save` (ImageNet normalization, NCHW), undoes the
normalization (exact: the f32 values are fma(x, 1/(255 std), -mean/std) of the u8 pixel x), and
compares every pixel with Pillow's Resize(256, BILINEAR) + CenterCrop(224) of the same file; with
`--train` among the arguments, with Pillow's crop + resize (+ mirror) of the box each row's line
of `out.crops.tsv` names: torchvision's `F.resized_crop` + `F.hflip` on the drawn parameters.

usage: python3 tests/fidelity.py DIR [GPUFEED [ARGS...]]   (needs Pillow and numpy; GPUFEED
       defaults to target/release/gpufeed; ARGS go to `gpufeed run`, e.g. --dct-scaling, or
       --decode hybrid --gpu-share 1, which runs on GPU 0)
prints: files, mean absolute difference, 99th and 99.9th percentile and maximum, in levels of 255
       (FIDELITY=--worst first lists the ten files that differ most)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

MEAN = np.array([0.485, 0.456, 0.406], np.float64)
STD = np.array([0.229, 0.224, 0.225], np.float64)


def torchvision(path, R=256, C=224):
    im = Image.open(path).convert("RGB")
    w, h = im.size
    nw, nh = (R, int(R * h / w)) if w <= h else (int(R * w / h), R)
    im = im.resize((nw, nh), Image.BILINEAR)
    left, top = int(round((nw - C) / 2.0)), int(round((nh - C) / 2.0))
    return np.asarray(im.crop((left, top, left + C, top + C)), np.int16)


def resized_crop(path, top, left, height, width, flipped, size=224):
    im = Image.open(path).convert("RGB").crop((left, top, left + width, top + height))
    im = im.resize((size, size), Image.BILINEAR)
    if flipped:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(im, np.int16)


def main():
    folder = sys.argv[1]
    binary = sys.argv[2] if len(sys.argv) > 2 else "target/release/gpufeed"
    with tempfile.TemporaryDirectory() as tmp:
        npy = os.path.join(tmp, "out.npy")
        # On the CPU device unless the arguments ask for the GPU (hybrid decoding needs it).
        device = [] if "hybrid" in sys.argv[3:] or "--device" in sys.argv[3:] else ["--cpu"]
        subprocess.run([binary, "run", folder, *device, "--dtype", "f32", "--save", npy]
                       + sys.argv[3:], check=True, stdout=subprocess.DEVNULL)
        out = np.load(npy)  # N, 3, 224, 224
        paths = open(os.path.join(tmp, "out.paths.txt")).read().split("\n")[:-1]
        crops_file = os.path.join(tmp, "out.crops.tsv")
        # Random transforms (--train, random-resized-crop, --hflip) write the drawn boxes.
        crops = [l.split("\t") for l in open(crops_file).read().splitlines()] \
            if os.path.exists(crops_file) else None
    ours = np.rint(out.astype(np.float64) * (STD * 255)[None, :, None, None]
                   + (MEAN * 255)[None, :, None, None]).astype(np.int16).transpose(0, 2, 3, 1)
    if crops is not None:
        assert len(crops) == len(paths) and all(c[0] == p for c, p in zip(crops, paths))
        want = lambda i: resized_crop(paths[i], *map(int, crops[i][1:6]))
    else:
        want = lambda i: torchvision(paths[i])
    per_file = [np.abs(ours[i] - want(i)).ravel() for i in range(len(paths))]
    diffs = np.concatenate(per_file)
    if "--worst" in os.environ.get("FIDELITY", ""):
        means = sorted(((d.mean(), i) for i, d in enumerate(per_file)), reverse=True)
        for mean, i in means[:10]:
            with Image.open(paths[i]) as im:
                print(f"  {mean:7.3f}  place {i:5d}  {im.mode} {im.size[0]}x{im.size[1]}  {paths[i]}")
    flags = " ".join(sys.argv[3:]) or "(defaults)"
    print(f"{folder} {flags}: {len(paths)} files, mean {diffs.mean():.3f}, p99 {np.percentile(diffs, 99):.0f}, "
          f"p99.9 {np.percentile(diffs, 99.9):.0f}, max {diffs.max()} levels")


if __name__ == "__main__":
    main()
