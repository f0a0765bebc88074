#!/usr/bin/env python3
"""transformers' image processors on serving requests: the baseline of `cargo bench --bench serve`.

Times Qwen2-VL's and SigLIP2's PIL processors (`Qwen2VLImageProcessorPil`,
`Siglip2ImageProcessorPil`, found by whichever name the installed transformers gives them) on the
requests the bench serves: requests of 1, 8 and 32 images cycling through a folder's files (read
into memory first, as a server receives them), and one JPEG of about a megapixel. Each request is
timed from its bytes to `pixel_values` (Pillow decode + the processor, NumPy output) and, with
`--device cuda:0` and torch installed, to the tensors on the GPU (uploaded, stream synchronized).
Prints p50 and p99 milliseconds per request, as the bench does.

    python3 benches/serve-baseline.py /tmp/corpus --device cuda:0 --requests 200

Each processor's settings are its defaults, as the bench's presets (`--qwen-max-pixels`,
`--siglip-max-patches` change them).
"""

import argparse
import io
import os
import sys
import time

import numpy as np

def _patches_baseline():
    """benches/patches-baseline.py as a module: its file listing and processors."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "patches-baseline.py")
    spec = importlib.util.spec_from_file_location("patches_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_baseline = _patches_baseline()
files_of = _baseline.files_of
make_processor = _baseline.make_processor


def nearest_megapixel(files, data):
    """The JPEG whose size is nearest to 1,000,000 pixels, as (index, width, height)."""
    from PIL import Image

    best = None
    for i, path in enumerate(files):
        if os.path.splitext(path)[1].lower() not in (".jpg", ".jpeg"):
            continue
        with Image.open(io.BytesIO(data[i])) as image:
            w, h = image.size
        distance = abs(w * h - 1_000_000)
        if best is None or distance < best[0]:
            best = (distance, i, w, h)
    return best[1:] if best else None


def serve_one(processor, request, upload):
    """One request: bytes -> Pillow -> processor -> (optionally) the GPU."""
    from PIL import Image

    images = []
    for data in request:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            images.append(image.copy())
    out = processor(images=images, return_tensors="np")
    if upload is not None:
        torch, device = upload
        tensors = [torch.from_numpy(np.asarray(v)).to(device, non_blocking=False)
                   for v in out.values()]
        torch.cuda.synchronize(device)
        return tensors
    return out


def time_requests(processor, requests, count, upload):
    times = []
    for k in range(count + 3):
        request = requests(k)
        start = time.perf_counter()
        serve_one(processor, request, upload)
        if k >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    p = lambda q: times[max(1, min(len(times), int(np.ceil(q * len(times))))) - 1]
    return p(0.5), p(0.99), sum(times) / len(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--requests", type=int, default=200, help="requests timed per row")
    parser.add_argument("--sizes", default="1,8,32", help="images per request")
    parser.add_argument("--large", help="the one-JPEG row's file (default: nearest 1 Mpx)")
    parser.add_argument("--device", default="cpu", help="cuda:N also times the upload")
    parser.add_argument("--qwen-max-pixels", type=int, default=0, help="0: the default")
    parser.add_argument("--siglip-max-patches", type=int, default=0, help="0: the default")
    parser.add_argument("--processors", default="qwen2-vl,siglip2")
    args = parser.parse_args()
    files = files_of(args.folder)
    if not files:
        sys.exit(f"{args.folder}: no images")
    data = []
    for path in files:
        with open(path, "rb") as f:
            data.append(f.read())
    large = None
    if args.large:
        with open(args.large, "rb") as f:
            large = (os.path.basename(args.large), f.read())
    else:
        found = nearest_megapixel(files, data)
        if found:
            i, w, h = found
            large = (f"{os.path.basename(files[i])} {w}x{h}", data[i])
    upload = None
    if args.device.startswith("cuda"):
        import torch

        upload = (torch, torch.device(args.device))
    import transformers

    print(f"transformers {transformers.__version__}: {len(files)} files, one process, "
          f"to {'the GPU' if upload else 'NumPy'}")
    print(f"{'processor':<28} {'request':<38} {'p50 ms':>9} {'p99 ms':>9} {'mean ms':>9}")
    budgets = {"qwen2-vl": args.qwen_max_pixels, "siglip2": args.siglip_max_patches}
    for name in args.processors.split(","):
        processor = make_processor(name, budgets[name])
        label = type(processor).__name__
        rows = []
        for size in [int(s) for s in args.sizes.split(",")]:
            requests = lambda k, n=size: [data[(k * n + j) % len(data)] for j in range(n)]
            noun = "image" if size == 1 else "images"
            rows.append((f"{size} {noun}", time_requests(processor, requests, args.requests, upload)))
        if large:
            rows.append((f"1 JPEG: {large[0]}",
                         time_requests(processor, lambda k: [large[1]], args.requests, upload)))
        for request, (p50, p99, mean) in rows:
            print(f"{label:<28} {request:<38} {p50:9.3f} {p99:9.3f} {mean:9.3f}")


if __name__ == "__main__":
    main()
