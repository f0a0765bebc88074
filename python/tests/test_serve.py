"""gpufeed.PatchServer: requests of bytes and paths to tokens and side tensors (DLPack), equal to
transformers' PIL processors bit for bit where transformers is installed; bad images named, the
server serving on; on a CUDA device, the CPU device's tokens; the vision-tower example."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS, FIXTURES, QWEN3_VL, ROOT, cuda_torch

PHOTOS = [
    ASSETS / "rocket.jpg",
    ASSETS / "chelsea.png",
    ASSETS / "coffee.png",
    FIXTURES / "gray.jpg",
    FIXTURES / "progressive.jpg",
    FIXTURES / "rgba.png",
    FIXTURES / "palette.png",
    FIXTURES / "tall_10x600.png",
    FIXTURES / "lossy.webp",
]

QWEN_PIXELS = 28 * 28 * 128


def arrays(served):
    """The served tokens and side tensors as NumPy arrays."""
    return {
        name: np.from_dlpack(getattr(served, name)).copy()
        for name in ("tokens", "grids", "cu_seqlens", "mask", "spatial_shapes", "coordinates")
    }


def test_a_request_of_bytes_and_paths_gives_packed_tokens_and_grids():
    server = gpufeed.PatchServer(
        "qwen2-vl", device="cpu", dtype="float32", max_pixels=QWEN_PIXELS, threads=2
    )
    assert server.preset == "qwen2-vl" and server.max_images == 32
    by_path = server.serve([str(p) for p in PHOTOS])
    by_bytes = server.serve([p.read_bytes() for p in PHOTOS])
    mixed = server.serve(
        [PHOTOS[0], bytearray(PHOTOS[1].read_bytes()), memoryview(PHOTOS[2].read_bytes())]
        + [str(p) for p in PHOTOS[3:]]
    )
    assert by_path.ids == [str(p) for p in PHOTOS]
    assert by_bytes.ids[1] == "image 1 of the request"
    a, b, m = arrays(by_path), arrays(by_bytes), arrays(mixed)
    for name in a:
        assert np.array_equal(a[name], b[name]) and np.array_equal(a[name], m[name]), name
    grids = a["grids"]
    assert grids.dtype == np.int64 and grids.shape == (len(PHOTOS), 3)
    assert [tuple(g) for g in grids] == by_path.grid_list
    tokens = a["tokens"]
    assert tokens.dtype == np.float32 and tokens.shape == (grids.prod(axis=1).sum(), 1176)
    assert list(a["cu_seqlens"]) == [0, *np.cumsum(grids.prod(axis=1))]
    assert a["mask"].shape == (tokens.shape[0],) and a["mask"].all()
    assert len(by_path) == len(PHOTOS)
    assert by_path.grids is by_path.grids, "a side tensor is made once"


def test_siglip2_is_padded_with_a_mask_and_spatial_shapes():
    server = gpufeed.PatchServer("siglip2-naflex", device="cpu", dtype="float16", max_patches=64)
    served = server.serve([p.read_bytes() for p in PHOTOS[:3]])
    a = arrays(served)
    assert a["tokens"].shape == (3, 64, 768) and a["tokens"].dtype == np.float16
    shapes = a["spatial_shapes"]
    assert a["mask"].shape == (3, 64)
    assert list(a["mask"].sum(axis=1)) == list(shapes.prod(axis=1))


def test_bad_images_are_named_and_the_server_goes_on():
    server = gpufeed.PatchServer("qwen2-vl", device="cpu", max_pixels=QWEN_PIXELS)
    photo = PHOTOS[0].read_bytes()
    good = np.from_dlpack(server.serve([photo]).tokens).copy()
    with pytest.raises(gpufeed.ItemError, match=r"^image 1 of the request: "):
        server.serve([photo, b"not an image"])
    missing = FIXTURES / "no-such-file.jpg"
    with pytest.raises(gpufeed.ItemError, match=str(missing)):
        server.serve([str(missing)])
    with pytest.raises(gpufeed.ItemError, match="aspect ratio"):
        server.serve([str(FIXTURES / "wide_4000x10.png")])
    assert np.array_equal(np.from_dlpack(server.serve([photo]).tokens), good)
    with pytest.raises(TypeError, match="image 0 of the request is a int"):
        server.serve([3])
    with pytest.raises(ValueError, match="max_images"):
        server.serve([photo] * 33)
    skipping = gpufeed.PatchServer(
        "qwen2-vl", device="cpu", max_pixels=QWEN_PIXELS, on_error="skip"
    )
    served = skipping.serve([b"not an image", photo])
    assert served.indices == [1] and served.skipped[0][0] == "image 0 of the request"
    assert np.array_equal(np.from_dlpack(served.tokens), good)


def test_settings_that_cannot_serve_are_refused():
    with pytest.raises(ValueError, match="patch preset"):
        gpufeed.PatchServer("vit", device="cpu")
    with pytest.raises(ValueError, match="patches"):
        gpufeed.PatchServer("timm-naflex", device="cpu")
    with pytest.raises(ValueError, match="max_pixels"):
        gpufeed.PatchServer("qwen2-vl", device="cpu", max_pixels=10)
    with pytest.raises(ValueError, match="on_error"):
        gpufeed.PatchServer("qwen2-vl", device="cpu", on_error="ignore")


def transformers_or_skip():
    try:
        import transformers
    except ImportError:
        pytest.skip("transformers is not installed (pip install transformers)")
    return transformers


def test_tokens_equal_transformers_processors_bit_for_bit():
    transformers = transformers_or_skip()
    from PIL import Image

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    if (major, minor) < (5, 23):
        pytest.skip(
            f"transformers {transformers.__version__}: the presets follow 5.23 and later's PIL "
            "processors (earlier ones size and convert some images otherwise)"
        )
    qwen_cls = transformers.Qwen2VLImageProcessorPil
    # As Qwen2-VL's published configuration: converted to RGB, transparency onto white (not the
    # default of transformers releases before 5.23).
    qwen = qwen_cls(max_pixels=QWEN_PIXELS, do_convert_rgb=True)
    siglip_cls = transformers.Siglip2ImageProcessorPil
    siglip = siglip_cls(max_num_patches=64, do_convert_rgb=True)
    images = [Image.open(p) for p in PHOTOS]
    want = qwen(images=images, return_tensors="np")
    server = gpufeed.PatchServer("qwen2-vl", device="cpu", dtype="float32", max_pixels=QWEN_PIXELS)
    got = arrays(server.serve([p.read_bytes() for p in PHOTOS]))
    assert np.array_equal(got["grids"], want["image_grid_thw"])
    assert np.array_equal(got["tokens"].view(np.uint32), want["pixel_values"].view(np.uint32))
    # Qwen3-VL: the same processor with its checkpoints' settings, a budget of 256 merged
    # patches of 32 x 32.
    qwen3 = qwen_cls(**{**QWEN3_VL, "max_pixels": 32 * 32 * 256}, do_convert_rgb=True)
    want = qwen3(images=images, return_tensors="np")
    server = gpufeed.PatchServer("qwen3-vl", device="cpu", dtype="float32", max_pixels=32 * 32 * 256)
    assert server.preset == "qwen3-vl"
    got = arrays(server.serve([p.read_bytes() for p in PHOTOS]))
    assert np.array_equal(got["grids"], want["image_grid_thw"])
    assert got["tokens"].shape[1] == 1536
    assert np.array_equal(got["tokens"].view(np.uint32), want["pixel_values"].view(np.uint32))
    want = siglip(images=images, return_tensors="np")
    server = gpufeed.PatchServer("siglip2-naflex", device="cpu", dtype="float32", max_patches=64)
    got = arrays(server.serve([str(p) for p in PHOTOS]))
    assert np.array_equal(got["tokens"].view(np.uint32), want["pixel_values"].view(np.uint32))
    assert np.array_equal(got["mask"], want["pixel_attention_mask"])
    assert np.array_equal(got["spatial_shapes"], want["spatial_shapes"])


def test_tokens_on_the_gpu_equal_the_cpu_device_s():
    torch = cuda_torch()
    requests = [PHOTOS, PHOTOS[:1], PHOTOS[::-1]]
    for preset, settings in [("qwen2-vl", {"max_pixels": QWEN_PIXELS}), ("siglip2-naflex", {})]:
        cpu = gpufeed.PatchServer(preset, device="cpu", dtype="bfloat16", **settings)
        gpu = gpufeed.PatchServer(preset, device="cuda:0", dtype="bfloat16", **settings)
        for request in requests:
            data = [p.read_bytes() for p in request]
            want, served = cpu.serve(data), gpu.serve(data)
            for name in ("tokens", "grids", "cu_seqlens", "mask", "spatial_shapes"):
                got = torch.from_dlpack(getattr(served, name))
                assert got.is_cuda, name
                expected = torch.from_dlpack(getattr(want, name))
                assert torch.equal(got.cpu(), expected), f"{preset} {name}"


def test_the_vision_tower_example_equals_transformers():
    """python/examples/serve_qwen2vl.py: the served tokens through Qwen2-VL's vision tower equal
    the tower on transformers' own processor output (it skips itself without torch or
    transformers, saying so)."""
    example = ROOT / "python" / "examples" / "serve_qwen2vl.py"
    run = subprocess.run(
        [sys.executable, str(example), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    if run.returncode == 77:
        pytest.skip(run.stdout.strip().splitlines()[-1])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "equal" in run.stdout, run.stdout


def test_the_decode_option_and_each_lane_s_images():
    """On the CPU device the CPU threads decode every image, whatever decode says; decoded_by
    counts them; hybrid decoding (which needs a CUDA device) and a decode name the server does
    not know are refused."""
    photo = PHOTOS[0].read_bytes()
    for decode in ("auto", "cpu"):
        server = gpufeed.PatchServer("qwen2-vl", device="cpu", max_pixels=QWEN_PIXELS, decode=decode)
        assert server.decode_description == "CPU decode, as the tokens go to the CPU"
        assert server.serve([photo, PHOTOS[2].read_bytes()]).decoded_by == (2, 0)
    with pytest.raises(ValueError, match="decode"):
        gpufeed.PatchServer("qwen2-vl", device="cpu", decode="nvjpeg")
    with pytest.raises(ValueError, match="CUDA device"):
        gpufeed.PatchServer("qwen2-vl", device="cpu", decode="hybrid")


def test_the_gpu_decode_lane_gives_the_cpu_threads_tokens():
    """On a CUDA device the GPU decode lane takes the request's JPEGs (a megapixel photo among
    them), the CPU threads the PNG: the tokens equal decode="cpu"'s bit for bit."""
    torch = cuda_torch()
    request = [
        (ASSETS / "hubble_deep_field.jpg").read_bytes(),
        PHOTOS[0].read_bytes(),
        PHOTOS[2].read_bytes(),
        (FIXTURES / "progressive.jpg").read_bytes(),
    ]
    for preset in ("qwen2-vl", "siglip2-naflex"):
        gpu = gpufeed.PatchServer(preset, device="cuda:0", dtype="float32")
        cpu = gpufeed.PatchServer(preset, device="cuda:0", dtype="float32", decode="cpu")
        assert gpu.decode_description.startswith("GPU decode"), gpu.decode_description
        served, want = gpu.serve(request), cpu.serve(request)
        assert want.decoded_by == (4, 0)
        assert served.decoded_by[1] >= 2 and sum(served.decoded_by) == 4, served.decoded_by
        for name in ("tokens", "grids", "cu_seqlens", "mask", "spatial_shapes"):
            got = torch.from_dlpack(getattr(served, name)).cpu()
            assert torch.equal(got, torch.from_dlpack(getattr(want, name)).cpu()), name
