#!/usr/bin/env python3
"""Fidelity of gpufeed's training augmentations against torchvision v2 on a whole folder.

Runs `gpufeed run DIR --dtype f32 --save ...` with the augmentation flags given (default: the
torchvision ImageNet recipe, `--recipe torchvision-imagenet`), then reproduces every saved row
from FILE.augment.jsonl with torchvision itself: Pillow's `resized_crop` (+ flip) of the source
file (torchvision's own transform on PIL images), `pil_to_tensor`, then each
`torchvision.transforms.v2.functional` call the line lists, then the batch's mixing with the
partner row (MixUp on the normalized float images as torchvision's recipe mixes them; CutMix's
box pasted). Compares with the saved rows in levels of 255 (the normalization undone exactly).

usage: python3 tests/augment_fidelity.py DIR [GPUFEED [ARGS...]]
       (needs torch, torchvision 0.26, Pillow and numpy; GPUFEED defaults to
       target/release/gpufeed; ARGS replace the default --recipe torchvision-imagenet, e.g.
       --train --augment rand-augment:2:9 --random-erasing 0.25; add --decode hybrid
       --gpu-share 1 or --device 0 to run on the GPU; DIR must be an ImageFolder when mixing)
prints: rows, mean absolute difference, 99th and 99.9th percentile and maximum, overall and per
        function (rows whose calls include it); exits 1 when the bars are missed: mean <= 0.5,
        p99.9 <= 2 overall.

Both lanes resize as Pillow does (`--pillow-version` names the Pillow compared against when it
is not the newest) and the augmentations compute what torchvision's do, so rows match exactly;
a level of input that differed would show much larger after solarize, posterize or equalize,
which turn one level into many. FIDELITY_BASE=gpufeed starts every row from gpufeed's own output
without the augmentations instead (the same run with --train alone: the same crops, flips and
order), which isolates the augmentations: every difference left is MixUp's float mixing.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F

MEAN = np.array([0.485, 0.456, 0.406], np.float64)
STD = np.array([0.229, 0.224, 0.225], np.float64)


def tensor_calls(tensor, calls):
    """The tensor calls of a row (its crop and flip already in `tensor`)."""
    for name, kwargs in calls:
        if name in ("resized_crop", "horizontal_flip"):
            continue
        kwargs = dict(kwargs)
        if "interpolation" in kwargs:
            kwargs["interpolation"] = InterpolationMode(kwargs["interpolation"])
        if name == "erase":
            kwargs["v"] = torch.tensor(kwargs["v"], dtype=torch.float32)[:, None, None]
        tensor = getattr(F, name)(tensor, **kwargs)
    return tensor


def source_row(path, calls):
    """The row before mixing: Pillow's resized_crop (+ flip), then the tensor calls."""
    im = Image.open(path).convert("RGB")
    tensor = None
    for name, kwargs in calls:
        if name == "resized_crop":
            t, l, h, w = kwargs["top"], kwargs["left"], kwargs["height"], kwargs["width"]
            size = kwargs["size"]
            im = im.crop((l, t, l + w, t + h)).resize((size[1], size[0]), Image.BILINEAR)
            continue
        if name == "horizontal_flip":
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
            continue
        if tensor is None:
            tensor = F.pil_to_tensor(im)
        kwargs = dict(kwargs)
        if "interpolation" in kwargs:
            kwargs["interpolation"] = InterpolationMode(kwargs["interpolation"])
        if name == "erase":
            kwargs["v"] = torch.tensor(kwargs["v"], dtype=torch.float32)[:, None, None]
            tensor = F.erase(tensor, **kwargs)
        else:
            tensor = getattr(F, name)(tensor, **kwargs)
    if tensor is None:
        tensor = F.pil_to_tensor(im)
    return tensor


AUGMENT_FLAGS = {"--recipe": 1, "--augment": 1, "--color-jitter": 4, "--random-erasing": 1,
                 "--mixup": 1, "--cutmix": 1, "--num-classes": 1}


