#!/usr/bin/env python3
"""What opening the GPU's JPEG engines costs: nvJPEG's hardware handle and decoder states, timed
through ctypes with nothing of gpufeed's in the way.

  python3 benches/nvjpeg-states.py states [--count 4] [--threads]
  python3 benches/nvjpeg-states.py beside DIR [--seconds 1.6]

`states` times `nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE)` and then `--count` calls of
`nvjpegJpegStateCreate`, one after another or each on a thread of its own (`--threads`), and
says whether the allocators given to the handle were called while the states were made. Run it
in several processes at once (one GPU each, `CUDA_VISIBLE_DEVICES`) and beside other work to see
what a rank's engines take to open on a shared machine.

`beside` decodes calls of 64 of DIR's colour baseline JPEGs on one state (RGB on the device,
each call waited for), first alone and then while another thread makes two more states on the
same handle, and compares the calls' times: whether making a state holds the engines back. It
first times what a new state's first calls take (`nvjpegDecodeBatchedInitialize`, then the
first, second and a later call) and a call of another size, which initializes the state again.

Needs a CUDA 13 toolkit's libnvjpeg.so.13 and libcudart (found under /usr/local/cuda*) and a
GPU with JPEG engines (A100, H100, H200, ...).
"""
import argparse
import ctypes
import glob
import os
import threading
import time
from ctypes import byref, c_char_p, c_int, c_size_t, c_uint, c_void_p

BACKEND_HARDWARE = 3
OUTPUT_RGBI = 5
CALL = 64


def libraries():
    found = sorted(
        glob.glob("/usr/local/cuda*/targets/*/lib/libnvjpeg.so.13")
        + glob.glob("/usr/local/cuda*/lib64/libnvjpeg.so.13")
    )
    if not found:
        raise SystemExit("no libnvjpeg.so.13 under /usr/local/cuda*")
    folder = os.path.dirname(found[-1])
    runtime = sorted(glob.glob(folder + "/libcudart.so.13*"))
    if not runtime:
        raise SystemExit(f"no libcudart.so.13 beside {found[-1]}")
    cudart = ctypes.CDLL(runtime[-1], mode=ctypes.RTLD_GLOBAL)
    return cudart, ctypes.CDLL(found[-1])


cudart, nvjpeg = libraries()


def check(what, status):
    if status != 0:
        raise SystemExit(f"{what} failed with status {status}")


def ms(seconds):
    return f"{seconds * 1000:.0f} ms"


# The allocators nvJPEG may be given: each call is counted, then passed to the CUDA runtime.
calls = {"device": 0, "pinned": 0}
DEVICE_MALLOC = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_void_p), c_size_t)
PINNED_MALLOC = ctypes.CFUNCTYPE(c_int, ctypes.POINTER(c_void_p), c_size_t, c_uint)
FREE = ctypes.CFUNCTYPE(c_int, c_void_p)


class DeviceAllocator(ctypes.Structure):
    _fields_ = [("malloc", DEVICE_MALLOC), ("free", FREE)]


class PinnedAllocator(ctypes.Structure):
    _fields_ = [("malloc", PINNED_MALLOC), ("free", FREE)]


def device_malloc(pointer, size):
    calls["device"] += 1
    return cudart.cudaMalloc(pointer, c_size_t(size))


def pinned_malloc(pointer, size, flags):
    calls["pinned"] += 1
    return cudart.cudaHostAlloc(pointer, c_size_t(size), c_uint(flags))


device = DeviceAllocator(DEVICE_MALLOC(device_malloc), FREE(lambda p: cudart.cudaFree(c_void_p(p))))
pinned = PinnedAllocator(
    PINNED_MALLOC(pinned_malloc), FREE(lambda p: cudart.cudaFreeHost(c_void_p(p)))
)


def open_handle(counted):
    cudart.cudaSetDevice(0)
    cudart.cudaFree(c_void_p(0))  # the context, before anything is timed
    handle = c_void_p()
    started = time.perf_counter()
    allocators = (byref(device), byref(pinned)) if counted else (None, None)
    check(
        "nvjpegCreateEx",
        nvjpeg.nvjpegCreateEx(c_int(BACKEND_HARDWARE), *allocators, c_uint(0), byref(handle)),
    )
    return handle, time.perf_counter() - started


def make_state(handle):
    cudart.cudaSetDevice(0)
    state = c_void_p()
    started = time.perf_counter()
    check("nvjpegJpegStateCreate", nvjpeg.nvjpegJpegStateCreate(handle, byref(state)))
    return state, time.perf_counter() - started


def states(args):
    handle, took = open_handle(counted=True)
    before = dict(calls)
    times = [0.0] * args.count

    def one(i):
        times[i] = make_state(handle)[1]

    started = time.perf_counter()
    if args.threads:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(args.count):
            one(i)
    total = time.perf_counter() - started
    how = "each on a thread of its own" if args.threads else "one after another"
    print(f"process {os.getpid()}: handle {ms(took)}")
    print(f"  {args.count} states {how}: {ms(total)} in all, each {', '.join(ms(t) for t in times)}")
    made = {k: calls[k] - before[k] for k in calls}
    print(f"  the handle's allocators called while the states were made: {made}")


