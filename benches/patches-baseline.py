#!/usr/bin/env python3
"""transformers' image processors over a folder: the baseline of `cargo bench --bench patches`.

Runs Qwen2-VL's and SigLIP2's PIL processors (`Qwen2VLImageProcessorPil`,
`Siglip2ImageProcessorPil`, no torch needed) on every image of a folder, as a server or a
DataLoader runs them: each worker process opens its files with Pillow and calls the processor
on a batch of them (NumPy output). Prints images/s with the given number of worker processes,
and with one (per core), for each processor, with the same budgets as the bench's presets.

    python3 benches/patches-baseline.py /tmp/corpus --workers 16 --batch 32 \\
        --qwen-max-pixels 50176 --siglip-max-patches 256

The first pass over the folder warms the page cache and is not counted; each figure is the
median of `--passes` passes.
"""

import argparse
import os
import statistics
import sys
import time
from multiprocessing import get_context

EXTENSIONS = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}

_processor = None


def files_of(folder):
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            if os.path.splitext(name)[1].lower() in EXTENSIONS:
                found.append(os.path.join(root, name))
    return sorted(found)


def make_processor(name, budget):
    """The PIL processor of `name` with its budget, or its defaults for a budget of 0
    (transformers 5.23 names them `*Pil`; older releases call their PIL/NumPy processor by the
    plain name)."""
    import transformers

    if name == "qwen2-vl":
        cls = getattr(transformers, "Qwen2VLImageProcessorPil", None)
        cls = cls or transformers.Qwen2VLImageProcessor
        return cls(max_pixels=budget, do_convert_rgb=True) if budget else cls(do_convert_rgb=True)
    cls = getattr(transformers, "Siglip2ImageProcessorPil", None)
    cls = cls or transformers.Siglip2ImageProcessor
    if budget:
        return cls(max_num_patches=budget, do_convert_rgb=True)
    return cls(do_convert_rgb=True)


def init_worker(name, budget):
    global _processor
    _processor = make_processor(name, budget)


def run_batch(paths):
    from PIL import Image

    images = []
    for path in paths:
        with Image.open(path) as image:
            image.load()
            images.append(image.copy())
    try:
        out = _processor(images=images, return_tensors="np")
    except ValueError:
        # An image the processor refuses (Qwen2-VL: an aspect ratio over 200) is left out, as
        # gpufeed skips it.
        out = {}
        for image in images:
            try:
                out = _processor(images=[image], return_tensors="np")
            except ValueError:
                pass
    return len(paths), int(out["pixel_values"].shape[0]) if "pixel_values" in out else 0


def one_pass(pool, batches):
    start = time.perf_counter()
    images = sum(n for n, _ in pool.imap_unordered(run_batch, batches))
    return images, time.perf_counter() - start


def measure(name, budget, files, workers, batch, passes):
    batches = [files[i : i + batch] for i in range(0, len(files), batch)]
    context = get_context("fork")
    with context.Pool(workers, initializer=init_worker, initargs=(name, budget)) as pool:
        one_pass(pool, batches)  # warm-up: page cache, imports, first allocations
        times = []
        for _ in range(passes):
            images, seconds = one_pass(pool, batches)
            times.append(seconds)
    return images / statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=32, help="images per processor call")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument(
        "--single-files",
        type=int,
        default=0,
        help="files of the one-process figure (default: all; a few hundred give the same rate sooner)",
    )
    parser.add_argument("--qwen-max-pixels", type=int, default=50176)
    parser.add_argument("--siglip-max-patches", type=int, default=256)
    parser.add_argument(
        "--processors", default="qwen2-vl,siglip2", help="comma-separated: qwen2-vl, siglip2"
    )
    args = parser.parse_args()
    files = files_of(args.folder)
    if not files:
        sys.exit(f"{args.folder}: no images")
    budgets = {"qwen2-vl": args.qwen_max_pixels, "siglip2": args.siglip_max_patches}
    import transformers

    print(
        f"transformers {transformers.__version__}: {len(files)} images, batches of {args.batch}"
    )
    for name in args.processors.split(","):
        budget = budgets[name]
        print(f"{name}: {type(make_processor(name, budget)).__name__}")
        for workers in sorted({args.workers, 1}, reverse=True):
            some = files[: args.single_files] if workers == 1 and args.single_files else files
            rate = measure(name, budget, some, workers, args.batch, args.passes)
            print(
                f"{name:<10} budget {budget:>8}  {workers:>3} processes  {rate:10.1f} images/s"
                f"  ({rate / workers:.1f} per process)"
            )


if __name__ == "__main__":
    main()
