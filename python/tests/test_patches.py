"""Patch sequences through gpufeed.Pipeline(patches=...) against transformers' PIL processors.

Qwen2-VL's and SigLIP2's processors run on the same files (the bundled photos, the fixtures'
formats and odd-size images written here); the tokens must be the same float32 bits and the
grids, masks and spatial shapes the same numbers. transformers 5.x calls the PIL processors
`*ImageProcessorPil` and needs no torch; older releases give the PIL one the plain name.
"""

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import gpufeed
from conftest import ASSETS, FIXTURES, QWEN3_VL, cuda_torch

FIXTURE_NAMES = [
    "cmyk.jpg",
    "gray.jpg",
    "gray_alpha.png",
    "palette.png",
    "progressive.jpg",
    "rgba.png",
    "tall_10x600.png",
    "wide_4000x10.png",
    "lossy.webp",
    "one_pixel.png",
]


def processor(name, **settings):
    """transformers' PIL processor `name` (`Qwen2VL`, `Siglip2`), or skip without transformers."""
    transformers = pytest.importorskip(
        "transformers", reason="transformers is not installed (CI installs it: .ci/run)"
    )
    cls = getattr(transformers, f"{name}ImageProcessorPil", None)
    if cls is None or pil_processors_before_5_23(transformers):
        pytest.skip(
            f"transformers {transformers.__version__}: the presets follow 5.23 and later's PIL "
            "processors (earlier ones size and convert some images otherwise)"
        )
    return cls(**settings)


def pil_processors_before_5_23(transformers):
    """Whether `transformers` is older than 5.23, whose PIL processors the presets follow."""
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return (major, minor) < (5, 23)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The photos, fixtures of every mode, and random odd sizes and modes written here."""
    folder = tmp_path_factory.mktemp("patch-images")
    files = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg"))
    files += [FIXTURES / name for name in FIXTURE_NAMES]
    out = []
    for f in files:
        shutil.copy(f, folder / f.name)
        out.append(folder / f.name)
    rng = np.random.default_rng(58)
    photo = Image.open(ASSETS / "chelsea.png").convert("RGB")
    palette = Image.fromarray(rng.integers(0, 256, (120, 80, 3), dtype=np.uint8)).convert(
        "P", palette=Image.Palette.ADAPTIVE
    )
    made = {
        "noise-333x517.png": Image.fromarray(rng.integers(0, 256, (517, 333, 3), dtype=np.uint8)),
        "column-1x300.png": Image.fromarray(rng.integers(0, 256, (300, 1, 3), dtype=np.uint8)),
        "tiny-5x3.png": Image.fromarray(rng.integers(0, 256, (3, 5, 3), dtype=np.uint8)),
        "gray-97x61.png": Image.fromarray(rng.integers(0, 256, (61, 97), dtype=np.uint8)),
        "rgba-45x71.png": Image.fromarray(rng.integers(0, 256, (71, 45, 4), dtype=np.uint8)),
        "photo-1001x333.jpg": photo.resize((1001, 333)),
        "photo-437x291-444.jpg": photo.resize((437, 291)),
        "photo-311x509-422.jpg": photo.resize((311, 509)),
        # Modes Pillow converts its own ways: 16-bit gray (clamped, not scaled), one bit, gray
        # with alpha, a palette without transparency; BMP, GIF, TIFF and lossless WebP with alpha.
        "gray16-129x83.png": Image.fromarray(rng.integers(0, 65536, (83, 129), dtype=np.uint16)),
        "bits-70x90.png": Image.fromarray(rng.integers(0, 2, (90, 70)).astype(bool)),
        "gray-alpha-99x64.png": Image.fromarray(
            rng.integers(0, 256, (64, 99, 2), dtype=np.uint8), "LA"
        ),
        "palette-80x120.png": palette,
        "noise-201x55.bmp": Image.fromarray(rng.integers(0, 256, (55, 201, 3), dtype=np.uint8)),
        "palette-80x120.gif": palette,
        "noise-77x45.tiff": Image.fromarray(rng.integers(0, 256, (45, 77, 3), dtype=np.uint8)),
        "alpha-77x61.webp": Image.fromarray(rng.integers(0, 256, (61, 77, 4), dtype=np.uint8)),
    }
    saving = {".jpg": {"quality": 90}, ".webp": {"lossless": True}}
    # JPEGs of the sampling factors other than the photos' 4:2:0.
    subsampling = {"photo-437x291-444.jpg": 0, "photo-311x509-422.jpg": 1}
    for name, image in made.items():
        options = saving.get(Path(name).suffix, {})
        if name in subsampling:
            options = {**options, "subsampling": subsampling[name]}
        image.save(folder / name, **options)
        out.append(folder / name)
    return out


def epoch(images, **keywords):
    """Every batch of one epoch on the CPU device, as NumPy arrays, keyed by the image's path."""
    pipe = gpufeed.Pipeline(paths=images, device="cpu", dtype="float32", batch_size=5, **keywords)
    rows = {}
    for batch in pipe:
        for path, reason in batch.skipped:
            rows[str(path)] = reason
        tokens = np.from_dlpack(batch.tokens)
        sides = {
            name: np.from_dlpack(getattr(batch, name))
            for name in ("grids", "cu_seqlens", "mask", "spatial_shapes", "coordinates")
        }
        assert np.from_dlpack(batch.images) is not None and batch.tokens.shape == batch.images.shape
        for i, path in enumerate(batch.ids):
            rows[str(path)] = (tokens, sides, i, batch.tokens_per_image[i])
    return rows