class Image(ctypes.Structure):
    _fields_ = [("channel", c_void_p * 4), ("pitch", c_size_t * 4)]


def colour_jpegs(handle, folder):
    """Every colour JPEG under `folder` with its width and height."""
    paths = sorted(
        p
        for p in glob.glob(os.path.join(folder, "**", "*"), recursive=True)
        if p.lower().endswith((".jpg", ".jpeg"))
    )
    found = []
    for path in paths:
        data = open(path, "rb").read()
        components, sampling = c_int(), c_int()
        widths, heights = (c_int * 4)(), (c_int * 4)()
        status = nvjpeg.nvjpegGetImageInfo(
            handle, data, c_size_t(len(data)), byref(components), byref(sampling), widths, heights
        )
        if status == 0 and components.value == 3:
            found.append((data, widths[0], heights[0]))
    return found


def beside(args):
    handle, _ = open_handle(counted=False)
    files = colour_jpegs(handle, args.dir)
    batches = [files[i : i + CALL] for i in range(0, len(files) - CALL + 1, CALL)]
    if not batches:
        raise SystemExit(f"fewer than {CALL} colour JPEGs under {args.dir}")
    state, took = make_state(handle)
    print(f"{len(files)} colour JPEGs, {len(batches)} calls of {CALL}; the decoding state {ms(took)}")
    stream = c_void_p()
    check("cudaStreamCreate", cudart.cudaStreamCreate(byref(stream)))
    def initialize(size):
        started = time.perf_counter()
        check(
            "nvjpegDecodeBatchedInitialize",
            nvjpeg.nvjpegDecodeBatchedInitialize(
                handle, state, c_int(size), c_int(1), c_int(OUTPUT_RGBI)
            ),
        )
        return time.perf_counter() - started

    initialized = initialize(CALL)
    room = max(w * h * 3 for _, w, h in files)
    outputs = []
    for _ in range(CALL):
        pointer = c_void_p()
        check("cudaMalloc", cudart.cudaMalloc(byref(pointer), c_size_t(room)))
        outputs.append(pointer)

    def decode(batch):
        size = len(batch)
        data = (c_char_p * size)(*[b for b, _, _ in batch])
        lengths = (c_size_t * size)(*[len(b) for b, _, _ in batch])
        images = (Image * size)()
        for i, (_, width, _) in enumerate(batch):
            images[i].channel[0] = outputs[i].value
            images[i].pitch[0] = width * 3
        status = nvjpeg.nvjpegDecodeBatched(handle, state, data, lengths, images, stream)
        check("cudaStreamSynchronize", cudart.cudaStreamSynchronize(stream))
        check("nvjpegDecodeBatched", status)

    def timed(batch):
        started = time.perf_counter()
        decode(batch)
        return time.perf_counter() - started

    first, second = timed(batches[0]), timed(batches[1 % len(batches)])
    later = [timed(batches[i % len(batches)]) for i in range(2, 8)]
    again = initialize(CALL - 1)
    other = timed(batches[0][: CALL - 1])
    back = initialize(CALL)
    print(
        f"a new state: initialized in {ms(initialized)}, its first call {ms(first)}, the second "
        f"{ms(second)}, later ones {ms(sorted(later)[len(later) // 2])}; initialized again for "
        f"{CALL - 1} images {ms(again)} (that call {ms(other)}), and back {ms(back)}"
    )
    for made_beside in (False, True):
        spans = []

        def make_two():
            time.sleep(0.3)
            for _ in range(2):
                started = time.perf_counter()
                make_state(handle)
                spans.append((started, time.perf_counter()))

        maker = threading.Thread(target=make_two) if made_beside else None
        if maker:
            maker.start()
        timed = []
        ends = time.perf_counter() + args.seconds
        i = 0
        while time.perf_counter() < ends:
            started = time.perf_counter()
            decode(batches[i % len(batches)])
            timed.append((started, time.perf_counter()))
            i += 1
        if maker:
            maker.join()
        low = min((s for s, _ in spans), default=float("inf"))
        high = max((e for _, e in spans), default=0.0)
        during = [e - s for s, e in timed if e > low and s < high]
        other = [e - s for s, e in timed if not (e > low and s < high)]

        def median(values):
            return f"{sorted(values)[len(values) // 2] * 1000:.2f} ms" if values else "-"

        what = "two states made beside" if made_beside else "nothing beside"
        print(
            f"{what}: {len(timed)} calls, median {median(other)} a call, {median(during)} "
            f"while the states were made ({len(during)} calls); the longest "
            f"{max(e - s for s, e in timed) * 1000:.1f} ms"
            + (f"; the states {', '.join(ms(e - s) for s, e in spans)}" if spans else "")
        )


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
modes = parser.add_subparsers(dest="mode", required=True)
timing = modes.add_parser("states", help="time the handle and --count states")
timing.add_argument("--count", type=int, default=4)
timing.add_argument("--threads", action="store_true")
overlap = modes.add_parser("beside", help="decode calls while states are made beside them")
overlap.add_argument("dir")
overlap.add_argument("--seconds", type=float, default=1.6)
arguments = parser.parse_args()
states(arguments) if arguments.mode == "states" else beside(arguments)
