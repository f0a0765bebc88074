#!/usr/bin/env bash
# How the README's GPU figures are made: run on a GPU machine from the repository root, after
# building the executables into .gpu/ (tests, benches, the CLI; see README "Figures").
# Writes logs, CSV and SVG to ${OUT:-/tmp/gpufeed-out}. Steps: all tests with the GPU required,
# compute-sanitizer (memcheck, racecheck) on the GPU tests, the upload bench, the pipeline bench
# on a 2,000-image corpus in rounds with Pillow's rate on the same files, and `gpufeed run` on the GPU vs
# --cpu on that corpus (outputs compared bit for bit), and the partial JPEG decode checked against
# the whole decode on the corpus. STEPS picks steps (default: all of
# "tests sanitizer upload pipeline run").
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/gpufeed-out}
mkdir -p "$out"
corpus=${CORPUS:-/tmp/corpus}
steps=${STEPS:-tests sanitizer upload pipeline run}
want() { [[ " $steps " == *" $1 "* ]]; }
step() { echo; echo "=== $*"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
lscpu | grep -E "^(Model name|Thread|Core|Socket)"

if want tests; then
step "tests (GPUFEED_REQUIRE_GPU=1)"
bash .gpu/run-tests.sh 2>&1 | tee /tmp/tests.log | grep -E "^==|test result|FAILED|panicked"
for t in .gpu/bin/test-gpu; do "$t" --nocapture --test-threads 1 2>&1 | grep -E "pipelines:|epochs of|refused:"; done
fi

if want sanitizer && command -v compute-sanitizer >/dev/null; then
step "compute-sanitizer"
  for tool in memcheck racecheck; do
    for t in .gpu/bin/test-lib-gpufeed .gpu/bin/test-gpu; do
      GPUFEED_REQUIRE_GPU=1 compute-sanitizer --tool $tool --error-exitcode 3 "$t" --test-threads 1 \
        gpu >"/tmp/sanitizer-$tool-$(basename $t).log" 2>&1
      echo "$tool $(basename $t): exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "/tmp/sanitizer-$tool-$(basename $t).log" | tail -1)"
    done
  done
fi

if want upload; then
step "upload bench"
GPUFEED_BENCH_OUT="$out" .gpu/bin/bench-upload 2>&1 | tee "$out/upload.txt"  # + upload.csv, upload.svg
for v in "GPUFEED_NCHW_GROUPS=1" "GPUFEED_NCHW_GROUPS=4" "GPUFEED_STREAMING_STORES=1"; do
  echo "variant $v:"
  env $v GPUFEED_BENCH_BATCHES=256 GPUFEED_BENCH_OUT=/tmp .gpu/bin/bench-upload 2>&1 | grep -A2 "Fused" | tail -1
done
fi

[ -d "$corpus" ] || python3 .gpu/tools/make-corpus "$corpus" 2000
if want pipeline; then
# This machine's CPUs change speed from minute to minute (a shared host): Pillow and the bench
# run in turn, ROUNDS times; compare figures within a round, or medians over the rounds.
for round in $(seq "${ROUNDS:-3}"); do
step "pipeline bench, round $round: Pillow, then gpufeed on the same files"
python3 .gpu/tools/pil-baseline "$corpus" | tee -a "$out/pipeline.txt"
GPUFEED_BENCH_PASSES=${PASSES:-3} GPUFEED_BENCH_EPOCHS=${EPOCHS:-10} GPUFEED_BENCH_DIR="$corpus" \
  GPUFEED_BENCH_THREADS=${THREADS:-1,2,4,8,16} .gpu/bin/bench-pipeline 2>&1 | tee -a "$out/pipeline.txt"
done
step "partial JPEG decode against the whole decode, on the corpus"
GPUFEED_TEST_CORPUS="$corpus" .gpu/bin/test-lib-gpufeed partial_decode 2>&1 | grep -E "^test "
fi

want run || exit 0
step "gpufeed run: GPU vs --cpu"
.gpu/bin/bin-gpufeed run "$corpus" --json | tail -1 | tee -a "$out/run.json"
.gpu/bin/bin-gpufeed run "$corpus" --save /tmp/g.npy >/dev/null
.gpu/bin/bin-gpufeed run "$corpus" --cpu --save /tmp/c.npy --json | tail -1 | tee -a "$out/run.json"
python3 - <<'PY'
import numpy as np
g, c = np.load("/tmp/g.npy"), np.load("/tmp/c.npy")
same = g.shape == c.shape and (g.view(np.uint16) == c.view(np.uint16)).all()
paths = open("/tmp/g.paths.txt").read() == open("/tmp/c.paths.txt").read()
print(f"GPU {g.shape} {g.dtype} vs CPU {c.shape}: identical bits {same}, same paths {paths}, "
      f"max |diff| {np.abs(g.astype(np.float32) - c.astype(np.float32)).max()}")
PY
