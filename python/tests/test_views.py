"""Views (`gpufeed run DIR --views PRESET`, `gpufeed.render_views`): every view equal to the
reference transforms run on the parameters it drew (tests/views_reference.py), for the bundled
photos and every fixture."""

import importlib.util
import json
import os
import pathlib
import shutil

import pytest

from conftest import ASSETS, ROOT, all_images

spec = importlib.util.spec_from_file_location("views_reference", ROOT / "tests" / "views_reference.py")
reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reference)


def cli():
    path = os.environ.get("GPUFEED_CLI")
    if not path:
        pytest.skip("GPUFEED_CLI is not set (the gpufeed executable, e.g. target/release/gpufeed)")
    return path


# A recipe of its own (`views=` as a list of groups, `--views FILE.json`): two filters the
# presets do not use, every operation, groups of several views.
SPEC = [
    {"size": 160, "count": 2, "scale": [0.3, 1.0], "interpolation": "bicubic", "flip": 0.5,
     "color_jitter": {"p": 0.8, "brightness": 0.4, "contrast": 0.4, "saturation": 0.2, "hue": 0.1},
     "grayscale": 0.2, "blur": {"p": 0.5, "kernel_size": 7}},
    {"size": 64, "count": 3, "scale": [0.05, 0.3], "ratio": [0.5, 2.0], "interpolation": "lanczos",
     "solarize": 0.5},
    {"size": 48, "interpolation": "nearest", "flip": 1.0},
]


@pytest.fixture
def photos(tmp_path):
    """The bundled photos and every fixture: gray, CMYK, YCCK, progressive, EXIF, 16-bit and
    palette PNGs, alpha, WebP, GIF, BMP, TIFF, one pixel, 10 x 600."""
    for p in all_images():
        shutil.copy(p, tmp_path / p.name)
    return tmp_path


@pytest.mark.parametrize("preset,seed", [("dinov2", 0), ("dinov2", 11), ("simclr", 3), ("spec", 5)])
def test_every_view_equals_the_reference(photos, tmp_path_factory, preset, seed):
    views_per_image = {"dinov2": 10, "simclr": 2, "spec": sum(g.get("count", 1) for g in SPEC)}
    views_per_image = views_per_image[preset]
    if preset == "spec":
        preset = str(tmp_path_factory.mktemp("spec") / "views.json")
        pathlib.Path(preset).write_text(json.dumps(SPEC))
    stats = reference.compare(photos, cli(), preset, seed)
    assert stats["views"] == views_per_image * len(list(photos.iterdir()))
    assert stats["diff_unblurred"] == 0, stats
    assert reference.passes(stats), stats


def test_the_reference_sees_a_wrong_view(photos, tmp_path, monkeypatch):
    """The comparison can fail: a view shifted by one column no longer matches."""
    real = reference.reference_view

    def shifted(image, line, resample):
        line = dict(line, left=line["left"] + 1 if line["left"] > 0 else 1)
        return real(image, line, resample)

    monkeypatch.setattr(reference, "reference_view", shifted)
    stats = reference.compare(photos, cli(), "dinov2", 0)
    assert not reference.passes(stats)


def test_python_views_equal_the_reference():
    """`gpufeed.render_views`: the same views as the command line's, each equal to the
    reference transforms on what it drew."""
    gpufeed = pytest.importorskip("gpufeed")
    np = pytest.importorskip("numpy")
    from PIL import Image

    path = ASSETS / "rocket.jpg"
    views = gpufeed.render_views(path.read_bytes(), "dinov2", 4, 1, seed=9)
    assert len(views) == 10
    image = Image.open(path).convert("RGB")
    for pixels, size, draw in views:
        line = json.loads(draw)
        assert (line["index"], line["epoch"], line["size"]) == (4, 1, size)
        got = np.frombuffer(pixels, np.uint8).reshape(size, size, 3)
        want = reference.reference_view(image, line, Image.BICUBIC)
        if any(op[0] == "blur" for op in line["ops"]):
            # With torch installed the reference blurs with its float32 sums (the script's bar).
            off = np.abs(got.astype(np.int16) - want)
            assert off.max() <= 1 and np.count_nonzero(off) * 10_000 <= off.size, line
        else:
            assert np.array_equal(got, want), line
    assert views == gpufeed.render_views(path.read_bytes(), "dinov2", 4, 1, seed=9)
    # The installed Pillow's rounding by default, as the reference above runs with it.
    import PIL

    installed = tuple(int(p) for p in PIL.__version__.split(".")[:2])
    assert views == gpufeed.render_views(
        path.read_bytes(), "dinov2", 4, 1, seed=9, pillow_version=installed
    )
    with pytest.raises(ValueError, match="dinov2, simclr"):
        gpufeed.render_views(path.read_bytes(), "dino")
    # A spec of view groups, and the preset by default.
    spec = [{"size": 64, "count": 2, "interpolation": "bicubic", "flip": 1.0}]
    made = gpufeed.render_views(path.read_bytes(), spec, 4, 1, seed=9)
    assert [size for _, size, _ in made] == [64, 64]
    for pixels, size, draw in made:
        line = json.loads(draw)
        assert line["flip"] is True
        got = np.frombuffer(pixels, np.uint8).reshape(size, size, 3)
        assert np.array_equal(got, reference.reference_view(image, line, Image.BICUBIC)), line
    import inspect

    assert inspect.signature(gpufeed.render_views).parameters["preset"].default == "dinov2"
    with pytest.raises(gpufeed.ItemError):
        gpufeed.render_views(b"not an image")


