#!/usr/bin/env bash
# This build against the build before (.gpu/bin/bin-gpufeed-base), in turn, on the same files:
# camera photos in the default mode (the GPU lane starting with its assisted path while its
# engines open), ImageNet-sized files steady, cold starts (process start to exit) and the other
# outputs, with NVIDIA DALI's mixed decoder on the same files (photos, ImageNet-sized, cold) when
# it is importable. Run on the GPU machine from the repository root (carry .gpu). BASE_ENV
# (default empty) is put before the base binary's runs. STEPS (default "large imagenet cold"),
# ROUNDS (default 2), BATCHES (default "256 32"), IMAGENET_EPOCHS (default 3), SETS (the large
# photo sets, default "baseline mix"; see benches/large-run.sh), OUTPUT_EPOCHS (default 5),
# OUTPUT_ARGS (default empty: added to every run of the outputs step, e.g. "--gpu-share 1"),
# VIEWS_THREADS (default empty: CPU-lane thread counts, e.g. "6 8", each a further run of this
# build's views in the outputs step).
#   large     benches/make-large.py's two sets, 2,048 entries an epoch, 3 epochs: the default
#             mode, this build and the build before; the GPU lane alone (--gpu-share 1) once
#   imagenet  8,192 make-corpus files, IMAGENET_EPOCHS epochs: the default mode and hybrid with a
#             given share
#   cold      one epoch of the 8,192 files, process start to exit: the default and CPU decode
#   outputs   the 8,192 files, OUTPUT_EPOCHS epochs from process start, the default mode: the
#             fixed crop, Qwen2-VL's patch sequences (max_pixels 50,176), training crops and
#             DINOv2's ten views
set -uo pipefail
export PYTHONUNBUFFERED=1
rounds=${ROUNDS:-2}
steps=${STEPS:-large imagenet cold}
want() { [[ " $steps " == *" $1 "* ]]; }
new=.gpu/bin/bin-gpufeed
base() { env ${BASE_ENV:-} .gpu/bin/bin-gpufeed-base "$@"; }
summary() { python3 benches/run-summary.py "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
dali=""
python3 -c "import nvidia.dali" 2>/dev/null && [ -f .gpu/tools/dali-bench ] && dali=.gpu/tools/dali-bench
if want large; then
  MAKE_ONLY=1 bash benches/large-run.sh >/dev/null
  for round in $(seq "$rounds"); do
    for set in ${SETS:-baseline mix}; do
      for batch in ${BATCHES:-256 32}; do
        dir=/tmp/entries-$set
        echo "=== round $round, $set photos, batch $batch, 3 epochs"
        base run $dir --json --epochs 3 --batch-size $batch --profile | summary "before, default"
        $new run $dir --json --epochs 3 --batch-size $batch --profile | summary "this,   default"
        if [ "$round" = 1 ]; then
          $new run $dir --json --epochs 3 --batch-size $batch --gpu-share 1 | summary "this,   GPU lane" | head -1
        fi
        if [ -n "$dali" ]; then
          echo "DALI mixed decoder: $(python3 "$dali" "$dir" --batch "$batch" --epochs 3 2>/dev/null | tail -1)"
        fi
      done
    done
  done
fi
[ -d /tmp/c8k ] || python3 .gpu/tools/make-corpus /tmp/c8k 8192 0 >/dev/null
if want imagenet; then
  for round in $(seq "$rounds"); do
    n=${IMAGENET_EPOCHS:-3}
    echo "=== round $round, 8,192 ImageNet-like files, $n epochs"
    base run /tmp/c8k --json --epochs $n | summary "before, default   " | head -1
    $new run /tmp/c8k --json --epochs $n | summary "this,   default   " | head -1
    base run /tmp/c8k --json --epochs $n --decode hybrid --gpu-share 0.75 | summary "before, hybrid 0.75" | head -1
    $new run /tmp/c8k --json --epochs $n --decode hybrid --gpu-share 0.75 | summary "this,   hybrid 0.75" | head -1
    if [ -n "$dali" ]; then
      echo "DALI mixed decoder, $((n - 1)) epochs after a warm one: $(python3 "$dali" /tmp/c8k --epochs $((n - 1)) 2>/dev/null | tail -1)"
    fi
  done
fi
if want cold; then
  for round in $(seq "$rounds"); do
    echo "=== round $round, cold: process start to exit, one epoch of 8,192 files"
    for run in "before, default:base:" "this,   default:this:" "before, CPU:base:--decode cpu" "this,   CPU:this:--decode cpu"; do
      IFS=: read -r label which args <<<"$run"
      start=$(date +%s.%N)
      if [ "$which" = base ]; then out=$(base run /tmp/c8k --json $args 2>/dev/null)
      else out=$($new run /tmp/c8k --json $args 2>/dev/null); fi
      end=$(date +%s.%N)
      echo "$out" | summary "$label" "$(python3 -c "print($end - $start)")" | head -1
    done
    if [ -n "$dali" ]; then
      echo "DALI mixed decoder, cold: $(python3 "$dali" /tmp/c8k --cold 2>/dev/null | tail -1)"
    fi
  done
fi
if want outputs; then
  n=${OUTPUT_EPOCHS:-5}
  for round in $(seq "$rounds"); do
    echo "=== round $round, each output on the 8,192 files, $n epochs from process start"
    for output in "fixed crop:" "Qwen2-VL:--patches qwen2-vl --max-pixels 50176" "training:--train" \
      "DINOv2 views:--views dinov2"; do
      IFS=: read -r label args <<<"$output"
      base run /tmp/c8k --json --epochs $n $args ${OUTPUT_ARGS:-} | summary "before, $label" | head -1
      $new run /tmp/c8k --json --epochs $n $args ${OUTPUT_ARGS:-} | summary "this,   $label" | head -1
    done
    for t in ${VIEWS_THREADS:-}; do
      $new run /tmp/c8k --json --epochs $n --views dinov2 --threads $t ${OUTPUT_ARGS:-} |
        summary "this,   DINOv2 views, --threads $t" | head -1
    done
  done
fi
