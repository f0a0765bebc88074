#!/usr/bin/env python3
"""PyTorch's DataLoader with the uint8-upload technique, the baseline of the pipeline figures:
workers decode with PIL and do torchvision's Resize(256) + CenterCrop(224) on uint8 tensors,
the batch is pinned, moved with non_blocking=True, and converted and normalized to f16 NCHW on
the GPU. Prints images/s of the median of EPOCHS epochs (the first is a warm-up).

usage: python3 benches/dataloader.py DIR [WORKERS] [BATCH] [EPOCHS]   (needs torch, torchvision)
"""
import os
import statistics
import sys
import time

import torch
from PIL import Image
from torchvision import transforms
from torchvision.transforms import functional as F

EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class Files(torch.utils.data.Dataset):
    def __init__(self, root):
        self.paths = sorted(os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs
                            if f.lower().endswith(EXTENSIONS))
        self.transform = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as im:
            return F.pil_to_tensor(self.transform(im.convert("RGB")))


def main():
    root = sys.argv[1]
    workers = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count()
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    epochs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    data = Files(root)
    loader = torch.utils.data.DataLoader(data, batch_size=batch, num_workers=workers,
                                         pin_memory=True, persistent_workers=True)
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    rates = []
    for epoch in range(epochs):
        start, images = time.perf_counter(), 0
        for x in loader:
            x = x.to("cuda", non_blocking=True)
            x = ((x.float() - mean) / std).half()
            images += x.shape[0]
        torch.cuda.synchronize()
        if epoch > 0 or epochs == 1:
            rates.append(images / (time.perf_counter() - start))
    print(f"dataloader_img_per_s={statistics.median(rates):.0f} images={len(data)} "
          f"workers={workers} batch={batch}")


if __name__ == "__main__":
    main()
