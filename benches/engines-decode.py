#!/usr/bin/env python3
"""The GPU's JPEG engines decoding a folder and nothing else: the decode-only rate the GPU lane's
engines are held to (large photos: 80% of it or more).

  python3 benches/engines-decode.py DIR [--batch 256] [--epochs 3] [--threads 16] [--nvimgcodec]

NVIDIA DALI's mixed decoder with hw_decoder_load 1 (every image on nvJPEG's hardware backend),
its RGB output left on the GPU: no resize, crop or normalization. Prints images/s and megapixels
a second over --epochs after one warm epoch. Needs DALI (../shared/tools/dali-bench's header says
how to bring it to the GPU machine). --nvimgcodec measures the same decoder without DALI: NVIDIA
nvImageCodec (which DALI decodes with) on its hardware backend alone, a batch in one call, the
next call once it returned; it needs only two of those wheels (nvidia-nvimgcodec-cu13 and
nvidia-nvjpeg, about 29 MB: one transfer), and torch. Files its hardware backend refuses (found
in the warm epoch) are left out of the timed ones, and counted. One call at a time on one thread
is the engines' rate on large photos; on ImageNet-sized files it is that thread's (9,000-12,000
images/s on an H200, where the engines take 27,000-29,000 from gpufeed's threads). Compare with

  gpufeed run DIR --epochs 3 --batch-size 256 --decode hybrid --gpu-share 1 --assisted-share 0

on the same files in the same run (every JPEG the engines take goes to them, resized too).
Every JPEG under DIR (recursively) is read.
"""
import argparse
import os
import struct
import time

ap = argparse.ArgumentParser()
ap.add_argument("dir")
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--threads", type=int, default=16)
ap.add_argument("--nvimgcodec", action="store_true",
                help="nvImageCodec's hardware decoder alone instead of DALI's pipeline")
a = ap.parse_args()
files = sorted(os.path.join(r, f) for r, _, fs in os.walk(a.dir, followlinks=True) for f in fs
               if f.lower().endswith((".jpg", ".jpeg")))
if not files:
    raise SystemExit(f"no JPEG files under {a.dir}")


def read(path):
    with open(path, "rb") as f:
        return f.read()


def pixels(data):
    """Width x height from a JPEG's first start-of-frame marker (0 where none is found)."""
    at = 2
    while at + 9 < len(data):
        if data[at] != 0xFF:
            return 0
        marker = data[at + 1]
        if marker in (0xC0, 0xC1, 0xC2):
            height, width = struct.unpack(">HH", data[at + 5:at + 9])
            return width * height
        length = struct.unpack(">H", data[at + 2:at + 4])[0]
        at += 2 + length
    return 0


# nvImageCodec decodes the files from memory, read once; DALI reads them itself.
data = [read(path) for path in files] if a.nvimgcodec else None
epoch_pixels = sum(pixels(d) for d in data) if data else sum(pixels(read(f)) for f in files)

import torch  # noqa: E402


def report(seconds, images, who):
    print(f"engines decode only ({who}, batch {a.batch}): {images / seconds:.0f} images/s, "
          f"{a.epochs * epoch_pixels / seconds / 1e6:.0f} Mpx/s over {a.epochs} epochs of {len(files)} files")


if a.nvimgcodec:
    from nvidia import nvimgcodec  # noqa: E402

    backend = nvimgcodec.Backend(nvimgcodec.BackendKind.HW_GPU_ONLY, load_hint=1.0)
    decoder = nvimgcodec.Decoder(backends=[backend])

    def epoch():
        refused = []
        for start in range(0, len(data), a.batch):
            images = decoder.decode(data[start:start + a.batch])
            refused += [start + i for i, image in enumerate(images) if image is None]
        torch.cuda.synchronize()
        return refused

    # The files the hardware decoder refuses (its backend takes baseline colour JPEGs of some
    # samplings only) are left out of the timed epochs, and counted.
    refused = set(epoch())
    if refused:
        print(f"left out: {len(refused)} of {len(data)} files the hardware decoder refuses")
        data = [d for i, d in enumerate(data) if i not in refused]
        epoch_pixels = sum(pixels(d) for d in data)
    start = time.perf_counter()
    for _ in range(a.epochs):
        epoch()
    report(time.perf_counter() - start, a.epochs * len(data), "nvImageCodec's hardware decoder")
    raise SystemExit(0)

from nvidia.dali import fn, pipeline_def, types  # noqa: E402


@pipeline_def(batch_size=a.batch, num_threads=a.threads, device_id=0, prefetch_queue_depth=2)
def pipe():
    jpegs, _ = fn.readers.file(files=files, name="R")
    return fn.decoders.image(jpegs, device="mixed", output_type=types.RGB, hw_decoder_load=1.0)


p = pipe()
p.build()
iters = (p.epoch_size("R") + a.batch - 1) // a.batch


def run(epochs):
    start = time.perf_counter()
    for _ in range(epochs * iters):
        p.run()
    # Every decode queued so far done (DALI's streams included).
    torch.cuda.synchronize()
    return time.perf_counter() - start


run(1)
report(run(a.epochs), a.epochs * iters * a.batch, "DALI hw_decoder_load 1")