def without_augmentations(args):
    """The arguments with every augmentation flag left out, and --train for the recipe's crops."""
    out, skip = [], 0
    for a in args:
        if skip:
            skip -= 1
            continue
        if a in AUGMENT_FLAGS:
            skip = AUGMENT_FLAGS[a]
            continue
        out.append(a)
    return out if "--train" in out else out + ["--train"]


def main():
    folder = sys.argv[1]
    binary = sys.argv[2] if len(sys.argv) > 2 else "target/release/gpufeed"
    args = sys.argv[3:] or ["--recipe", "torchvision-imagenet"]
    if "--image-folder" not in args and os.path.isdir(folder) and any(
            os.path.isdir(os.path.join(folder, d)) for d in os.listdir(folder)):
        args = args + ["--image-folder"]
    with tempfile.TemporaryDirectory() as tmp:
        npy = os.path.join(tmp, "out.npy")
        device = [] if "hybrid" in args or "--device" in args else ["--cpu"]
        subprocess.run([binary, "run", folder, *device, "--dtype", "f32", "--save", npy] + args,
                       check=True, stdout=subprocess.DEVNULL)
        out = np.load(npy).astype(np.float64)  # N, 3, H, W, normalized
        lines = [json.loads(l) for l in open(os.path.join(tmp, "out.augment.jsonl"))]
        base = None
        if os.environ.get("FIDELITY_BASE") == "gpufeed":
            plain = os.path.join(tmp, "plain.npy")
            subprocess.run([binary, "run", folder, *device, "--dtype", "f32", "--save", plain]
                           + without_augmentations(args), check=True, stdout=subprocess.DEVNULL)
            levels = np.load(plain).astype(np.float64) * (STD * 255)[None, :, None, None] \
                + (MEAN * 255)[None, :, None, None]
            base = np.rint(levels).clip(0, 255).astype(np.uint8)
    n = len(lines)
    assert n == out.shape[0], (n, out.shape)
    # Every row before mixing, as torchvision makes it.
    if base is None:
        rows = [source_row(line["id"], line["calls"]) for line in lines]
    else:
        rows = [tensor_calls(torch.from_numpy(base[k]), line["calls"]) for k, line in enumerate(lines)]
    normalized = [((r.double() / 255.0 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]).float()
                  for r in rows]
    diffs, per_call = [], {}
    for k, line in enumerate(lines):
        mix = line["mix"]
        if mix is None:
            want = normalized[k]
        elif mix["fn"] == "mixup":
            lam = mix["lam"]
            want = normalized[mix["partner"]].mul(1.0 - lam).add_(normalized[k].mul(lam))
        else:
            x1, y1, x2, y2 = mix["box"]
            want = normalized[k].clone()
            want[:, y1:y2, x1:x2] = normalized[mix["partner"]][:, y1:y2, x1:x2]
        # Levels of 255: both sides through the same inverse of the normalization.
        to_levels = lambda v: v * (STD * 255)[:, None, None] + (MEAN * 255)[:, None, None]
        d = np.abs(to_levels(out[k]) - to_levels(want.double().numpy())).ravel()
        diffs.append(d)
        for name, _ in line["calls"]:
            per_call.setdefault(name, []).append(d)
    diffs = np.concatenate(diffs)
    def stats(d):
        return f"mean {d.mean():.3f}, p99 {np.percentile(d, 99):.2f}, p99.9 {np.percentile(d, 99.9):.2f}, max {d.max():.2f}"
    print(f"{folder} {' '.join(args)}: {n} rows, {stats(diffs)} levels")
    for name in sorted(per_call):
        d = np.concatenate(per_call[name])
        print(f"  {name:18s} {len(per_call[name]):6d} rows: {stats(d)}")
    ok = diffs.mean() <= 0.5 and np.percentile(diffs, 99.9) <= 2
    print("within the bars (mean <= 0.5, p99.9 <= 2)" if ok else "OUTSIDE the bars")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
