"""Shared helpers: the repository's files, and whether a CUDA device (through torch) is here.

GPU tests skip without one, visibly; with GPUFEED_REQUIRE_GPU=1 a missing GPU fails them.
"""

import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASSETS = ROOT / "assets"
FIXTURES = ROOT / "tests" / "fixtures"
# What Qwen3-VL's checkpoints publish for transformers' Qwen2VLImageProcessor (their
# preprocessor_config.json: size shortest_edge 65536 and longest_edge 16777216, patch 16,
# temporal patch 2, merge 2, mean and std 0.5).
QWEN3_VL = dict(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                image_std=[0.5] * 3, min_pixels=256 * 256, max_pixels=4096 * 4096)


def all_images():
    """The bundled photos and every fixture format, sorted."""
    files = [
        p
        for folder in (ASSETS, FIXTURES)
        for p in folder.iterdir()
        if p.suffix not in (".md", ".txt")
    ]
    return sorted(files)


@pytest.fixture
def image_folder(tmp_path):
    """An ImageFolder: two classes of bundled photos."""
    photos = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg"))
    for label, name in enumerate(["cats", "dogs"]):
        (tmp_path / name).mkdir()
        for photo in photos[label::2]:
            shutil.copy(photo, tmp_path / name / photo.name)
    return tmp_path


def cuda_torch():
    """torch with a usable CUDA device, or None (skips, or fails under GPUFEED_REQUIRE_GPU=1)."""
    required = os.environ.get("GPUFEED_REQUIRE_GPU") == "1"
    try:
        import torch
    except ImportError:
        if required:
            pytest.fail("GPUFEED_REQUIRE_GPU=1 but torch is not installed")
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        if required:
            pytest.fail("GPUFEED_REQUIRE_GPU=1 but torch sees no CUDA device")
        pytest.skip("no CUDA device")
    return torch
