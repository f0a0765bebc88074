#!/usr/bin/env python3
"""gpufeed's torchvision resize (`Patches::torchvision()`) against torchvision's own, on the CPU and
on a CUDA device, without transformers.

    python3 tests/patches_torchvision.py OUT_DIR IMAGE...

OUT_DIR holds what `examples/patches_reference.rs` wrote for the IMAGEs (RGB images). For each,
torchvision resizes the decoded image as a `uint8` tensor to gpufeed's planned size (bicubic,
antialiased: what transformers' Qwen2VLImageProcessor does) on the CPU, where gpufeed must be
identical, and on the GPU when there is one, where torchvision computes in float32 and rounds:
there it prints how many samples differ and by how much. Needs torch, torchvision, Pillow, NumPy.
"""

import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F


def main() -> int:
    out, images = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    failed = passed = 0
    cuda = torch.cuda.is_available()
    differ = total = 0
    largest = 0
    for path in images:
        pixels = out / f"{path.name}.qwen2-vl-torchvision.pixels.npy"
        if not pixels.exists():
            continue
        ours = np.load(pixels)
        h, w = ours.shape[:2]
        tensor = torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)
        resize = lambda t: F.resize(t, [h, w], InterpolationMode.BICUBIC, antialias=True)
        cpu = resize(tensor).permute(1, 2, 0).numpy()
        if np.array_equal(cpu, ours):
            passed += 1
        else:
            failed += 1
            print(f"FAIL {path.name}: {int((cpu != ours).sum())} samples differ on the CPU")
        if cuda:
            gpu = resize(tensor.cuda()).permute(1, 2, 0).cpu().numpy()
            d = np.abs(gpu.astype(np.int16) - ours.astype(np.int16))
            differ += int((d > 0).sum())
            total += d.size
            largest = max(largest, int(d.max()))
    if cuda and total:
        print(
            f"torchvision on {torch.cuda.get_device_name()}: {differ} of {total} samples "
            f"({100 * differ / total:.3f}%) differ from the CPU's, by at most {largest}"
        )
    print(f"torch {torch.__version__}: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
