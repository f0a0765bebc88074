#!/usr/bin/env bash
# A build against another, in turn on the same files: `gpufeed run` of .gpu/bin/bin-gpufeed-base
# (the build compared with) and .gpu/bin/bin-gpufeed, steady (3 epochs) and cold (process start
# to exit over one epoch), with this build's profile. Run on the GPU machine from the repository
# root; ROUNDS rounds (default 2), DIR the folder (default: 8,192 make-corpus files).
set -uo pipefail
export PYTHONUNBUFFERED=1
rounds=${ROUNDS:-2}
dir=${DIR:-/tmp/c8k}
[ -d "$dir" ] || python3 .gpu/tools/make-corpus "$dir" 8192 0 >/dev/null
new=.gpu/bin/bin-gpufeed
base=.gpu/bin/bin-gpufeed-base
nvidia-smi --query-gpu=name --format=csv,noheader
summary() { python3 benches/run-summary.py "$@"; }
for round in $(seq "$rounds"); do
  echo "--- round $round, steady (3 epochs)"
  $base run "$dir" --json --epochs 3 --decode hybrid | summary "base hybrid"
  $new run "$dir" --json --epochs 3 | summary "new auto   "
  $new run "$dir" --json --epochs 3 --decode cpu | summary "new cpu    "
  $base run "$dir" --json --epochs 3 --decode cpu | summary "base cpu   "
done
for round in $(seq "$rounds"); do
  echo "--- round $round, cold (process start to exit, one epoch)"
  for run in "base hybrid:$base --decode hybrid" "base cpu:$base --decode cpu" "new auto:$new" "new cpu:$new --decode cpu"; do
    label=${run%%:*}; cmd=${run#*:}
    read -r bin args <<<"$cmd"
    start=$(date +%s.%N); out=$($bin run "$dir" --json $args 2>/dev/null); end=$(date +%s.%N)
    echo "$out" | summary "$label" "$(python3 -c "print($end - $start)")"
  done
done
