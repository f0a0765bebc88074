#!/usr/bin/env python3
"""Dense targets: gpufeed's loader against a torchvision DataLoader on the same files.

The baseline is torchvision's detection reference: `CocoDetection` wrapped by
`wrap_dataset_for_transforms_v2` (boxes, labels, masks), the recipe's v2 transforms on PIL
images, `SanitizeBoundingBoxes`, a DataLoader of WORKERS processes collating lists; or, with
--masks, image/mask pairs through the segmentation recipe. gpufeed runs `gpufeed targets` with
the same recipe and batch size. Both print images per second; the ratio is the last line.

usage: python3 benches/targets-baseline.py IMAGES (--coco FILE | --masks DIR)
           [--recipe lsj|hflip|multiscale|ssdlite|train|eval] [--workers 16] [--batch-size 16]
           [--epochs 1] [--device N] [--gpufeed target/release/gpufeed]

With --device N gpufeed puts each batch on CUDA device N (resized, padded and normalized
there, the masks uploaded); the DataLoader's batches stay in host memory as it makes them.

With --workers 0 the loop runs on one torch thread and also prints images per CPU second (the
per-core comparison; time gpufeed with RAYON_NUM_THREADS=1 and /usr/bin/time).

`lsj`'s FixedSizeCrop lives in torchvision's reference scripts, not in the package: the baseline
runs v2's RandomCrop(1024, pad_if_needed=True) in its place (the same work: a crop and a pad).
"""
import argparse
import json
import pathlib
import subprocess
import time

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2


class Pairs(torch.utils.data.Dataset):
    """Image and PNG mask of the same stem, as tv_tensors."""

    def __init__(self, images, masks, transform):
        self.files = sorted(p for p in pathlib.Path(images).rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        self.images, self.masks, self.transform = pathlib.Path(images), pathlib.Path(masks), transform

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        path = self.files[i]
        image = Image.open(path).convert("RGB")
        mask = self.masks / path.relative_to(self.images).with_suffix(".png")
        target = tv_tensors.Mask(torch.from_numpy(np.array(Image.open(mask)))[None])
        return self.transform(image, target)


def recipe(name):
    mean = (123, 117, 104)
    return {
        "hflip": [v2.RandomHorizontalFlip()],
        "lsj": [v2.ScaleJitter((1024, 1024), antialias=True), v2.RandomCrop(1024, pad_if_needed=True, fill={tv_tensors.Mask: 0, "others": mean}),
                v2.RandomHorizontalFlip()],
        "multiscale": [v2.RandomShortestSize(list(range(480, 801, 32)), 1333), v2.RandomHorizontalFlip()],
        "ssdlite": [v2.RandomIoUCrop(), v2.RandomHorizontalFlip()],
        "train": [v2.RandomResize(260, 1040), v2.RandomHorizontalFlip(),
                  v2.RandomCrop(480, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0})],
        "eval": [v2.Resize(520)],
    }[name]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("images")
    ap.add_argument("--coco")
    ap.add_argument("--masks")
    ap.add_argument("--recipe", default="lsj")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--gpufeed", default="target/release/gpufeed")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of both (the workers kept between them)")
    ap.add_argument("--device", type=int, help="gpufeed's batches on this CUDA device (resized and normalized there)")
    a = ap.parse_args()
    steps = recipe(a.recipe) + [v2.PILToTensor()]
    if a.coco:
        steps += [v2.SanitizeBoundingBoxes()]
        base = torchvision.datasets.CocoDetection(a.images, a.coco, transforms=v2.Compose(steps))
        data = torchvision.datasets.wrap_dataset_for_transforms_v2(base, target_keys={"boxes", "labels", "masks"})
    else:
        data = Pairs(a.images, a.masks, v2.Compose(steps))
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch_size, num_workers=a.workers,
                                         collate_fn=lambda b: tuple(zip(*b)),
                                         persistent_workers=a.workers > 0)
    if a.workers == 0:
        torch.set_num_threads(1)
    start, cpu, n = time.perf_counter(), time.process_time(), 0
    for _ in range(a.epochs):
        for images, _ in loader:
            n += len(images)
    torch_rate = n / (time.perf_counter() - start)
    print(f"torchvision DataLoader ({a.workers} workers): {n} images, {torch_rate:.1f} images/s")
    if a.workers == 0:
        # One process on one thread: its CPU seconds, to compare per core with
        # `RAYON_NUM_THREADS=1 /usr/bin/time gpufeed targets ...`.
        print(f"  {n / (time.process_time() - cpu):.1f} images per CPU second")

    args = [a.gpufeed, "targets", a.images, "--batch-size", str(a.batch_size), "--json",
            "--epochs", str(a.epochs)]
    if a.device is not None:
        args += ["--device", str(a.device)]
    if a.coco:
        args += ["--coco", a.coco, "--detection-recipe", a.recipe]
    else:
        args += ["--masks", a.masks, "--segmentation-recipe", a.recipe]
    summary = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    print(f"gpufeed targets: {summary['images']} images, {summary['images_per_s']:.1f} images/s")
    print(f"ratio: {summary['images_per_s'] / torch_rate:.2f}x")


if __name__ == "__main__":
    main()
