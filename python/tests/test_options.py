"""Keywords as a new user types them: errors name the keyword typed, numbers out of range and
wrong kinds say so, one path or a list of paths, labels with paths, shuffle read as Python reads
it, len() in batches as DataLoader counts them."""

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS


def make(**kw):
    kw.setdefault("device", "cpu")
    return gpufeed.Pipeline(ASSETS, **kw)


@pytest.mark.parametrize(
    "keywords, error, words",
    [
        (dict(decode_memory=0), ValueError, "decode_memory"),
        (dict(hflip=2.0), ValueError, "hflip"),
        (dict(pad=300, resize_mode="letterbox"), ValueError, "pad: 300 is out of range (0 to 255)"),
        (dict(batch_size=-1), ValueError, "batch_size"),
        (dict(crop=(0, 224)), ValueError, "0x224 (height x width)"),
        (dict(threads=100_000), ValueError, "at least 64"),
        (dict(dtype="float64"), ValueError, "float16"),
        (dict(shuffle=7), ValueError, "seed=7"),
        (dict(train=True, resize_mode="stretch"), ValueError, "train=True"),
        (dict(batch_size="big"), TypeError, "batch_size"),
    ],
)
def test_mistakes_name_the_keyword_typed(keywords, error, words):
    with pytest.raises(error) as caught:
        make(**keywords)
    assert words in str(caught.value), str(caught.value)


def test_dtype_errors_list_every_spelling():
    with pytest.raises(ValueError) as caught:
        make(dtype="double")
    for spelling in ("f16", "float16", "half", "bf16", "bfloat16", "f32", "float32"):
        assert spelling in str(caught.value), str(caught.value)


def test_one_path_or_many_and_labels_with_paths():
    one = gpufeed.Pipeline(paths=str(ASSETS / "rocket.jpg"), device="cpu")
    assert one.num_images == 1 and next(iter(one)).labels is None
    photos = [ASSETS / "rocket.jpg", ASSETS / "chelsea.png", ASSETS / "camera.png"]
    labelled = gpufeed.Pipeline(paths=photos, labels=[4, 0, 9], batch_size=2, device="cpu")
    assert [l for b in labelled for l in b.labels] == [4, 0, 9]
    with pytest.raises(ValueError, match="labels: 2 labels for 3 images"):
        gpufeed.Pipeline(paths=photos, labels=[1, 2], device="cpu")
    with pytest.raises(TypeError, match="paths"):
        gpufeed.Pipeline(paths=42, device="cpu")
    with pytest.raises(TypeError, match="labels"):
        gpufeed.Pipeline(ASSETS, labels=[1], device="cpu")


def test_shuffle_reads_as_python_reads_it():
    def ids(**kw):
        return [i for b in make(batch_size=3, **kw) for i in b.ids]

    plain = ids()
    assert ids(shuffle=0) == ids(shuffle=False) == ids(shuffle=None) == plain
    assert ids(shuffle=1) == ids(shuffle=True) != plain
    assert ids(shuffle=True, seed=3) != ids(shuffle=True, seed=4)


def test_len_counts_batches_and_num_images_counts_images():
    for batch_size, drop_last, batches in [(3, False, 3), (3, True, 2), (7, False, 1), (256, False, 1)]:
        pipe = make(batch_size=batch_size, drop_last=drop_last)
        assert pipe.num_images == 7
        assert len(pipe) == batches == len(list(pipe)), (batch_size, drop_last)


def test_cuda_errors_say_how_to_run_on_the_cpu():
    try:
        gpufeed.Pipeline(ASSETS)
    except gpufeed.CudaUnavailableError as e:
        assert 'device="cpu"' in str(e)
    else:
        pytest.skip("a CUDA device is here: the default device works")


def test_left_out_files_are_counted(tmp_path):
    (tmp_path / "a.jpg").write_bytes((ASSETS / "rocket.jpg").read_bytes())
    (tmp_path / "b.gif").write_bytes((ASSETS.parent / "tests/fixtures/animated.gif").read_bytes())
    (tmp_path / "notes.txt").write_text("x")
    pipe = gpufeed.Pipeline(tmp_path, device="cpu")
    assert pipe.num_images == 2 and pipe.left_out == {"txt": 1}
    batch = next(iter(pipe))
    assert np.from_dlpack(batch.images).shape == (2, 3, 224, 224)


def test_names_that_are_not_utf8_keep_ids_that_open(tmp_path):
    import os

    path = tmp_path / os.fsdecode(b"caf\xe9 \\ x.jpg")
    path.write_bytes((ASSETS / "rocket.jpg").read_bytes())
    batch = next(iter(gpufeed.Pipeline(tmp_path, device="cpu")))
    assert batch.ids == [str(path)]
    with open(batch.ids[0], "rb") as f:
        assert f.read(2) == b"\xff\xd8"
