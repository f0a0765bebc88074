#!/usr/bin/env python3
"""bench-formats: the CPU lane per core against Pillow per core, by format, in one run.

For each format (jpeg: make-corpus's ImageNet-like JPEGs; jpeg-restart: the same written again
with restart markers, as cameras write them; png, webp-lossy, webp-lossless: wallpaper-like
1-2 Mpx files from benches/make-formats.py) it prints the images/s of
`gpufeed run DIR --decode cpu --threads 1 --cpu` (the CPU lane on one thread; best of ROUNDS
runs of EPOCHS epochs) and of Pillow on one core (the method of tools/pil-baseline:
decode -> RGB -> Resize(256) BILINEAR -> CenterCrop(224), files read into memory first; best of
ROUNDS), and their ratio. With a CUDA device (nvidia-smi answers) it then runs every format's
folder and a mixed one (the JPEGs and all three other formats) on all threads through each
path: `--decode cpu`, `--decode hybrid`, the default mode and the GPU lane alone
(`--gpu-share 1`), and prints for each the images/s, the SMs' and the JPEG engines' busy share
while it ran (`nvidia-smi dmon`), how many images the CPU threads, the JPEG engines and the
assisted path decoded, and NVIDIA DALI's rate on the JPEG folders where DALI runs (DALI_BENCH,
default ../shared/tools/dali-bench, with DALI_PYTHON, default this Python; its header says how
to bring DALI to the machine).

usage: bench-formats.py GPUFEED [GPUFEED...]   (Pillow needed)
Several builds are run in turn, each beside the same Pillow runs (a row per build).
env: WORK (default /tmp/bench-formats), N_JPEG (default 400), N_OTHER (24 of each other
     format), ROUNDS (3), EPOCHS (3), CPU_TIME (1: images per second of CPU time, for a
     machine others use too), GPU_EPOCHS (8) and GPU_SECONDS (6: the all-thread runs last
     that long, of that many epochs at least), MAKE_CORPUS (default
     ../shared/tools/make-corpus beside the repository), PHOTOS (default ../shared/photos)
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

def dmon_share(samples):
    """The mean `sm` and `jpg` busy percentages of `nvidia-smi dmon -s u` lines (its header names
    the columns; '-' where a GPU has no such unit), or None for a column without samples."""
    columns, seen = None, {"sm": [], "jpg": []}
    for line in samples.splitlines():
        fields = line.split()
        if line.startswith("#"):
            if len(fields) > 1 and fields[1] == "gpu":
                columns = fields[1:]
            continue
        if columns is None or len(fields) != len(columns):
            continue
        for name in seen:
            if name in columns and fields[columns.index(name)].isdigit():
                seen[name].append(int(fields[columns.index(name)]))
    return {name: (sum(v) / len(v) if v else None) for name, v in seen.items()}


def with_dmon(run):
    """`run()`'s result and the GPU's busy shares while it ran (device 0, one sample a second;
    the first sample, taken as the run starts, left out)."""
    dmon = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1", "-i", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        result = run()
    finally:
        dmon.terminate()
        out, _ = dmon.communicate()
    lines = out.splitlines()
    first_data = next((i for i, l in enumerate(lines) if l.strip() and not l.startswith("#")), None)
    if first_data is not None:
        del lines[first_data]
    return result, dmon_share("\n".join(lines))


def percent(v):
    return "n/a" if v is None else f"{v:.0f}%"


GPU_EPOCHS = int(os.environ.get("GPU_EPOCHS", 8))
# The all-thread runs last GPU_SECONDS or more (the engines open for runs of about 2 s and more;
# dmon samples once a second): a folder's epochs are raised from GPU_EPOCHS to fill them, by
# the rate of one epoch in the default mode.
GPU_SECONDS = float(os.environ.get("GPU_SECONDS", 6))


def epochs_for(gpufeed, d):
    """Epochs of `d` for runs of GPU_SECONDS or more, GPU_EPOCHS at least."""
    out = subprocess.run([gpufeed, "run", d, "--json", "--epochs", "1"], check=True,
                         capture_output=True, text=True).stdout
    summary = json.loads(out)
    per_epoch = summary["images"] / max(summary["images_per_s"], 1e-9)
    return max(GPU_EPOCHS, int(GPU_SECONDS / max(per_epoch, 1e-3)) + 1)
# Each path of the whole machine: the CPU threads alone, the GPU lane beside them as the share
# follows their rates (hybrid), the default (automatic) mode, and the GPU lane alone (its JPEG
# engines and assisted path; other formats stay on the CPU threads).
PATHS = [("cpu", ["--decode", "cpu"]), ("hybrid", ["--decode", "hybrid"]), ("default", []),
         ("gpu lane", ["--decode", "hybrid", "--gpu-share", "1"])]
# NVIDIA DALI's pipeline on the JPEG folders: DALI_BENCH (default ../shared/tools/dali-bench),
# run with the Python that imports nvidia.dali (DALI_PYTHON, default this one).
dali_bench = os.environ.get("DALI_BENCH", os.path.join(ROOT, "..", "shared", "tools", "dali-bench"))
dali_python = os.environ.get("DALI_PYTHON", sys.executable)


def dali_rate(d, n_epochs):
    """DALI's images/s on `d` over `n_epochs` (after a warm one), or None where it does not run."""
    if not os.path.isfile(dali_bench):
        return None
    done = subprocess.run([dali_python, dali_bench, d, "--epochs", str(n_epochs)],
                          capture_output=True, text=True)
    rates = [float(w) for line in done.stdout.splitlines() if "images/s" in line
             for w, nxt in zip(line.split(), line.split()[1:]) if nxt.startswith("images/s")
             and w.replace(".", "", 1).replace(",", "").isdigit()]
    return rates[-1] if done.returncode == 0 and rates else None