def test_pipeline_views_equal_render_views(tmp_path):
    """`gpufeed.Pipeline(..., views=PRESET)`: batch.views, one tensor per view group
    `[count, N, 3, size, size]`, each view the normalized pixels of `gpufeed.render_views` for
    the same image, epoch and seed; batch.view_draws what each view drew."""
    gpufeed = pytest.importorskip("gpufeed")
    np = pytest.importorskip("numpy")
    import PIL

    installed = tuple(int(p) for p in PIL.__version__.split(".")[:2])
    mean = np.array([0.485, 0.456, 0.406], np.float32)
    std = np.array([0.229, 0.224, 0.225], np.float32)
    for preset, seed in [("dinov2", 9), ("simclr", 2), (SPEC, 4), (json.dumps(SPEC), 4)]:
        pipeline = gpufeed.Pipeline(
            ASSETS, views=preset, seed=seed, batch_size=3, device="cpu", dtype="float32",
            pillow_version="%d.%d" % installed,
        )
        seen = 0
        for epoch in range(2):
            for batch in pipeline:
                n = len(batch)
                groups = [np.from_dlpack(t) for t in batch.views]
                assert [g.shape[1:3] for g in groups] == [(n, 3)] * len(groups)
                assert len(batch.view_draws) == n
                for i, index in enumerate(batch.indices):
                    data = pathlib.Path(batch.ids[i]).read_bytes()
                    want = gpufeed.render_views(data, preset, index, epoch, seed=seed)
                    got = [v for g in groups for v in g[:, i]]  # view order, group by group
                    assert len(got) == len(want)
                    for v, ((pixels, size, draw), values) in enumerate(zip(want, got)):
                        assert batch.view_draws[i][v] == json.loads(draw)
                        x = np.frombuffer(pixels, np.uint8).reshape(size, size, 3)
                        assert values.shape == (3, size, size)
                        expected = (x.astype(np.float32) / 255 - mean) / std
                        assert np.allclose(values.transpose(1, 2, 0), expected, atol=1e-5)
                        # The u8 samples come back exactly from the normalized values.
                        back = np.rint((values.transpose(1, 2, 0) * std + mean) * 255)
                        assert np.array_equal(back.astype(np.uint8), x), (index, v)
                    seen += 1
        assert seen == 2 * len(list(ASSETS.glob("*.[jp][pn]g")))
    with pytest.raises(ValueError, match="dinov2"):
        gpufeed.Pipeline(ASSETS, views="dino", device="cpu")
    # A preset's groups as a spec give the preset's views.
    spec = gpufeed.views_spec("dinov2")
    assert [g["count"] for g in spec] == [1, 1, 8] and spec[2]["interpolation"] == "bicubic"
    assert gpufeed.views_spec(spec) == spec
    # A spec file's path, as str or pathlib.Path, as the command line's --views FILE.json.
    spec_file = tmp_path / "views.json"
    spec_file.write_text(json.dumps(spec))
    assert gpufeed.views_spec(spec_file) == spec == gpufeed.views_spec(str(spec_file))
    with pytest.raises(ValueError, match="cannot read"):
        gpufeed.views_spec(tmp_path / "missing.json")
    first = lambda views: [np.from_dlpack(t).copy() for t in next(iter(gpufeed.Pipeline(
        ASSETS, views=views, seed=1, batch_size=2, device="cpu", dtype="float32"))).views]
    for a, b in zip(first("dinov2"), first(spec)):
        assert np.array_equal(a, b)
    with pytest.raises(ValueError, match='group 0: unknown key "colour_jitter"'):
        gpufeed.Pipeline(ASSETS, views=[{"size": 96, "colour_jitter": {}}], device="cpu")
    with pytest.raises(TypeError, match="views"):
        gpufeed.Pipeline(ASSETS, views=[{"size": object()}], device="cpu")
