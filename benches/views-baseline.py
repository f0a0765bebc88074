#!/usr/bin/env python3
"""The reference multi-crop loaders' speed on a folder: DINOv2's `DataAugmentationDINO` (2 global
crops of 224, 8 local of 96, the colour operations, blur, solarize, ToTensor and Normalize)
or SimCLR's two views, in a PyTorch DataLoader with N workers, images/s with all views made.
What `gpufeed run DIR --views PRESET --json` (its `images_per_s`) is compared with.

The transforms are DINOv2's `dinov2/data/augmentations.py` written out with torchvision (its
GaussianBlur(p) is RandomApply(..., p=1 - p)); SimCLR's are the common torchvision form.

usage: python3 benches/views-baseline.py DIR [dinov2|simclr] [WORKERS] [EPOCHS]
       (needs torch and torchvision)
prints: views_baseline_img_per_s=N preset=P workers=W images=I seconds=S
"""
import os
import sys
import time

import torch
from PIL import Image
from torchvision import transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def blur(p, kernel=9):
    """DINOv2's GaussianBlur(p): RandomApply([GaussianBlur(kernel, (0.1, 2.0))], p=1 - p)."""
    return T.RandomApply([T.GaussianBlur(kernel_size=kernel, sigma=(0.1, 2.0))], p=1 - p)


def dinov2():
    bicubic = T.InterpolationMode.BICUBIC
    geo_global = T.Compose([T.RandomResizedCrop(224, scale=(0.32, 1.0), interpolation=bicubic),
                            T.RandomHorizontalFlip(p=0.5)])
    geo_local = T.Compose([T.RandomResizedCrop(96, scale=(0.05, 0.32), interpolation=bicubic),
                           T.RandomHorizontalFlip(p=0.5)])
    color = T.Compose([T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                       T.RandomGrayscale(p=0.2)])
    norm = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    g1 = T.Compose([color, blur(1.0), norm])
    g2 = T.Compose([color, blur(0.1), T.RandomSolarize(threshold=128, p=0.2), norm])
    loc = T.Compose([color, blur(0.5), norm])

    def views(im):
        return [g1(geo_global(im)), g2(geo_global(im))] + [loc(geo_local(im)) for _ in range(8)]

    return views


def simclr():
    one = T.Compose([
        T.RandomResizedCrop(224),
        T.RandomHorizontalFlip(),
        T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8),
        T.RandomGrayscale(p=0.2),
        T.RandomApply([T.GaussianBlur(kernel_size=23, sigma=(0.1, 2.0))], p=0.5),
        T.ToTensor(),
        T.Normalize(MEAN, STD),
    ])
    return lambda im: [one(im), one(im)]


class Folder(torch.utils.data.Dataset):
    def __init__(self, root, views):
        self.files = sorted(os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs
                            if f.lower().endswith((".jpg", ".jpeg", ".png", ".webp")))
        self.views = views

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        with Image.open(self.files[i]) as im:
            return self.views(im.convert("RGB"))


def main():
    root = sys.argv[1]
    preset = sys.argv[2] if len(sys.argv) > 2 else "dinov2"
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    data = Folder(root, dinov2() if preset == "dinov2" else simclr())
    loader = torch.utils.data.DataLoader(data, batch_size=64, num_workers=workers,
                                         shuffle=True, pin_memory=False, drop_last=False)
    images = 0
    start = time.perf_counter()
    for _ in range(epochs):
        for batch in loader:
            images += batch[0].shape[0]
    seconds = time.perf_counter() - start
    print(f"views_baseline_img_per_s={images / seconds:.1f} preset={preset} workers={workers} "
          f"images={images} seconds={seconds:.2f}")


if __name__ == "__main__":
    main()
