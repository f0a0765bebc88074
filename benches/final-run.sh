#!/usr/bin/env bash
# This build against the build before (.gpu/bin/bin-gpufeed-base), in turn, on the same files:
# per core (one thread, CPU decode, with Pillow's per-core speed on the same files), steady and
# cold on 8,192 ImageNet-like files, the training recipe's cost, the fidelity of both lanes, the
# random crops and the recipe's rows against the local Pillow and torchvision. Run on the GPU
# machine from the repository root (carry .gpu). STEPS (default "percore steady long cold
# recipe fidelity augment"), ROUNDS (default 2).
set -uo pipefail
export PYTHONUNBUFFERED=1
rounds=${ROUNDS:-2}
steps=${STEPS:-percore steady long cold recipe fidelity augment}
want() { [[ " $steps " == *" $1 "* ]]; }
new=.gpu/bin/bin-gpufeed
base=.gpu/bin/bin-gpufeed-base
summary() { python3 benches/run-summary.py "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d /tmp/c8k ] || python3 .gpu/tools/make-corpus /tmp/c8k 8192 0 >/dev/null
[ -d /tmp/c2k ] || python3 .gpu/tools/make-corpus /tmp/c2k 2000 1 >/dev/null
pil=$(python3 -c "import PIL; print(PIL.__version__)" | cut -d. -f1,2)
if want percore; then
  echo "=== per core: one thread, CPU decode, 2 epochs of 2,000 files, in turn; Pillow $pil alone"
  for round in $(seq $((rounds + 1))); do
    $base run /tmp/c2k --json --epochs 2 --decode cpu --threads 1 | summary "base 1 thread" | head -1
    $new run /tmp/c2k --json --epochs 2 --decode cpu --threads 1 | summary "new 1 thread " | head -1
    python3 .gpu/tools/pil-baseline /tmp/c2k
  done
fi
if want steady; then
  for round in $(seq "$rounds"); do
    echo "=== round $round, steady, 3 epochs of 8,192 files"
    $base run /tmp/c8k --json --epochs 3 --decode hybrid | summary "base hybrid"
    $new run /tmp/c8k --json --epochs 3 --decode hybrid | summary "new hybrid "
    $new run /tmp/c8k --json --epochs 3 | summary "new auto   "
    $base run /tmp/c8k --json --epochs 3 --decode cpu | summary "base cpu   "
    $new run /tmp/c8k --json --epochs 3 --decode cpu | summary "new cpu    "
  done
fi
if want long; then
  for round in $(seq "$rounds"); do
    echo "=== round $round, a longer run: 12 epochs of 8,192 files (the share following the lanes)"
    $base run /tmp/c8k --json --epochs 12 --decode hybrid | summary "base hybrid" | head -1
    $new run /tmp/c8k --json --epochs 12 --decode hybrid | summary "new hybrid " | head -1
    $new run /tmp/c8k --json --epochs 12 --decode hybrid --gpu-share 0.75 | summary "new 0.75   " | head -1
  done
fi
if want cold; then
  for round in $(seq "$rounds"); do
    echo "=== round $round, cold: process start to exit, one epoch"
    for run in "base hybrid:$base --decode hybrid" "new hybrid:$new --decode hybrid" "new auto:$new" "new cpu:$new --decode cpu" "base cpu:$base --decode cpu"; do
      label=${run%%:*}; cmd=${run#*:}; read -r bin args <<<"$cmd"
      start=$(date +%s.%N); out=$($bin run /tmp/c8k --json $args 2>/dev/null); end=$(date +%s.%N)
      echo "$out" | summary "$label" "$(python3 -c "print($end - $start)")" | head -1
    done
  done
fi
if want recipe; then
  echo "=== training recipe: RandomResizedCrop + flip alone vs torchvision's recipe, hybrid, share given, in turn"
  for round in $(seq "$rounds"); do
    $new run /tmp/c8k --json --image-folder --epochs 3 --train --decode hybrid --gpu-share 0.75 | summary "train  " | head -1
    $new run /tmp/c8k --json --image-folder --epochs 3 --recipe torchvision-imagenet --decode hybrid --gpu-share 0.75 | summary "recipe " | head -1
  done
fi
if want fidelity; then
  echo "=== fidelity against Pillow $pil (2,000 files)"
  python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil
  python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --decode hybrid
  python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --decode hybrid --gpu-share 1
  python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --train --seed 3
  python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --train --seed 3 --decode hybrid --gpu-share 1
fi
if want augment; then
  echo "=== the recipe's rows against torchvision (2,000 files, the augment kernel on the GPU)"
  if python3 -c "import torchvision" 2>/dev/null; then
    python3 tests/augment_fidelity.py /tmp/c2k $new --pillow-version $pil --recipe torchvision-imagenet --decode hybrid --gpu-share 1
    python3 tests/augment_fidelity.py /tmp/c2k $new --pillow-version $pil --recipe torchvision-imagenet --decode cpu
  else
    echo "no torchvision here"
  fi
fi
