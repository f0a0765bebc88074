"""The Python package on the CPU device, with NumPy: options, sources, errors, epochs, DLPack,
and the output against the Rust command line's."""

import gc
import os
import subprocess
import threading
import time

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS, FIXTURES, all_images


def epoch_arrays(pipe):
    """One epoch as (ids, concatenated images)."""
    ids, arrays = [], []
    for batch in pipe:
        ids += batch.ids
        arrays.append(np.from_dlpack(batch.images).copy())
    return ids, np.concatenate(arrays)


def test_output_equals_the_command_line_bit_for_bit(tmp_path):
    cli = os.environ.get("GPUFEED_CLI")
    if not cli:
        pytest.skip("GPUFEED_CLI is not set (the gpufeed executable, e.g. target/release/gpufeed)")
    saved = tmp_path / "cli.npy"
    subprocess.run(
        [cli, "run", str(ASSETS), "--cpu", "--batch-size", "3", "--save", str(saved)],
        check=True,
        capture_output=True,
    )
    want = np.load(saved)
    want_ids = (tmp_path / "cli.paths.txt").read_text().split("\n")
    ids, got = epoch_arrays(gpufeed.Pipeline(str(ASSETS), batch_size=3, device="cpu"))
    assert [os.path.abspath(i) for i in ids] == [os.path.abspath(i) for i in want_ids if i]
    assert got.dtype == np.float16 and got.shape == want.shape
    assert (got.view(np.uint16) == want.view(np.uint16)).all()


def test_defaults_are_torchvision_eval_and_keywords_match_the_table():
    pipe = gpufeed.Pipeline(ASSETS, device="cpu")
    batch = next(iter(pipe))
    assert batch.images.shape == (pipe.num_images, 3, 224, 224)
    assert len(pipe) == 1  # batches, as len(DataLoader) counts them
    assert batch.images.dtype == "float16" and batch.images.layout == "nchw"
    assert batch.images.strides == (3 * 224 * 224, 224 * 224, 224, 1)
    assert batch.images.__dlpack_device__() == (1, 0)
    assert batch.images.device == "cpu" and batch.images.cuda_stream is None
    assert "batch_size" in gpufeed.KEYWORDS and "dct_scaling" in gpufeed.KEYWORDS
    for name in ("interpolation", "resize_mode", "max_pixels", "exif_orientation", "channel_order"):
        assert name in gpufeed.KEYWORDS


def test_pixels_round_trip_with_identity_normalization():
    # mean 0, std 1/255: the output is the u8 pixel value.
    pipe = gpufeed.Pipeline(
        paths=[ASSETS / "chelsea.png"], device="cpu", dtype="float32", mean=(0, 0, 0), std=(1 / 255,) * 3
    )
    _, x = epoch_arrays(pipe)
    assert x.min() >= 0 and x.max() <= 255
    assert np.allclose(x, np.round(x), atol=1e-3)
    assert x.max() > 200


def test_dtype_layout_and_channel_order_agree():
    def run(**kw):
        return epoch_arrays(gpufeed.Pipeline(ASSETS, batch_size=4, device="cpu", **kw))[1]

    f32 = run(dtype="float32")
    assert (run(dtype="float16") == f32.astype(np.float16)).all()
    assert (run(dtype="f32", layout="nhwc") == f32.transpose(0, 2, 3, 1)).all()
    assert (run(dtype="float", channel_order="bgr") == f32[:, ::-1]).all()


def test_bfloat16_through_torch():
    torch = pytest.importorskip("torch")
    pipe = lambda dtype: gpufeed.Pipeline(ASSETS, batch_size=7, device="cpu", dtype=dtype)
    bf16 = torch.from_dlpack(pipe("bfloat16").next_batch().images)
    f32 = torch.from_dlpack(pipe("float32").next_batch().images)
    assert bf16.dtype == torch.bfloat16
    assert torch.equal(bf16, f32.to(torch.bfloat16))


def test_resize_modes_and_filters_give_their_sizes():
    for kw, shape in [
        (dict(resize=160, crop=128), (128, 128)),
        (dict(crop=(96, 160)), (96, 160)),
        (dict(resize_mode="stretch", crop=(100, 50)), (100, 50)),
        (dict(resize_mode="letterbox", crop=64, pad=114), (64, 64)),
    ]:
        for interpolation in ("bilinear", "bicubic", "nearest", "lanczos"):
            pipe = gpufeed.Pipeline(ASSETS, device="cpu", interpolation=interpolation, **kw)
            assert next(iter(pipe)).images.shape[2:] == shape, kw


def test_image_folder_labels_and_class_names(image_folder):
    pipe = gpufeed.Pipeline(image_folder, image_folder=True, batch_size=2, device="cpu")
    assert pipe.class_names == ["cats", "dogs"]
    labels, ids = [], []
    for batch in pipe:
        labels += batch.labels
        ids += batch.ids
    assert labels == [0 if "/cats/" in i else 1 for i in ids]
    assert gpufeed.Pipeline(ASSETS, device="cpu").next_batch().labels is None


