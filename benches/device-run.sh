#!/usr/bin/env bash
# How the README's GPU figures are made: run on the GPU machine from the repository root, after
# building the executables into .gpu/ (../shared/tools/gpu-bundle; see docs/figures.md).
# Writes logs, CSV and SVG to ${OUT:-/tmp/gpufeed-out}. STEPS picks steps (default: all of
# "tests sanitizer upload pipeline hybrid large train fidelity serve"):
#   tests      every test executable with the GPU required
#   sanitizer  compute-sanitizer memcheck and racecheck on the GPU unit tests and hybrid tests
#   upload     the u8-vs-f32 upload and kernel bench
#   pipeline   the pipeline bench on a 2,000-image corpus, in ROUNDS rounds, each after Pillow
#   hybrid     gpufeed run --decode cpu, auto (the default) and hybrid with the share following
#              the lanes, in turn, on 8,192 files (host CPU time per image too), and --cpu
#              against the GPU path
#   cold       process start to exit over one epoch of 8,192 files, each decode mode, in turn
#   large      camera-size JPEGs (benches/make-large.py): PyTorch's DataLoader vs gpufeed
#   train      the training transform per core: Pillow (torchvision) vs the CPU stage, in turn
#   fidelity   every output mode against Pillow on 2,000 files (CPU, hybrid, the engines alone,
#              training crops on both lanes), and --dct-scaling on real photos
#   serve      the patch server's latency per request (1, 8, 32 images of 2,000 files; one
#              0.9 Mpx JPEG) beside transformers' PIL processors on the same requests
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpufeed-out}
mkdir -p "$out"
steps=${STEPS:-tests sanitizer upload pipeline hybrid cold large train fidelity serve}
rounds=${ROUNDS:-3}
want() { [[ " $steps " == *" $1 "* ]]; }
step() { echo; echo "=== $*"; }
g=.gpu/bin/bin-gpufeed

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
lscpu | grep -E "^(Model name|Thread|Core|Socket)"

# The corpora, made in the background while the tests run.
( [ -d /tmp/c8k ] || python3 .gpu/tools/make-corpus /tmp/c8k 8192 0 >/dev/null
  [ -d /tmp/c2k ] || python3 .gpu/tools/make-corpus /tmp/c2k 2000 1 >/dev/null
  [ -d /tmp/large ] || python3 benches/make-large.py .gpu/photos /tmp/large 96 1 ) &

if want tests; then
  step "tests (GPUFEED_REQUIRE_GPU=1)"
  bash .gpu/run-tests.sh >"$out/tests.log" 2>&1; echo "run-tests exit $?"
  grep -E "^==|test result|FAILED|panicked" "$out/tests.log"
  GPUFEED_REQUIRE_GPU=1 .gpu/bin/test-gpu --test-threads 1 --nocapture hybrid_ 2>&1 \
    | grep -E "20 epochs|training crops|hybrid vs Pillow|test result"
fi

if want sanitizer && ! command -v compute-sanitizer >/dev/null; then
  step "compute-sanitizer: not on PATH, skipped"
elif want sanitizer; then
  step "compute-sanitizer"
  for tool in memcheck racecheck; do
    GPUFEED_REQUIRE_GPU=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 3 \
      .gpu/bin/test-lib-gpufeed --test-threads 1 cuda >"/tmp/san-$tool.log" 2>&1
    echo "$tool lib cuda: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "/tmp/san-$tool.log" | tail -1)"
  done
  GPUFEED_REQUIRE_GPU=1 timeout 200 compute-sanitizer --tool memcheck --error-exitcode 3 \
    .gpu/bin/test-gpu --test-threads 1 hybrid_random hybrid_accounts >/tmp/san-hybrid.log 2>&1
  echo "memcheck gpu hybrid: exit $? $(grep -E 'ERROR SUMMARY' /tmp/san-hybrid.log | tail -1)"
fi

wait  # the corpora: the benches below run on a quiet machine
if want upload; then
  step "upload bench"
  GPUFEED_BENCH_OUT="$out" .gpu/bin/bench-upload 2>&1 | tee "$out/upload.txt"  # + upload.csv, .svg
fi

# One `gpufeed run` with the process's CPU time per image.
cat >/tmp/timed.py <<'PY'
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[2:], capture_output=True, text=True)
u = resource.getrusage(resource.RUSAGE_CHILDREN)
try:
    j = json.loads(r.stdout.strip().splitlines()[-1])
except Exception:
    print("FAILED", r.returncode, r.stderr[-1500:]); sys.exit(1)
cpu = u.ru_utime + u.ru_stime
epochs = " ".join(f"{e['images'] / max(e['seconds'], 1e-9):.0f}" for e in j["epochs"])
print(f"{sys.argv[1]}: {j['images_per_s']:.0f} img/s (epochs {epochs}), {j['images']} images, "
      f"skipped {j['skipped']}, by {j['decoded_by']}, share {j['gpu_share']}, "
      f"setup {j['setup_seconds']:.2f} s, host CPU {1e3*cpu/max(1,j['images']):.3f} ms/img; "
      f"{j.get('decode', '')}")
PY

