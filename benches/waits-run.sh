#!/usr/bin/env bash
# Sleeping against spinning waits for the GPU, and cold starts with and without the kernel cache
# on disk, in turn, on the same files. Run on the GPU machine from the repository root (carry
# .gpu). The earlier behaviour is the same binary with GPUFEED_SPIN_WAITS=1 (waits spin, as CUDA
# does by default) and GPUFEED_KERNEL_CACHE=off (every kernel compiled by NVRTC at start).
# STEPS (default "large imagenet cold"), ROUNDS (default 2).
#   large     camera photos (benches/make-large.py, 2,048 entries an epoch, 3 epochs): the default
#             mode and the GPU lane alone, at batch 256 and 32, and the mix with progressive files
#   imagenet  8,192 make-corpus files, 3 epochs: hybrid with a given share, and the default
#   cold      process start to exit over one epoch of the 8,192 files, default and CPU decode,
#             without the cache, with an empty one, and with the one the run before filled
set -uo pipefail
export PYTHONUNBUFFERED=1
rounds=${ROUNDS:-2}
steps=${STEPS:-large imagenet cold}
want() { [[ " $steps " == *" $1 "* ]]; }
g=${BIN:-.gpu/bin/bin-gpufeed}
summary() { python3 benches/run-summary.py "$@"; }
spin() { GPUFEED_SPIN_WAITS=1 "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if want large; then
  MAKE_ONLY=1 bash benches/large-run.sh >/dev/null
  for round in $(seq "$rounds"); do
    for batch in 256 32; do
      dir=/tmp/entries-baseline
      echo "=== round $round, baseline camera photos, batch $batch, 3 epochs"
      $g run $dir --json --epochs 3 --batch-size $batch --profile | summary "default, waits sleep"
      spin $g run $dir --json --epochs 3 --batch-size $batch --profile | summary "default, waits spin "
      $g run $dir --json --epochs 3 --batch-size $batch --gpu-share 1 --profile | summary "GPU lane, waits sleep"
      spin $g run $dir --json --epochs 3 --batch-size $batch --gpu-share 1 --profile | summary "GPU lane, waits spin "
    done
    echo "=== round $round, mix with progressive files, batch 256, 3 epochs"
    dir=/tmp/entries-mix
    $g run $dir --json --epochs 3 --profile | summary "default, waits sleep"
    spin $g run $dir --json --epochs 3 --profile | summary "default, waits spin "
  done
fi
[ -d /tmp/c8k ] || python3 .gpu/tools/make-corpus /tmp/c8k 8192 0 >/dev/null
if want imagenet; then
  for round in $(seq "$rounds"); do
    echo "=== round $round, 8,192 ImageNet-like files, 3 epochs"
    $g run /tmp/c8k --json --epochs 3 --decode hybrid --gpu-share 0.75 | summary "hybrid 0.75, sleep" | head -1
    spin $g run /tmp/c8k --json --epochs 3 --decode hybrid --gpu-share 0.75 | summary "hybrid 0.75, spin " | head -1
    $g run /tmp/c8k --json --epochs 3 | summary "default, sleep    " | head -1
    spin $g run /tmp/c8k --json --epochs 3 | summary "default, spin     " | head -1
  done
fi
if want cold; then
  cache=$(mktemp -d)
  for round in $(seq "$rounds"); do
    echo "=== round $round, cold: process start to exit, one epoch of 8,192 files"
    rm -rf "$cache"/*
    for run in "default, no cache:off:" "default, empty cache:$cache:" "default, cache filled:$cache:" \
               "CPU, no cache:off:--decode cpu" "CPU, cache filled:$cache:--decode cpu"; do
      IFS=: read -r label folder args <<<"$run"
      start=$(date +%s.%N)
      out=$(GPUFEED_KERNEL_CACHE=$folder $g run /tmp/c8k --json $args 2>/dev/null)
      end=$(date +%s.%N)
      echo "$out" | summary "$label" "$(python3 -c "print($end - $start)")" | head -1
    done
  done
fi