if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi"], capture_output=True).returncode == 0:
    mixed = os.path.join(work, "mixed")
    if not os.path.isdir(mixed):
        for kind, d in dirs.items():
            if kind != "jpeg-restart":
                shutil.copytree(d, os.path.join(mixed, kind))
    all_dirs = dict(dirs, mixed=mixed)
    print(f"\nall threads, {GPU_SECONDS:.0f} s or more a run; the SMs' and JPEG engines' busy "
          "share by nvidia-smi dmon; decoded by: CPU threads / JPEG engines / assisted path")
    print(f"{'format':<14} {'build':<{width}} {'path':<9} {'images/s':>9} {'SM':>5} {'JPEG':>5}  "
          f"{'decoded by':<20} {'DALI':>8} {'x DALI':>7}")
    for kind, d in all_dirs.items():
        n_epochs = epochs_for(builds[0], d)
        dali = dali_rate(d, n_epochs) if kind.startswith("jpeg") else None
        for _ in range(rounds):
            for gpufeed in builds:
                for path, args in PATHS:
                    def run():
                        out = subprocess.run(
                            [gpufeed, "run", d, "--json", "--epochs", str(n_epochs), *args],
                            check=True, capture_output=True, text=True).stdout
                        return json.loads(out)
                    summary, busy = with_dmon(run)
                    by = summary.get("decoded_by", {})
                    # `gpu` counts the GPU lane's images, the assisted path's among them.
                    assisted = by.get('gpu_assisted', 0)
                    split = f"{by.get('cpu', 0)}/{by.get('gpu', 0) - assisted}/{assisted}"
                    rate = summary["images_per_s"]
                    versus = f"{rate / dali:>6.2f}x" if dali else f"{'':>7}"
                    print(f"{kind:<14} {os.path.basename(gpufeed):<{width}} {path:<9} "
                          f"{rate:>9.0f} {percent(busy['sm']):>5} {percent(busy['jpg']):>5}  "
                          f"{split:<20} {(f'{dali:.0f}' if dali else 'n/a'):>8} {versus}",
                          flush=True)
