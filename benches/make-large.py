#!/usr/bin/env python3
"""Camera-size JPEGs (2 to 12 megapixels, baseline, 4:2:0, quality 90) from a folder of photos,
scaled up and cropped at random: the large-photo set of the hybrid decoding figures.

usage: python3 benches/make-large.py PHOTOS OUT N [SEED]   (needs Pillow)
"""
import os
import random
import sys

from PIL import Image


def main():
    photos, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    sources = sorted(f for f in os.listdir(photos) if f.lower().endswith((".png", ".jpg")))
    os.makedirs(out, exist_ok=True)
    for i in range(n):
        im = Image.open(os.path.join(photos, sources[i % len(sources)])).convert("RGB")
        megapixels = rng.uniform(2.0, 12.0)
        aspect = rng.choice([4 / 3, 3 / 2, 16 / 9, 3 / 4, 2 / 3, 1.0])
        h = int((megapixels * 1e6 / aspect) ** 0.5)
        w = int(h * aspect)
        scale = max(w / im.width, h / im.height)
        im = im.resize((int(im.width * scale) + 1, int(im.height * scale) + 1), Image.BICUBIC)
        left, top = rng.randint(0, im.width - w), rng.randint(0, im.height - h)
        im.crop((left, top, left + w, top + h)).save(
            os.path.join(out, f"{i:04d}.jpg"), "JPEG", quality=90, subsampling=2)


if __name__ == "__main__":
    main()
