#!/usr/bin/env bash
# This build against the build before (.gpu/bin/bin-gpufeed-base), in turn, on the same files:
# steady and cold on 8,192 ImageNet-like files, the training recipe's cost, the fidelity of both
# lanes and of the random crops against the local Pillow (its pass order asked for), and the
# resume tests that need a GPU. Run on the GPU machine from the repository root (carry .gpu).
set -uo pipefail
export PYTHONUNBUFFERED=1
rounds=${ROUNDS:-2}
new=.gpu/bin/bin-gpufeed
base=.gpu/bin/bin-gpufeed-base
summary() { python3 benches/run-summary.py "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -d /tmp/c8k ] || python3 .gpu/tools/make-corpus /tmp/c8k 8192 0 >/dev/null
[ -d /tmp/c2k ] || python3 .gpu/tools/make-corpus /tmp/c2k 2000 1 >/dev/null
pil=$(python3 -c "import PIL; print(PIL.__version__)" | cut -d. -f1,2)
echo "=== tests that need the GPU (resume, hybrid)"
GPUFEED_REQUIRE_GPU=1 timeout 120 .gpu/bin/test-gpu hybrid_runs_resume 2>&1 | grep -E "test result|panicked"
GPUFEED_REQUIRE_GPU=1 timeout 120 .gpu/bin/test-cli resume 2>&1 | grep -E "test result|panicked"
for round in $(seq "$rounds"); do
  echo "=== round $round, steady, 3 epochs of 8,192 files"
  $base run /tmp/c8k --json --epochs 3 --decode hybrid | summary "base hybrid"
  $new run /tmp/c8k --json --epochs 3 | summary "new auto   "
  $base run /tmp/c8k --json --epochs 3 --decode cpu | summary "base cpu   "
  $new run /tmp/c8k --json --epochs 3 --decode cpu | summary "new cpu    "
done
for round in $(seq "$rounds"); do
  echo "=== round $round, cold: process start to exit, one epoch"
  for run in "base hybrid:$base --decode hybrid" "new auto:$new" "new cpu:$new --decode cpu" "base cpu:$base --decode cpu"; do
    label=${run%%:*}; cmd=${run#*:}; read -r bin args <<<"$cmd"
    start=$(date +%s.%N); out=$($bin run /tmp/c8k --json $args 2>/dev/null); end=$(date +%s.%N)
    echo "$out" | summary "$label" "$(python3 -c "print($end - $start)")" | head -1
  done
done
echo "=== training recipe: RandomResizedCrop + flip alone vs torchvision's recipe, hybrid, share given, in turn"
for round in $(seq "$rounds"); do
  $new run /tmp/c8k --json --image-folder --epochs 3 --train --decode hybrid --gpu-share 0.75 | summary "train  " | head -1
  $new run /tmp/c8k --json --image-folder --epochs 3 --recipe torchvision-imagenet --decode hybrid --gpu-share 0.75 | summary "recipe " | head -1
done
echo "=== fidelity against Pillow $pil (2,000 files)"
python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil
python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --decode hybrid
python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --decode hybrid --gpu-share 1
python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --train --seed 3
python3 tests/fidelity.py /tmp/c2k $new --pillow-version $pil --train --seed 3 --decode hybrid --gpu-share 1
