#!/usr/bin/env python3
"""bench-formats: the CPU lane per core against Pillow per core, by format, in one run.

For each format (jpeg: make-corpus's ImageNet-like JPEGs; jpeg-restart: the same written again
with restart markers, as cameras write them; png, webp-lossy, webp-lossless: wallpaper-like
1-2 Mpx files from benches/make-formats.py) it prints the images/s of
`gpufeed run DIR --decode cpu --threads 1 --cpu` (the CPU lane on one thread; best of ROUNDS
runs of EPOCHS epochs) and of Pillow on one core (the method of tools/pil-baseline:
decode -> RGB -> Resize(256) BILINEAR -> CenterCrop(224), files read into memory first; best of
ROUNDS), and their ratio. With a CUDA device (nvidia-smi answers) it also runs a mixed folder
(the JPEGs and all three other formats) through the default mode, `--decode hybrid` and
`--decode cpu`, all threads, and prints the three rates.

usage: bench-formats.py GPUFEED [GPUFEED...]   (Pillow needed)
Several builds are run in turn, each beside the same Pillow runs (a row per build).
env: WORK (default /tmp/bench-formats), N_JPEG (default 400), N_OTHER (24 of each other
     format), ROUNDS (3), EPOCHS (3), CPU_TIME (1: images per second of CPU time, for a
     machine others use too), MAKE_CORPUS (default ../shared/tools/make-corpus beside the
     repository), PHOTOS (default ../shared/photos)
"""
import io, json, os, resource, shutil, subprocess, sys, time
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
builds = sys.argv[1:]
if not builds:
    sys.exit(__doc__)
work = os.environ.get("WORK", "/tmp/bench-formats")
n_jpeg = int(os.environ.get("N_JPEG", 400))
n_other = int(os.environ.get("N_OTHER", 24))
rounds = int(os.environ.get("ROUNDS", 3))
epochs = int(os.environ.get("EPOCHS", 3))
make_corpus = os.environ.get("MAKE_CORPUS", os.path.join(ROOT, "..", "shared", "tools", "make-corpus"))
photos = os.environ.get("PHOTOS", os.path.join(ROOT, "..", "shared", "photos"))
# CPU_TIME=1: rates per second of CPU time rather than of wall time (for a machine others use).
CPU_TIME = os.environ.get("CPU_TIME") == "1"

dirs = {"jpeg": os.path.join(work, "jpeg")}
for kind in ("png", "webp-lossy", "webp-lossless"):
    dirs[kind] = os.path.join(work, "formats", kind)
if not os.path.isdir(dirs["jpeg"]):
    subprocess.run([sys.executable, make_corpus, dirs["jpeg"], str(n_jpeg)], check=True)
if not os.path.isdir(dirs["png"]):
    subprocess.run([sys.executable, os.path.join(HERE, "make-formats.py"), photos,
                    os.path.join(work, "formats"), str(n_other), dirs["jpeg"]], check=True)
# The same JPEGs with restart markers every 8 MCUs, as cameras write them (libjpeg-turbo decodes
# those on its slow path; gpufeed's Huffman decoder does not).
dirs["jpeg-restart"] = os.path.join(work, "jpeg-restart")
if not os.path.isdir(dirs["jpeg-restart"]):
    os.makedirs(dirs["jpeg-restart"])
    for root, _, names in os.walk(dirs["jpeg"]):
        for name in sorted(names):
            with Image.open(os.path.join(root, name)) as im:
                if im.mode in ("RGB", "L"):
                    im.save(os.path.join(dirs["jpeg-restart"], name), quality=90,
                            restart_marker_blocks=8)


def pillow_rate(d, R=256, C=224):
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs)
    data = [open(f, "rb").read() for f in files]

    def stage(b):
        im = Image.open(io.BytesIO(b)).convert("RGB")
        w, h = im.size
        nw, nh = (R, int(R * h / w)) if w <= h else (int(R * w / h), R)
        im = im.resize((nw, nh), Image.BILINEAR)
        left, top = int(round((nw - C) / 2.0)), int(round((nh - C) / 2.0))
        return im.crop((left, top, left + C, top + C)).tobytes()

    for b in data[:20]:
        stage(b)
    clock = time.process_time if CPU_TIME else time.perf_counter
    t = clock()
    for b in data:
        stage(b)
    return len(data) / (clock() - t)


def gpufeed_rate(gpufeed, d, *args, cpu_time=False):
    """images/s of a run; with `cpu_time`, images per second of the process's CPU time (user
    and system, start-up and reading included): the rate per core on a busy machine too."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([gpufeed, "run", d, "--json", "--epochs", str(epochs), *args],
                         check=True, capture_output=True, text=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = json.loads(out)
    if not cpu_time:
        return summary["images_per_s"]
    used = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return summary["images"] / used


width = max(len(os.path.basename(b)) for b in builds)
print(f"{'format':<14} {'build':<{width}} {'gpufeed 1 thread':>17} {'Pillow 1 core':>14} {'ratio':>6}")
for kind, d in dirs.items():
    ours, theirs = [0.0] * len(builds), 0.0
    for _ in range(rounds):  # in turn, so that all see the same machine
        for k, gpufeed in enumerate(builds):
            rate = gpufeed_rate(gpufeed, d, "--decode", "cpu", "--threads", "1", "--cpu",
                                cpu_time=CPU_TIME)
            ours[k] = max(ours[k], rate)
        theirs = max(theirs, pillow_rate(d))
    for gpufeed, rate in zip(builds, ours):
        name = os.path.basename(gpufeed)
        print(f"{kind:<14} {name:<{width}} {rate:>17.1f} {theirs:>14.1f} {rate / theirs:>5.2f}x",
              flush=True)

if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0:
    mixed = os.path.join(work, "mixed")
    if not os.path.isdir(mixed):
        for kind, d in dirs.items():
            if kind != "jpeg-restart":
                shutil.copytree(d, os.path.join(mixed, kind))
    for _ in range(rounds):
        for gpufeed in builds:
            rates = {mode: gpufeed_rate(gpufeed, mixed, *args) for mode, args in
                     [("default", []), ("hybrid", ["--decode", "hybrid"]),
                      ("cpu", ["--decode", "cpu"])]}
            print(f"mixed folder, all threads, {os.path.basename(gpufeed)}: "
                  + ", ".join(f"{mode} {rate:.0f}" for mode, rate in rates.items())
                  + " images/s", flush=True)