def refused_by_both(rows, path, reference):
    """Whether gpufeed skipped `path` (with a reason naming it); the reference must refuse it too."""
    reason = rows[str(path)]
    if not isinstance(reason, str):
        return False
    with pytest.raises(ValueError):
        reference(Image.open(path))
    return True


def same_bits(ours, theirs, what):
    ours = np.ascontiguousarray(ours, dtype=np.float32)
    theirs = np.ascontiguousarray(theirs, dtype=np.float32)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} vs {theirs.shape}"
    differ = ours.view(np.uint32) != theirs.view(np.uint32)
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {ours.size} values differ, "
        f"largest by {float(np.abs(ours - theirs).max()):.3g}"
    )


@pytest.mark.parametrize(
    "settings",
    [{}, {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 64}],
    ids=["defaults", "small-budget"],
)
def test_qwen2_vl_equals_transformers_pil_processor(images, settings):
    # Qwen2-VL's published processor converts to RGB (transparency onto white); transformers
    # releases before 5.23 leave that off when the class is made without its configuration.
    reference = processor("Qwen2VL", do_convert_rgb=True, **settings)
    same_as_qwen_processor(images, epoch(images, patches="qwen2-vl", **settings), reference)


@pytest.mark.parametrize(
    "budget",
    [{}, {"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 64}],
    ids=["defaults", "small-budget"],
)
def test_qwen3_vl_equals_transformers_pil_processor_with_its_settings(images, budget):
    reference = processor("Qwen2VL", do_convert_rgb=True, **{**QWEN3_VL, **budget})
    same_as_qwen_processor(images, epoch(images, patches="qwen3-vl", **budget), reference)


def same_as_qwen_processor(images, rows, reference):
    """Every image's packed tokens, grid and span in `rows` as the Qwen2-VL-rule `reference`
    gives them (or both refuse the image)."""
    assert len(rows) == len(images)
    for path in images:
        if refused_by_both(rows, path, reference):
            continue
        tokens, sides, i, count = rows[str(path)]
        want = reference(Image.open(path))
        grid = np.asarray(want["image_grid_thw"])[0]
        assert list(sides["grids"][i]) == list(grid), path.name
        start, end = sides["cu_seqlens"][i], sides["cu_seqlens"][i + 1]
        assert end - start == count == int(np.prod(grid)), path.name
        same_bits(tokens[start:end], np.asarray(want["pixel_values"]), path.name)


@pytest.mark.parametrize("max_patches", [256, 64])
def test_siglip2_naflex_equals_transformers_pil_processor(images, max_patches):
    reference = processor("Siglip2", max_num_patches=max_patches, do_convert_rgb=True)
    rows = epoch(images, patches="siglip2-naflex", max_patches=max_patches)
    assert len(rows) == len(images)
    for path in images:
        if refused_by_both(rows, path, reference):
            continue
        tokens, sides, i, count = rows[str(path)]
        want = reference(Image.open(path))
        assert tokens.shape[1:] == (max_patches, 768)
        same_bits(tokens[i], np.asarray(want["pixel_values"])[0], path.name)
        assert list(sides["mask"][i]) == list(np.asarray(want["pixel_attention_mask"])[0])
        assert list(sides["spatial_shapes"][i]) == list(np.asarray(want["spatial_shapes"])[0])
        assert int(sides["mask"][i].sum()) == count, path.name


def test_timm_naflex_batches_follow_the_token_budget_and_the_seed():
    paths = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg"))
    keywords = dict(patches="timm-naflex", seq_lens=[64, 144], tokens_per_batch=288, seed=4)

    def run():
        pipe = gpufeed.Pipeline(paths=paths, device="cpu", dtype="float32", **keywords)
        return [
            (np.from_dlpack(b.tokens), np.from_dlpack(b.mask), np.from_dlpack(b.coordinates), b.ids)
            for b in pipe
        ]

    first, again = run(), run()
    assert sum(len(ids) for *_, ids in first) == len(paths)
    for (tokens, mask, coordinates, ids), (tokens2, _, _, ids2) in zip(first, again):
        n, length, dim = tokens.shape
        assert length in (64, 144) and dim == 768 and n * length <= 288
        assert mask.shape == (n, length) and coordinates.shape == (n, length, 2)
        assert ids == ids2 and (tokens.view(np.uint32) == tokens2.view(np.uint32)).all()


def test_fixed_size_batches_have_no_tokens_and_eval_presets_name_their_size():
    batch = next(iter(gpufeed.Pipeline(ASSETS, device="cpu", eval_preset="siglip-384")))
    assert batch.images.shape[1:] == (3, 384, 384)
    assert batch.tokens is None and batch.grids is None and batch.tokens_per_image is None


def test_patch_mistakes_name_the_keyword_and_bad_images_their_file(tmp_path):
    with pytest.raises(ValueError, match="qwen2-vl-torchvision"):
        gpufeed.Pipeline(ASSETS, device="cpu", patches="clip")
    with pytest.raises(ValueError, match="max_patches"):
        gpufeed.Pipeline(ASSETS, device="cpu", patches="qwen2-vl", max_patches=9)
    with pytest.raises(ValueError, match="give patches="):
        gpufeed.Pipeline(ASSETS, device="cpu", min_pixels=100)
    with pytest.raises(ValueError, match="max_pixels"):
        gpufeed.Pipeline(ASSETS, device="cpu", patches="qwen2-vl", max_pixels=100)
    shutil.copy(ASSETS / "chelsea.png", tmp_path / "chelsea.png")
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    Image.new("RGB", (10050, 50), (3, 4, 5)).save(tmp_path / "panorama.png")
    batch = next(iter(gpufeed.Pipeline(tmp_path, device="cpu", patches="qwen2-vl")))
    assert [p.endswith("chelsea.png") for p in batch.ids] == [True]
    skipped = sorted(pathname.rsplit("/", 1)[-1] for pathname, _ in batch.skipped)
    assert skipped == ["broken.jpg", "panorama.png"]
    with pytest.raises(gpufeed.ItemError, match="panorama.png|broken.jpg"):
        list(gpufeed.Pipeline(tmp_path, device="cpu", patches="qwen2-vl", on_error="fail"))


@pytest.mark.parametrize(
    "keywords",
    [
        dict(patches="qwen2-vl", max_pixels=28 * 28 * 256),
        dict(patches="qwen3-vl", max_pixels=32 * 32 * 256),
        dict(patches="siglip2-naflex", max_patches=64),
    ],
    ids=["qwen2-vl", "qwen3-vl", "siglip2-naflex"],
)
def test_cuda_batches_hold_the_cpu_devices_tokens_and_side_tensors(keywords):
    """On cuda:0 (the CPU threads decoding), the tokens and every side tensor are on the GPU and
    equal the CPU device's, bit for bit."""
    torch = cuda_torch()
    paths = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg"))
    common = dict(paths=paths, dtype="float32", batch_size=3, decode="cpu", **keywords)
    cpu = list(gpufeed.Pipeline(device="cpu", **common))
    gpu = list(gpufeed.Pipeline(device="cuda:0", **common))
    assert [b.ids for b in cpu] == [b.ids for b in gpu]
    for c, g in zip(cpu, gpu):
        for name in ("tokens", "grids", "cu_seqlens", "mask", "spatial_shapes", "coordinates"):
            on_gpu = torch.from_dlpack(getattr(g, name))
            assert on_gpu.is_cuda, name
            want = np.from_dlpack(getattr(c, name))
            got = on_gpu.cpu().numpy()
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert (got.view(np.uint8) == want.view(np.uint8)).all(), name
        assert g.tokens_per_image == c.tokens_per_image


def test_max_pixels_is_qwen2_vls_budget_beside_it_and_the_decode_limit_otherwise():
    paths = [ASSETS / "astronaut.png"]  # 512 x 512
    for patches in (None, "siglip2-naflex"):
        pipe = gpufeed.Pipeline(paths=paths, device="cpu", patches=patches, max_pixels=100_000)
        assert list(pipe) == []
        ((path, reason),) = pipe.epoch_report()["skipped"]
        assert path.endswith("astronaut.png") and "pixels" in reason, reason
    qwen = next(iter(gpufeed.Pipeline(paths=paths, device="cpu", patches="qwen2-vl", max_pixels=100_000)))
    (t, h, w), = np.from_dlpack(qwen.grids).tolist()
    assert not qwen.skipped and t == 1 and h * w * 14 * 14 <= 100_000


def test_a_patch_pipeline_resumes_from_its_state_dict():
    paths = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg"))
    keywords = dict(paths=paths, device="cpu", dtype="float32", patches="timm-naflex",
                    seq_lens=[64, 144], tokens_per_batch=288, seed=2)
    whole = [(b.ids, np.from_dlpack(b.tokens).copy()) for b in gpufeed.Pipeline(**keywords)]
    pipe = gpufeed.Pipeline(**keywords)
    it = iter(pipe)
    taken = [next(it), next(it)]
    resumed = gpufeed.Pipeline(state=pipe.state_dict(), **keywords)
    rest = [(b.ids, np.from_dlpack(b.tokens).copy()) for b in resumed]
    assert [b.ids for b in taken] + [ids for ids, _ in rest] == [ids for ids, _ in whole]
    for (_, got), (_, want) in zip(rest, whole[2:]):
        assert (got.view(np.uint32) == want.view(np.uint32)).all()


def test_packing_padded_holds_the_packed_tokens_behind_the_mask():
    paths = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg"))
    common = dict(paths=paths, device="cpu", dtype="float32", batch_size=7, patches="qwen2-vl",
                  max_pixels=28 * 28 * 64)
    (packed,) = list(gpufeed.Pipeline(**common))
    (padded,) = list(gpufeed.Pipeline(packing="padded", **common))
    tokens, mask = np.from_dlpack(padded.tokens), np.from_dlpack(padded.mask)
    assert tokens.ndim == 3 and mask.shape == tokens.shape[:2]
    assert (tokens[mask == 1].view(np.uint32) == np.from_dlpack(packed.tokens).view(np.uint32)).all()
    with pytest.raises(ValueError, match="packing"):
        gpufeed.Pipeline(ASSETS, device="cpu", packing="padded")