if want pipeline; then
  step "partial decode against whole decode on every corpus file"
  GPUFEED_TEST_CORPUS=/tmp/c2k .gpu/bin/test-lib-gpufeed partial_decode 2>&1 | grep -E "test result|FAILED|panicked"
  for round in $(seq "$rounds"); do
    step "pipeline bench, round $round: Pillow, then gpufeed on the same files"
    python3 .gpu/tools/pil-baseline /tmp/c2k | tee -a "$out/pipeline.txt"
    GPUFEED_BENCH_PASSES=3 GPUFEED_BENCH_EPOCHS=5 GPUFEED_BENCH_DIR=/tmp/c2k \
      GPUFEED_BENCH_THREADS=${THREADS:-1,16} .gpu/bin/bench-pipeline 2>&1 | tee -a "$out/pipeline.txt"
  done
fi

if want hybrid; then
  step "--decode cpu, auto and hybrid: 8,192 files, 3 epochs a run, in turn"
  for round in $(seq "$rounds"); do
    python3 /tmp/timed.py "round $round cpu   " $g run /tmp/c8k --json --epochs 3 --decode cpu
    python3 /tmp/timed.py "round $round auto  " $g run /tmp/c8k --json --epochs 3
    python3 /tmp/timed.py "round $round hybrid" $g run /tmp/c8k --json --epochs 3 --decode hybrid
  done
  python3 /tmp/timed.py "training, cpu   " $g run /tmp/c8k --json --epochs 3 --train --decode cpu
  python3 /tmp/timed.py "training, hybrid" $g run /tmp/c8k --json --epochs 3 --train --decode hybrid
  step "--cpu against the GPU path (CPU decode, the same threads), in turn"
  for round in $(seq "$rounds"); do
    python3 /tmp/timed.py "round $round GPU path" $g run /tmp/c8k --json --epochs 2
    python3 /tmp/timed.py "round $round --cpu   " $g run /tmp/c8k --json --epochs 2 --cpu
  done
fi

if want cold; then
  step "cold: process start to exit, one epoch of 8,192 files, in turn"
  for round in $(seq "$rounds"); do
    for mode in cpu auto hybrid; do
      start=$(date +%s.%N)
      $g run /tmp/c8k --json --decode $mode >/tmp/cold.json
      end=$(date +%s.%N)
      python3 -c "import json; j=json.load(open('/tmp/cold.json')); s=$end-$start; print(f'round $round $mode: {s:.2f} s start to exit, {j[\"images\"]/s:.0f} images/s; setup {j[\"setup_seconds\"]:.2f} s, by {j[\"decoded_by\"]}')"
    done
  done
fi

if want large; then
  step "camera-size JPEGs: the DataLoader (batch 8: 12 batches an epoch for its 16 workers) vs gpufeed (batch 32), in turn"
  for round in $(seq "$rounds"); do
    python3 benches/dataloader.py /tmp/large 16 8 5
    python3 /tmp/timed.py "round $round cpu   " $g run /tmp/large --json --epochs 5 --batch-size 32 --decode cpu
    python3 /tmp/timed.py "round $round hybrid" $g run /tmp/large --json --epochs 5 --batch-size 32 --decode hybrid
  done
fi

if want train; then
  step "training transform per core: Pillow (torchvision) vs the CPU stage at 1 and 16 threads, in turn"
  for round in $(seq "$rounds"); do
    python3 benches/pil-train.py /tmp/c2k
    GPUFEED_BENCH_TRAIN=1 GPUFEED_BENCH_PASSES=3 GPUFEED_BENCH_EPOCHS=1 GPUFEED_BENCH_WHOLE=0 \
      GPUFEED_BENCH_DIR=/tmp/c2k GPUFEED_BENCH_THREADS=1,16 .gpu/bin/bench-pipeline 2>&1 | grep "CPU stage"
  done
fi

if want fidelity; then
  step "fidelity against Pillow (2,000 files)"
  python3 tests/fidelity.py /tmp/c2k $g
  python3 tests/fidelity.py /tmp/c2k $g --decode hybrid
  python3 tests/fidelity.py /tmp/c2k $g --decode hybrid --gpu-share 1
  python3 tests/fidelity.py /tmp/c2k $g --train --seed 3
  python3 tests/fidelity.py /tmp/c2k $g --train --seed 3 --decode hybrid --gpu-share 1
  step "--dct-scaling on the shared photos at their own size and on camera-size JPEGs"
  mkdir -p /tmp/real && cp .gpu/photos/*.jpg .gpu/photos/*.png /tmp/real/ 2>/dev/null
  for d in /tmp/real /tmp/large; do
    python3 tests/fidelity.py $d $g
    python3 tests/fidelity.py $d $g --dct-scaling
    for a in "" "--dct-scaling"; do
      $g run $d --cpu --threads 1 --epochs 3 --json $a \
        | python3 -c "import json,sys; print('$d, 1 thread $a:', round(json.load(sys.stdin)['images_per_s'], 1), 'img/s')"
    done
  done
fi

if want serve; then
  step "serve: the patch server's latency beside transformers' processors, in turn"
  for round in $(seq "$rounds"); do
    GPUFEED_BENCH_DIR=/tmp/c2k GPUFEED_BENCH_LARGE=assets/hubble_deep_field.jpg \
      GPUFEED_BENCH_CPU_THREADS=0 .gpu/bin/bench-serve 2>&1 | tee -a "$out/serve.txt"
    if python3 -c "import transformers" 2>/dev/null; then
      python3 benches/serve-baseline.py /tmp/c2k --large assets/hubble_deep_field.jpg \
        --device cuda:0 2>&1 | tee -a "$out/serve.txt"
    else
      echo "serve baseline: transformers is not installed" | tee -a "$out/serve.txt"
    fi
  done
fi
