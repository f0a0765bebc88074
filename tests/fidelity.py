#!/usr/bin/env python3
"""Fidelity of gpufeed's CPU stage against torchvision's (Pillow) on a whole folder.

Runs `gpufeed run DIR --cpu --dtype f32 --save` (ImageNet normalization, NCHW), undoes the
normalization (exact: the f32 values are fma(x, 1/(255 std), -mean/std) of the u8 pixel x), and
compares every pixel with Pillow's Resize(256, BILINEAR) + CenterCrop(224) of the same file; with
`--train` among the arguments, with Pillow's crop + resize (+ mirror) of the box each row's line
of `out.crops.tsv` names: torchvision's `F.resized_crop` + `F.hflip` on the drawn parameters.

The reference follows the arguments given to `gpufeed run`: `--interpolation NAME` (Pillow's
filter of that name), `--resize-mode stretch|letterbox` (with `--pad`), `--resize`/`--crop`,
`--size HxW` (the output, of any mode), and `--dct-scaling`, whose reference is Pillow's
`Image.draft` at the same scale followed by `resize(size, box=...)` of the same box in reduced
pixels (what gpufeed's reduced decode approximates the full-size resize with).

usage: python3 tests/fidelity.py DIR [GPUFEED [ARGS...]]   (needs Pillow and numpy; GPUFEED
       defaults to target/release/gpufeed; ARGS go to `gpufeed run`, e.g. --dct-scaling, or
       --decode hybrid --gpu-share 1, which runs on GPU 0)
prints: files, images identical to the reference, mean absolute difference, 99th and 99.9th
       percentile and maximum, in levels of 255, and the Pillow version compared against
       (FIDELITY=--worst first lists the ten files that differ most)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image, __version__ as PIL_VERSION

MEAN = np.array([0.485, 0.456, 0.406], np.float64)
STD = np.array([0.229, 0.224, 0.225], np.float64)


FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST,
           "lanczos": Image.LANCZOS, "box": Image.BOX, "hamming": Image.HAMMING}


def arg(name, default):
    args = sys.argv[3:]
    return args[args.index(name) + 1] if name in args else default


def reduction(box_w, box_h, out_w, out_h):
    """gpufeed's DCT reduction: the largest of 8, 4, 2 leaving the box twice the output."""
    for r in (8, 4, 2):
        if box_w >= 2 * r * out_w and box_h >= 2 * r * out_h:
            return r
    return 1


def open_rgb(path, box_size, out_size):
    """The image as RGB, drafted to gpufeed's DCT scale with --dct-scaling; returns it and the
    scale (box coordinates are divided by it)."""
    im = Image.open(path)
    r = 1
    if "--dct-scaling" in sys.argv[3:] and im.format == "JPEG" and im.mode in ("RGB", "L"):
        r = reduction(*box_size(im.size), *out_size(im.size))
        if r > 1:
            w, h = im.size
            im.draft(im.mode, (w // r, h // r))
            assert im.size == ((w + r - 1) // r, (h + r - 1) // r), (path, im.size, r)
    return im.convert("RGB"), r


def output_size(C):
    """The output's (width, height): `--size HxW`, else `--crop`'s square."""
    size = arg("--size", None)
    if size is None:
        return C, C
    h, w = (int(v) for v in size.lower().split("x"))
    return w, h


def torchvision(path, R=256, C=224):
    filt = FILTERS[arg("--interpolation", "bilinear")]
    R, C = int(arg("--resize", R)), int(arg("--crop", C))
    CW, CH = output_size(C)
    mode = arg("--resize-mode", "center-crop")

    def resized_size(size):
        w, h = size
        if mode == "center-crop":
            return (R, int(R * h / w)) if w <= h else (int(R * w / h), R)
        if mode == "stretch":
            return (CW, CH)
        scale = min(CW / w, CH / h)
        return (min(max(1, int(w * scale + 0.5)), CW), min(max(1, int(h * scale + 0.5)), CH))

    im, r = open_rgb(path, lambda size: size, resized_size)
    with Image.open(path) as original:
        full = original.size
    nw, nh = resized_size(full)
    im = im.resize((nw, nh), filt, box=(0, 0, full[0] / r, full[1] / r))
    if mode == "stretch":
        return np.asarray(im, np.int16)
    if mode == "letterbox":
        out = Image.new("RGB", (CW, CH), (int(arg("--pad", 114)),) * 3)
        out.paste(im, ((CW - nw) // 2, (CH - nh) // 2))
        return np.asarray(out, np.int16)
    # torchvision's CenterCrop: pad (centred, zeros) to the crop where the image is smaller.
    if nw < CW or nh < CH:
        padded = Image.new("RGB", (max(nw, CW), max(nh, CH)))
        padded.paste(im, ((max(nw, CW) - nw) // 2, (max(nh, CH) - nh) // 2))
        im, nw, nh = padded, max(nw, CW), max(nh, CH)
    left, top = int(round((nw - CW) / 2.0)), int(round((nh - CH) / 2.0))
    return np.asarray(im.crop((left, top, left + CW, top + CH)), np.int16)


def resized_crop(path, top, left, height, width, flipped, size=224):
    filt = FILTERS[arg("--interpolation", "bilinear")]
    im, r = open_rgb(path, lambda _: (width, height), lambda _: (size, size))
    if r == 1:
        im = im.crop((left, top, left + width, top + height)).resize((size, size), filt)
    else:
        box = (left / r, top / r, (left + width) / r, (top + height) / r)
        im = im.resize((size, size), filt, box=box)
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
    identical = sum(1 for d in per_file if not d.any())
    diffs = np.concatenate(per_file)
    if "--worst" in os.environ.get("FIDELITY", ""):
        means = sorted(((d.mean(), i) for i, d in enumerate(per_file)), reverse=True)
        for mean, i in means[:10]:
            with Image.open(paths[i]) as im:
                print(f"  {mean:7.3f}  place {i:5d}  {im.mode} {im.size[0]}x{im.size[1]}  {paths[i]}")
    flags = " ".join(sys.argv[3:]) or "(defaults)"
    print(f"{folder} {flags}: {len(paths)} files, {identical} identical "
          f"({100 * identical / len(paths):.2f}%), mean {diffs.mean():.4f}, "
          f"p99 {np.percentile(diffs, 99):.0f}, p99.9 {np.percentile(diffs, 99.9):.0f}, "
          f"max {diffs.max()} levels (Pillow {PIL_VERSION})")


if __name__ == "__main__":
    main()
