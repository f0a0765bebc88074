"""Checkpointing the loader: state_dict() after any batch, then Pipeline(..., state=d) or
load_state_dict(d), gives the uninterrupted run's batches row for row; a state that does not fit
is refused, naming what differs."""

import json

import numpy as np
import pytest
from PIL import Image

import gpufeed


@pytest.fixture
def training_folder(tmp_path):
    """An ImageFolder of 17 generated JPEGs of assorted sizes and 2 files that are not images."""
    rng = np.random.default_rng(3)
    for i in range(19):
        folder = tmp_path / f"class_{i % 3}"
        folder.mkdir(exist_ok=True)
        if i in (4, 11):
            (folder / f"{i:03}_broken.jpg").write_bytes(b"not an image")
            continue
        height, width = rng.integers(40, 150, size=2)
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:03}.jpg", quality=90)
    return tmp_path


def build(folder, **kw):
    options = dict(image_folder=True, train=True, seed=4, crop=24, batch_size=3, device="cpu")
    options.update(kw)
    return gpufeed.Pipeline(str(folder), **options)


def take(pipe, epochs, stop=None):
    """A training loop over the epochs left up to `epochs`, stopped after `stop` batches."""
    seen = []
    for _ in range(pipe.epoch, epochs):
        for batch in pipe:
            seen.append(
                (
                    batch.epoch,
                    batch.ids,
                    batch.labels,
                    batch.padded,
                    batch.crops,
                    batch.skipped,
                    np.from_dlpack(batch.images).tobytes(),
                )
            )
            if stop is not None and len(seen) == stop:
                return seen
    return seen


@pytest.mark.parametrize("stop", [1, 4, 6, 8])
def test_state_dict_resumes_row_for_row(training_folder, stop):
    whole = take(build(training_folder), 2)
    assert len(whole) == 12 and any(batch[5] for batch in whole), "bad files skipped"
    first = build(training_folder, threads=1)
    seen = take(first, 2, stop)
    # As torch.save would keep it: plain JSON types.
    state = json.loads(json.dumps(first.state_dict()))
    assert (state["epoch"], state["batches"]) == ((stop - 1) // 6, (stop - 1) % 6 + 1)
    del first
    resumed = build(training_folder, threads=2, prefetch=3, state=state)
    assert resumed.epoch == state["epoch"]
    assert seen + take(resumed, 2) == whole


def test_load_state_dict_moves_a_running_pipeline(training_folder):
    whole = take(build(training_folder), 2)
    saving = build(training_folder)
    take(saving, 2, 7)
    state = saving.state_dict()
    running = build(training_folder)
    take(running, 2, 2)
    running.load_state_dict(state)
    assert take(running, 2) == whole[7:]
    # The JSON text is taken too.
    again = build(training_folder)
    again.load_state_dict(json.dumps(state))
    assert take(again, 2) == whole[7:]


def test_a_state_that_does_not_fit_is_refused_naming_it(training_folder):
    pipe = build(training_folder)
    take(pipe, 1, 1)
    state = pipe.state_dict()
    with pytest.raises(ValueError, match="seed is 5 here but 4 in the state"):
        build(training_folder, seed=5, state=state)
    with pytest.raises(ValueError, match="dtype is f32 here but f16 in the state"):
        build(training_folder, dtype="float32", state=state)
    with pytest.raises(ValueError, match="version 9"):
        build(training_folder, state=dict(state, version=9))
    with pytest.raises(ValueError, match="no field \"epoch\""):
        build(training_folder, state={k: v for k, v in state.items() if k != "epoch"})
    with pytest.raises(TypeError, match="state"):
        build(training_folder, state=42)
    (training_folder / "class_0" / "000.jpg").unlink()
    with pytest.raises(ValueError, match="source is not the one"):
        build(training_folder, state=state)
