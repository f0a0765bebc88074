#!/usr/bin/env python3
"""Pillow's speed per core on torchvision's ImageNet training transform, RandomResizedCrop(224)
+ RandomHorizontalFlip(), on a folder's images (read into memory first, one process): the figure
gpufeed's CPU stage in training mode (`GPUFEED_BENCH_TRAIN=1`) is compared with, in turn.
Uses torchvision's transforms when they are installed, else the same steps on Pillow alone
(get_params written out, crop, resize BILINEAR, mirror).

usage: python3 benches/pil-train.py DIR     (needs Pillow; torchvision optional)
prints: pillow_train_img_per_s_per_core=N
"""
import io
import math
import os
import random
import sys
import time

from PIL import Image

d = sys.argv[1]
files = sorted(os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs
               if f.lower().endswith((".jpg", ".jpeg", ".png", ".webp", ".bmp")))
data = [open(f, "rb").read() for f in files]

try:
    from torchvision import transforms

    train = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip()])
    which = "torchvision"
except ImportError:
    def train(im):
        w, h = im.size
        area = w * h
        for _ in range(10):
            target = area * random.uniform(0.08, 1.0)
            aspect = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                top, left = random.randint(0, h - ch), random.randint(0, w - cw)
                break
        else:
            cw, ch, top, left = w, h, 0, 0
        im = im.crop((left, top, left + cw, top + ch)).resize((224, 224), Image.BILINEAR)
        return im.transpose(Image.FLIP_LEFT_RIGHT) if random.random() < 0.5 else im

    which = "Pillow alone"


def stage(b):
    return train(Image.open(io.BytesIO(b)).convert("RGB")).tobytes()


for b in data[:20]:
    stage(b)
t = time.perf_counter()
for b in data:
    stage(b)
print(f"pillow_train_img_per_s_per_core={len(data) / (time.perf_counter() - t):.0f} ({which})")
