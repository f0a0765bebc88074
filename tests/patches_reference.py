#!/usr/bin/env python3
"""gpufeed's patch sequences against transformers' and timm's processors, bit for bit.

    python3 tests/patches_reference.py [IMAGE_DIR]

Makes odd inputs (1xN and Nx1 images, images smaller than a patch, 10000x50 panoramas, gray,
RGBA, LA, palette and RGB PNGs with transparency, CMYK JPEG, WebP with alpha) beside the photos
of assets/ (and IMAGE_DIR's images, if given), has `examples/patches_reference.rs` write
gpufeed's CPU rendition of each preset for each, and compares with the references:

- qwen2-vl, qwen2-vl-small: transformers' Qwen2VLImageProcessorPil (`pixel_values`,
  `image_grid_thw`);
- siglip2, siglip2-64: transformers' Siglip2ImageProcessorPil with do_convert_rgb=True
  (`pixel_values`, `pixel_attention_mask`, `spatial_shapes`);
- qwen2-vl-torchvision: transformers' torchvision Qwen2VLImageProcessor on the CPU (needs torch);
- timm-eval, timm-train: timm's ResizeToSequence / F.resized_crop of gpufeed's drawn box, Patchify,
  NaFlexCollator's padding and NaFlexPrefetchLoader's normalization (needs torch and timm).

Needs transformers 5.23, Pillow and NumPy; what needs torch is skipped without it, and says so.
Set GPUFEED_PATCHES_REFERENCE to a built `patches_reference` executable to skip the cargo build.
Prints "N passed, M failed" and exits 1 on any difference.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
# The given folder's files that are images (a README or SOURCES.md beside them is left out).
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"}
SEED_NOTE = "timm-train draws from gpufeed's seed 7, epoch 3, index = the file's place"

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def make_inputs(folder: Path, extra: Path | None) -> list[Path]:
    """The assets, the odd images made here, and any given folder's images."""
    rng = np.random.default_rng(58)
    files = sorted(p for p in (REPO / "assets").iterdir() if p.suffix in (".png", ".jpg"))
    if extra:
        files += sorted(
            p for p in extra.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
        )
    out = []
    for f in files:
        shutil.copy(f, folder / f.name)
        out.append(folder / f.name)
    photo = Image.open(REPO / "assets" / "chelsea.png").convert("RGB")

    def noise(h, w, c=3):
        return rng.integers(0, 256, (h, w, c), dtype=np.uint8)

    def save(name, image, **kw):
        image.save(folder / name, **kw)
        out.append(folder / name)

    save("column-1x300.png", Image.fromarray(noise(300, 1)))
    save("row-300x1.png", Image.fromarray(noise(1, 300)))
    save("tiny-5x3.png", Image.fromarray(noise(3, 5)))
    save("dot-1x1.png", Image.fromarray(noise(1, 1)))
    save("odd-333x517.jpg", photo.resize((333, 517), Image.BICUBIC), quality=90)
    save("panorama-10000x50.jpg", photo.resize((10000, 50), Image.BILINEAR), quality=85)
    save("panorama-10050x50.jpg", photo.resize((10050, 50), Image.BILINEAR), quality=85)
    save("tower-50x10000.jpg", photo.resize((50, 10000), Image.BILINEAR), quality=85)
    save("gray.jpg", photo.convert("L"), quality=90)
    save("gray.png", photo.convert("L").resize((97, 61)))
    rgba = np.concatenate([np.asarray(photo), noise(300, 451, 1)], axis=2)
    rgba[:40, :, 3] = 0
    rgba[40:80, :, 3] = 255
    save("rgba.png", Image.fromarray(rgba, "RGBA"))
    save("la.png", Image.fromarray(rgba[..., [0, 3]].copy(), "LA"))
    palette = photo.convert("P", palette=Image.ADAPTIVE, colors=64)
    save("palette-transparent.png", palette, transparency=5)
    save("rgb-transparent.png", Image.fromarray(noise(64, 48) // 64 * 64), transparency=(0, 64, 128))
    save("cmyk.jpg", photo.convert("CMYK"), quality=90)
    save("alpha.webp", Image.fromarray(rgba, "RGBA"), lossless=True)
    save("lossy-alpha.webp", Image.fromarray(rgba, "RGBA"), quality=80)
    return out


def run_gpufeed(out: Path, images: list[Path]) -> None:
    exe = os.environ.get("GPUFEED_PATCHES_REFERENCE")
    cmd = [exe] if exe else ["cargo", "run", "--quiet", "--release", "--example", "patches_reference", "--"]
    subprocess.run(cmd + [str(out)] + [str(p) for p in images], check=True, cwd=REPO)


def same_bits(a: np.ndarray, b: np.ndarray) -> str | None:
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return f"shape {a.shape} vs reference {b.shape}"
    differ = a.view(np.uint32) != b.view(np.uint32)
    if differ.any():
        return (
            f"{int(differ.sum())} of {a.size} values differ, "
            f"largest by {float(np.abs(a - b).max()):.3g}"
        )
    return None


def qwen_reference(path: Path, config: str):
    from transformers import Qwen2VLImageProcessorPil

    if config == "qwen2-vl-torchvision":
        from transformers import Qwen2VLImageProcessor

        processor = Qwen2VLImageProcessor()
    elif config == "qwen2-vl-small":
        processor = Qwen2VLImageProcessorPil(
            min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64, do_convert_rgb=True
        )
    else:
        processor = Qwen2VLImageProcessorPil(do_convert_rgb=True)
    out = processor(Image.open(path))
    values = np.asarray(out["pixel_values"])
    return values, {"grid": [int(v) for v in np.asarray(out["image_grid_thw"])[0]]}


def siglip_reference(path: Path, config: str):
    from transformers import Siglip2ImageProcessorPil

    n = 64 if config == "siglip2-64" else 256
    out = Siglip2ImageProcessorPil(max_num_patches=n, do_convert_rgb=True)(Image.open(path))
    h, w = (int(v) for v in np.asarray(out["spatial_shapes"])[0])
    return np.asarray(out["pixel_values"])[0], {
        "grid": [1, h, w],
        "mask": [int(v) for v in np.asarray(out["pixel_attention_mask"])[0]],
    }


def timm_reference(path: Path, config: str, ours: dict):
    import torch
    from timm.data.naflex_dataset import NaFlexCollator
    from timm.data.naflex_transforms import Patchify, ResizeToSequence, get_image_size_for_seq
    from timm.data.transforms import MaybePILToTensor
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F

    image = Image.open(path).convert("RGB")  # timm's ImageDataset
    if config == "timm-eval":
        seq_len = 576
        image = ResizeToSequence(16, seq_len, interpolation="bilinear")(image)
    else:
        seq_len = 256
        top, left, h, w = ours["crop"]
        size = get_image_size_for_seq((h, w), 16, seq_len)[1]
        image = F.resized_crop(
            image, top, left, h, w, list(size), InterpolationMode.BILINEAR, antialias=True
        )
        if ours["flipped"]:
            image = F.hflip(image)
    patches = Patchify(16)(MaybePILToTensor()(image))
    batch, _ = NaFlexCollator(seq_len)([(patches, 0)])
    mean = torch.tensor([x * 255 for x in (0.485, 0.456, 0.406)], dtype=torch.float32)
    std = torch.tensor([x * 255 for x in (0.229, 0.224, 0.225)], dtype=torch.float32)
    values = batch["patches"].view(1, seq_len, -1, 3).sub(mean.view(1, 1, 3)).div(std.view(1, 1, 3))
    grid_h, grid_w = image.height // 16, image.width // 16
    return values.view(seq_len, -1).numpy(), {
        "grid": [1, grid_h, grid_w],
        "mask": [int(v) for v in batch["patch_valid"][0]],
        "coords": batch["patch_coord"][0].tolist(),
    }


CONFIGS = [
    ("qwen2-vl", qwen_reference, False),
    ("qwen2-vl-small", qwen_reference, False),
    ("qwen2-vl-torchvision", qwen_reference, True),
    ("siglip2", siglip_reference, False),
    ("siglip2-64", siglip_reference, False),
    ("timm-eval", timm_reference, True),
    ("timm-train", timm_reference, True),
]


def compare(out: Path, path: Path, config: str, reference) -> str | None:
    meta = json.loads((out / f"{path.name}.{config}.json").read_text())
    try:
        if config.startswith("timm"):
            values, want = reference(path, config, meta)
        else:
            values, want = reference(path, config)
    except ValueError as e:
        if "error" in meta:
            return None  # both refuse it
        return f"the reference refuses it ({e}), gpufeed does not"
    if "error" in meta:
        return f"gpufeed refuses it ({meta['error']}), the reference does not"
    ours = np.load(out / f"{path.name}.{config}.npy")
    problem = same_bits(ours, values)
    if problem:
        return problem
    for key, value in want.items():
        if key == "grid" and meta["grid"] != value:
            return f"grid {meta['grid']} vs reference {value}"
        if key in ("mask", "coords") and meta[key] != value:
            return f"{key} differs"
    return None


def main() -> int:
    extra = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        inputs, out = Path(tmp) / "in", Path(tmp) / "out"
        inputs.mkdir()
        images = make_inputs(inputs, extra)
        run_gpufeed(out, images)
        for config, reference, needs_torch in CONFIGS:
            if needs_torch and not HAVE_TORCH:
                print(f"skipped: {config}: torch is not installed")
                continue
            for path in images:
                problem = compare(out, path, config, reference)
                if problem:
                    failed += 1
                    print(f"FAIL {config} {path.name}: {problem}")
                else:
                    passed += 1
    print(SEED_NOTE)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
