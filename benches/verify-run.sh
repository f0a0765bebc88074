#!/usr/bin/env bash
# Every GPU test of the bundle with the GPU required, then the GPU-assisted decode's test and
# bench on camera-size photos. Run on the GPU machine from the repository root (carry .gpu).
set -uo pipefail
export PYTHONUNBUFFERED=1 GPUFEED_REQUIRE_GPU=1
out=${OUT:-/tmp/gpufeed-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( [ -d /tmp/large-mix ] || python3 benches/make-large.py .gpu/photos /tmp/large-mix 96 2 --mix --grain 3 >/dev/null ) &
for t in .gpu/bin/test-*; do
  echo "== $t"
  timeout 300 "$t" --test-threads 4 >"$out/$(basename "$t").log" 2>&1
  echo "exit $?"; grep -E "test result|FAILED|panicked|^test .* \.\.\. FAILED" "$out/$(basename "$t").log" | head -20
done
grep -h "skipped:" "$out"/*.log | head -5
wait
echo "== coefficients bench (16 threads)"
timeout 120 .gpu/bin/bench-coefficients /tmp/large-mix --threads 16 2>&1 | tail -25
