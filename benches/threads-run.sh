#!/usr/bin/env bash
# One process on GPU 0 with a quarter of the machine's cores against all of them, CPU and hybrid
# decoding, this build (.gpu/bin/bin-gpufeed) against another (BASE, default
# .gpu/bin/bin-gpufeed-base, when present), in turn, with each run's profile line (where the
# batch thread's time went: `staging_copy` is the CPU lane's images copied into the staging).
# Run from the repository root with .gpu/ built (../shared/tools/gpu-bundle). N (corpus size,
# default 16384), ROUNDS (default 2), EPOCHS (default 3), DECODES (default "cpu hybrid"), BUILDS
# (the binaries, in turn; default the base and this build).
set -uo pipefail
export PYTHONUNBUFFERED=1
n=${N:-16384}
rounds=${ROUNDS:-2}
epochs=${EPOCHS:-3}
cores=$(nproc)
builds=".gpu/bin/bin-gpufeed"
base=${BASE:-.gpu/bin/bin-gpufeed-base}
[ -x "$base" ] && builds="$base $builds"
builds=${BUILDS:-$builds}
nvidia-smi --query-gpu=index,name --format=csv,noheader | head -1
echo "$cores cores"
[ -d /tmp/threads-corpus ] || python3 .gpu/tools/make-corpus /tmp/threads-corpus "$n" 0 >/dev/null
for decode in ${DECODES:-cpu hybrid}; do
  for round in $(seq "$rounds"); do
    for threads in $((cores / 4)) "$cores"; do
      for g in $builds; do
        CUDA_VISIBLE_DEVICES=0 "$g" run /tmp/threads-corpus --decode "$decode" --epochs "$epochs" \
          --threads "$threads" --json --profile |
          python3 benches/run-summary.py "--decode $decode, round $round, $threads threads, $(basename "$g")"
      done
    done
  done
done
