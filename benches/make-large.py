#!/usr/bin/env python3
"""Camera-size JPEGs (2 to 12 megapixels, baseline, 4:2:0, quality 90) from a folder of photos,
scaled up and cropped at random: the large-photo set of the hybrid decoding figures.

usage: python3 benches/make-large.py PHOTOS OUT N [SEED] [--mix] [--grain SIGMA]   (needs Pillow)

--mix      a mix like real photo folders: of every 20 files, 12 baseline 4:2:0 quality 90, 3
           progressive 4:2:0, 2 baseline 4:4:4 quality 95, 2 gray, 1 progressive 4:4:4.
--grain S  adds gray noise of standard deviation S levels before saving, like a camera's sensor
           noise: scaled-up photos are smoother than real ones, and their JPEGs have more zero
           coefficients.
Without the flags the files are the same as before the flags existed.
"""
import os
import random
import sys

from PIL import Image, ImageChops

# (progressive, subsampling, quality, gray) for --mix, 20 slots.
MIX = ([(False, 2, 90, False)] * 12 + [(True, 2, 90, False)] * 3 + [(False, 0, 95, False)] * 2
       + [(False, 0, 90, True)] * 2 + [(True, 0, 90, False)])


def main():
    args = sys.argv[1:]
    mix = "--mix" in args
    grain = 0.0
    if "--grain" in args:
        at = args.index("--grain")
        grain = float(args[at + 1])
        del args[at:at + 2]
    args = [a for a in args if a != "--mix"]
    photos, out, n = args[0], args[1], int(args[2])
    rng = random.Random(int(args[3]) if len(args) > 3 else 1)
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
        im = im.crop((left, top, left + w, top + h))
        progressive, subsampling, quality, gray = (False, 2, 90, False)
        if mix:
            progressive, subsampling, quality, gray = MIX[i % len(MIX)]
        if grain > 0:
            noise = Image.effect_noise((w, h), grain).convert("RGB")
            # noise is centred on 128: add it and take the 128 back
            im = ImageChops.add(im, noise, 1.0, -128)
        if gray:
            im = im.convert("L")
        im.save(os.path.join(out, f"{i:04d}.jpg"), "JPEG", quality=quality,
                subsampling=subsampling, progressive=progressive)


if __name__ == "__main__":
    main()
