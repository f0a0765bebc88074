#!/usr/bin/env bash
# The hand-off of batches to other code, checked on a GPU machine, from the repository root,
# with .gpu/ (executables: ../shared/tools/gpu-bundle) and .whl/ (wheels: `bash
# python/build-wheels.sh --gpu-extras`) built elsewhere and carried. No Rust and no network
# needed there; python3 with torch, torchvision, numpy, pytest and Pillow.
#   1. the Rust GPU tests of the stream rules (a slow reader on a second stream, DLPack
#      hand-offs) and the DLPack unit tests, with the GPU required;
#   2. the Python package, installed from .whl/, and its pytest suite with torch on CUDA
#      (the same bits as the CPU device and the command line, a slow side-stream consumer,
#      memory over many epochs);
#   3. on a 2,000-image corpus, in turn, fresh processes: `gpufeed run` and the Python loop
#      (torch.from_dlpack each batch, no model), images/s of each;
#   4. the PyTorch DataLoader loop of the uint8-upload technique against the same loop on
#      gpufeed, with EfficientNet-Lite0: top-1 agreement, input difference, images/s.
# Exit status non-zero if a test fails. CORPUS (default /tmp/corpus) is made if missing.
set -uo pipefail
export PYTHONUNBUFFERED=1
corpus=${CORPUS:-/tmp/corpus}
site=${SITE:-/tmp/gpufeed-site}
rounds=${ROUNDS:-3}
# Epochs per measurement of the CLI and the Python loop (one epoch of 2,000 images is a quarter
# of a second: too short to compare two processes' rates).
epochs=${EPOCHS:-5}
rc=0
step() { echo; echo "=== $*"; }

step "device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, torchvision, numpy; print("torch", torch.__version__, "torchvision", torchvision.__version__, "numpy", numpy.__version__)'

step "Rust: stream rules and DLPack (GPUFEED_REQUIRE_GPU=1)"
export GPUFEED_REQUIRE_GPU=1
.gpu/bin/test-gpu --test-threads 1 --nocapture slow_consumer device_batches >/tmp/interop-rust.log 2>&1 \
  || { echo "FAILED: Rust GPU tests (/tmp/interop-rust.log)"; rc=1; }
.gpu/bin/test-lib-gpufeed dlpack >>/tmp/interop-rust.log 2>&1 || { echo "FAILED: DLPack unit tests"; rc=1; }
grep -E "^test |slow consumer|test result|panicked|skipped" /tmp/interop-rust.log

step "Python package from .whl/ into $site, pytest with torch on CUDA"
rm -rf "$site"
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl || { echo "FAILED: pip install"; exit 1; }
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
GPUFEED_CLI=.gpu/bin/bin-gpufeed python3 -m pytest -q -rs -s -p no:cacheprovider python/tests \
  >/tmp/interop-pytest.log 2>&1 || { echo "FAILED: pytest (/tmp/interop-pytest.log)"; rc=1; }
grep -E "epochs:|passed|failed|SKIPPED|Error|assert" /tmp/interop-pytest.log | tail -30
unset GPUFEED_REQUIRE_GPU

[ -d "$corpus" ] || python3 .gpu/tools/make-corpus "$corpus" 2000 >/dev/null
echo "corpus: $(find "$corpus" -type f | wc -l) files in $corpus"

step "gpufeed run and the Python loop over gpufeed (torch.from_dlpack each batch, no model), $epochs epochs each, in turn"
cat >/tmp/gpufeed-python-loop.py <<'PY'
import sys, time, torch, gpufeed
torch.zeros(1, device="cuda:0")  # torch's CUDA context first, as gpufeed run opens its own before the clock
pipe = gpufeed.Pipeline(sys.argv[1])  # the defaults of `gpufeed run`: f16 NCHW, batch 256, cuda:0
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
started, images = time.perf_counter(), 0
for _ in range(epochs):  # as `gpufeed run --epochs N`: each iteration runs the next epoch
    for batch in pipe:
        images += torch.from_dlpack(batch.images).shape[0]
torch.cuda.synchronize()
print(images / (time.perf_counter() - started))
PY
: >/tmp/interop-rates.txt
for round in $(seq "$rounds"); do
  cli=$(.gpu/bin/bin-gpufeed run "$corpus" --json --epochs "$epochs" | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["images_per_s"])')
  py=$(python3 /tmp/gpufeed-python-loop.py "$corpus" "$epochs")
  echo "round $round: gpufeed run $cli images/s, Python loop $py images/s" | tee -a /tmp/interop-rates.txt
done
python3 - <<'PY'
import re, statistics
rows = [re.findall(r"([\d.]+) images/s", l) for l in open("/tmp/interop-rates.txt")]
cli = statistics.median(float(r[0]) for r in rows)
py = statistics.median(float(r[1]) for r in rows)
ratios = [float(r[1]) / float(r[0]) for r in rows]
print(f"medians: gpufeed run {cli:.0f}, Python loop {py:.0f} images/s: Python / CLI = {py / cli:.3f} "
      f"(per round {', '.join(f'{r:.3f}' for r in ratios)}); bar >= 0.95: {'met' if py / cli >= 0.95 else 'NOT met'}")
PY

step "DataLoader (uint8 upload, normalize on the GPU) vs gpufeed, EfficientNet-Lite0, corpus + bundled photos"
python3 examples/pytorch_dataloader_vs_gpufeed.py "$corpus" assets --workers "$(nproc)" --rounds "$rounds" \
  | tee /tmp/interop-model.txt
python3 - <<'PY'
import json
r = json.loads(open("/tmp/interop-model.txt").read().strip().splitlines()[-1])
ok = lambda c: "met" if c else "NOT met"
print(f"bars: top-1 agreement {100 * r['top1_agreement']:.2f}% on {r['images']} images (>= 97% on >= 1000: "
      f"{ok(r['top1_agreement'] >= 0.97 and r['images'] >= 1000)}); input difference mean "
      f"{r['input_diff_mean_levels']:.3f} levels (<= 0.5: {ok(r['input_diff_mean_levels'] <= 0.5)})")
PY
exit $rc