def test_paths_keep_their_order():
    paths = list(reversed(sorted(p for p in ASSETS.iterdir() if p.suffix != ".md")))
    ids, _ = epoch_arrays(gpufeed.Pipeline(paths=paths, batch_size=2, device="cpu"))
    assert ids == [str(p) for p in paths]


def test_shuffle_is_deterministic_and_shards_partition():
    def order(**kw):
        return epoch_arrays(gpufeed.Pipeline(paths=all_images(), batch_size=5, device="cpu", **kw))[0]

    plain = order()
    shuffled = order(shuffle=True, seed=7)
    assert shuffled == order(shuffle=True, seed=7) and sorted(shuffled) == sorted(plain)
    assert shuffled != plain
    parts = [order(shard=(rank, 3), shard_balance="uneven") for rank in range(3)]
    assert sorted(sum(parts, [])) == sorted(plain)


def test_bad_files_are_skipped_and_listed_or_fail_naming_the_file(tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff not really a JPEG")
    paths = [ASSETS / "chelsea.png", bad, ASSETS / "rocket.jpg"]
    batches = list(gpufeed.Pipeline(paths=paths, batch_size=2, device="cpu"))
    assert [len(b) for b in batches] == [2]
    assert batches[0].skipped[0][0] == str(bad)
    with pytest.raises(gpufeed.ItemError, match="broken.jpg"):
        list(gpufeed.Pipeline(paths=paths, batch_size=2, device="cpu", on_error="fail"))


def test_option_mistakes_raise_naming_the_option(tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        gpufeed.Pipeline(ASSETS, batch_size=0, device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        gpufeed.Pipeline(ASSETS, dtype="float64", device="cpu")
    with pytest.raises(ValueError, match="interpolation"):
        gpufeed.Pipeline(ASSETS, interpolation="cubic-ish", device="cpu")
    with pytest.raises(ValueError, match="resize_mode"):
        gpufeed.Pipeline(ASSETS, resize_mode="zoom", device="cpu")
    with pytest.raises(ValueError, match="shard"):
        gpufeed.Pipeline(ASSETS, shard=(3, 2), device="cpu")
    with pytest.raises(ValueError, match="assisted_share"):
        gpufeed.Pipeline(ASSETS, assisted_share=1.5, device="cpu")
    with pytest.raises(ValueError, match="min_gpu_share"):
        gpufeed.Pipeline(ASSETS, min_gpu_share=-0.5, device="cpu")
    with pytest.raises((ValueError, TypeError), match="planned_epochs"):
        gpufeed.Pipeline(ASSETS, planned_epochs=-1, device="cpu")
    with pytest.raises(ValueError, match="resize"):
        gpufeed.Pipeline(ASSETS, resize_mode="stretch", resize=256, device="cpu")
    with pytest.raises(TypeError, match="batch_sise"):
        gpufeed.Pipeline(ASSETS, batch_sise=3)
    with pytest.raises(TypeError, match="batch_size"):
        gpufeed.Pipeline(ASSETS, batch_size="many", device="cpu")
    with pytest.raises(ValueError, match="device"):
        gpufeed.Pipeline(ASSETS, device="tpu")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        gpufeed.Pipeline(tmp_path / "nowhere", device="cpu")
    with pytest.raises(TypeError):
        gpufeed.Pipeline()


def test_cuda_without_a_gpu_says_what_is_missing():
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA device is here")
    except ImportError:
        pass
    with pytest.raises(gpufeed.CudaUnavailableError, match="CUDA"):
        gpufeed.Pipeline(ASSETS, device="cuda:0")


def test_a_planned_run_length_is_taken_and_changes_no_output():
    planned = gpufeed.Pipeline(ASSETS, batch_size=4, device="cpu", planned_epochs=2)
    unknown = gpufeed.Pipeline(ASSETS, batch_size=4, device="cpu")
    for _ in range(2):
        got_ids, got = epoch_arrays(planned)
        want_ids, want = epoch_arrays(unknown)
        assert got_ids == want_ids and len(got_ids) == planned.num_images
        assert np.array_equal(got, want)


def test_iterating_again_runs_the_next_epoch():
    pipe = gpufeed.Pipeline(ASSETS, batch_size=3, device="cpu", shuffle=1)
    first = [b.epoch for b in pipe]
    second = [b.epoch for b in pipe]
    assert set(first) == {0} and set(second) == {1}
    assert pipe.epoch_report()["complete"] and pipe.epoch_report()["images"] == pipe.num_images
    by = pipe.epoch_report()["decoded_by"]
    assert by["cpu"] + by["gpu"] == pipe.num_images and 0 <= by["gpu_assisted"] <= by["gpu"]
    assert len(first) == len(pipe) == 3
    partial = iter(pipe)
    next(partial)
    assert [b.epoch for b in pipe][0] == 3  # a begun epoch is left for the next one
    assert pipe.next_batch() is None


def test_dlpack_protocol_versions_streams_and_copies():
    batch = gpufeed.Pipeline(ASSETS, batch_size=2, device="cpu", dtype="float32").next_batch()
    t = batch.images
    assert "dltensor_versioned" in repr(t.__dlpack__(max_version=(1, 0)))
    assert '"dltensor"' in repr(t.__dlpack__())
    assert '"dltensor"' in repr(t.__dlpack__(stream=-1, max_version=(0, 8)))
    with pytest.raises(BufferError):
        t.__dlpack__(stream=1)
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    view = np.from_dlpack(t)
    copy = np.from_dlpack(t, copy=True) if np.lib.NumpyVersion(np.__version__) >= "2.1.0" else view.copy()
    assert (view == copy).all()
    assert view.ctypes.data != copy.ctypes.data


def test_arrays_outlive_their_batch_and_pipeline():
    pipe = gpufeed.Pipeline(ASSETS, batch_size=4, device="cpu", dtype="float32")
    batch = pipe.next_batch()
    kept = np.from_dlpack(batch.images)
    want = kept.copy()
    del batch, pipe
    gc.collect()
    # Later pipelines reuse freed memory; the kept array must still hold its batch.
    for _ in gpufeed.Pipeline(ASSETS, batch_size=4, device="cpu", dtype="float32"):
        pass
    assert (kept == want).all()


def test_the_gil_is_released_while_a_batch_is_prepared():
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    pipe = gpufeed.Pipeline(paths=all_images() * 16, batch_size=64, threads=1, prefetch=1, device="cpu")
    ticker = threading.Thread(target=tick)
    ticker.start()
    started = time.perf_counter()
    for _ in pipe:
        pass
    waited = time.perf_counter() - started
    stop.set()
    ticker.join()
    gaps = np.diff([t for t in ticks if started <= t <= started + waited])
    if waited < 0.2:
        pytest.skip(f"the epoch took only {waited:.3f} s")
    assert len(gaps) > 10 and gaps.max() < waited / 4, (waited, gaps.max())


def test_host_memory_stays_flat_over_many_epochs():
    def rss():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmRSS:"))

    pipe = gpufeed.Pipeline(ASSETS, batch_size=3, device="cpu", threads=2)
    for _ in range(3):
        for batch in pipe:
            float(np.from_dlpack(batch.images)[0, 0, 0, 0])
    settled = rss()
    for _ in range(30):
        for batch in pipe:
            float(np.from_dlpack(batch.images)[0, 0, 0, 0])
    grown = rss() - settled
    assert grown < 16 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over 30 epochs"


def test_pillow_version_decode_description_and_profile():
    """The Pillow torchvision runs on here is the one whose bytes are reproduced (its pass order),
    unless pillow_version says otherwise; the pipeline says which lanes decode, and where the
    time went."""
    from PIL import Image

    major, minor = (int(p) for p in Image.__version__.split(".")[:2])
    crops = {}
    for version in (None, f"{major}.{minor}", "12.1", "13.0"):
        kw = {} if version is None else {"pillow_version": version}
        pipe = gpufeed.Pipeline(ASSETS, device="cpu", dtype="float32", train=True, seed=3,
                                crop=48, batch_size=8, **kw)
        crops[version] = [np.from_dlpack(b.images).copy() for b in pipe]
        assert "CPU decode" in pipe.decode_description
        profile = pipe.profile()
        assert profile["cpu_decode"]["count"] >= 7 and profile["cpu_decode"]["seconds"] > 0
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(crops[a], crops[b]))
    assert same(None, f"{major}.{minor}"), "the installed Pillow is the default"
    with pytest.raises(ValueError, match="pillow_version"):
        gpufeed.Pipeline(ASSETS, device="cpu", pillow_version="thirteen")


def test_len_counts_out_images_known_to_be_unreadable(tmp_path):
    """302 files, 2 of them corrupt, batches of 150: nothing is known before the first epoch
    (3 batches counted, 2 come); from then on len(pipe) is the 2 batches that come, so
    tqdm(pipe) shows the right total."""
    from PIL import Image

    for i in range(300):
        Image.new("RGB", (6, 4), (i % 256, 3, 9)).save(tmp_path / f"ok-{i:03}.png")
    for name in ("bad-1.png", "bad-2.png"):
        (tmp_path / name).write_bytes(b"not an image at all")
    pipe = gpufeed.Pipeline(str(tmp_path), batch_size=150, crop=8, resize=8, device="cpu")
    assert len(pipe) == 3
    for epoch in range(2):
        assert sum(1 for _ in pipe) == 2, f"epoch {epoch}"
        assert len(pipe) == 2
