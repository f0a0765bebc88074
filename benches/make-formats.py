#!/usr/bin/env python3
"""Wallpaper-like PNG and WebP files (1 to 2 Mpx) from photos, for `cargo bench --bench formats`.

Each image is a crop of a photo (the PNGs and JPEGs of PHOTOS, and the JPEGs under JPEGS when
given) scaled to 1 to 2 megapixels with Pillow's LANCZOS, then written by Pillow: PNG (level 6,
Pillow's default), WebP lossy (quality 80) and WebP lossless. Deterministic from the seed.
usage: make-formats.py PHOTOS OUT N [JPEGS] [SEED]   (needs Pillow)
writes OUT/png/*.png, OUT/webp-lossy/*.webp, OUT/webp-lossless/*.webp
"""
import os, random, sys
from PIL import Image

photos, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
jpegs = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
seed = int(sys.argv[5]) if len(sys.argv) > 5 else 0
sources = sorted(os.path.join(photos, f) for f in os.listdir(photos)
                 if f.lower().endswith((".png", ".jpg", ".jpeg")))
if jpegs:
    sources += sorted(os.path.join(r, f) for r, _, fs in os.walk(jpegs) for f in fs
                      if f.lower().endswith((".jpg", ".jpeg")))[:64]
kinds = {"png": ("PNG", {}), "webp-lossy": ("WEBP", {"quality": 80}),
         "webp-lossless": ("WEBP", {"lossless": True})}
for kind in kinds:
    os.makedirs(os.path.join(out, kind), exist_ok=True)
for i in range(n):
    rng = random.Random(seed * 1_000_003 + i)
    im = Image.open(sources[i % len(sources)]).convert("RGB")
    sw, sh = im.size
    cw, ch = rng.randint(sw * 2 // 3, sw), rng.randint(sh * 2 // 3, sh)
    x0, y0 = rng.randint(0, sw - cw), rng.randint(0, sh - ch)
    pixels = rng.randint(1_000_000, 2_000_000)
    aspect = rng.choice([16 / 9, 16 / 10, 4 / 3, 3 / 2, 21 / 9])
    w = int((pixels * aspect) ** 0.5)
    h = int(w / aspect)
    im = im.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.LANCZOS)
    for kind, (fmt, params) in kinds.items():
        ext = "png" if fmt == "PNG" else "webp"
        im.save(os.path.join(out, kind, f"{i:04d}.{ext}"), fmt, **params)
