"""Training transforms, equal shards, the launcher's variables and tar shards, on the CPU device.

The crop sampler is compared with torchvision's ``RandomResizedCrop.get_params`` over 100,000
draws: with torchvision itself when it is installed, and always with its algorithm written out
here in NumPy (the same lines of Python, on NumPy's generator): the area and aspect-ratio
distributions must agree within sampling error (two-sample Kolmogorov-Smirnov).
"""

import math
import tarfile

import numpy as np
import pytest
from PIL import Image

import gpufeed
from conftest import ASSETS

# Image sizes the draws are made for: ImageNet-like, wide, tall, square, tiny.
SIZES = [(500, 375), (375, 500), (1000, 1000), (4000, 10), (10, 600), (640, 427), (64, 48)]
DRAWS = 100_000


def torchvision_algorithm(width, height, rng, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params, line by line, on NumPy's generator."""
    area = height * width
    log_ratio = np.log(np.array(ratio, dtype=np.float32))
    for _ in range(10):
        target_area = area * float(np.float32(rng.uniform(scale[0], scale[1])))
        aspect_ratio = float(np.exp(np.float32(rng.uniform(log_ratio[0], log_ratio[1]))))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def ks_statistic(a, b):
    """The two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    values = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, values, side="right") / len(a)
    cdf_b = np.searchsorted(b, values, side="right") / len(b)
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_limit(n, m, alpha=1e-4):
    """The statistic two samples of one distribution stay under, but with chance alpha."""
    return math.sqrt(-0.5 * math.log(alpha / 2)) * math.sqrt((n + m) / (n * m))


def features(boxes, width, height):
    """Per draw: the box's share of the image's area, log aspect ratio, centre x and y."""
    b = np.asarray(boxes, dtype=np.float64)
    top, left, h, w = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    return {
        "area": h * w / (width * height),
        "log ratio": np.log(w / h),
        "centre x": (left + w / 2) / width,
        "centre y": (top + h / 2) / height,
    }


def gpufeed_boxes(width, height, n, seed=0):
    return [gpufeed.draw_crop(width, height, index, 3, seed=seed)[:4] for index in range(n)]


@pytest.mark.parametrize("width,height", SIZES)
def test_crop_statistics_match_torchvisions_sampler(width, height):
    ours = features(gpufeed_boxes(width, height, DRAWS), width, height)
    rng = np.random.default_rng(width * 7919 + height)
    references = {"algorithm": [torchvision_algorithm(width, height, rng) for _ in range(DRAWS)]}
    try:
        import torch
        from torchvision import transforms

        torch.manual_seed(0)
        image = torch.empty(1, height, width)
        get = transforms.RandomResizedCrop.get_params
        references["torchvision"] = [
            get(image, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(DRAWS)
        ]
    except ImportError:
        pass
    limit = ks_limit(DRAWS, DRAWS)
    for name, boxes in references.items():
        theirs = features(boxes, width, height)
        for feature in ours:
            d = ks_statistic(ours[feature], theirs[feature])
            assert d < limit, f"{width}x{height} {feature} vs {name}: KS {d:.4f} >= {limit:.4f}"


def test_flips_are_coin_flips_and_the_same_seed_draws_the_same():
    draws = [gpufeed.draw_crop(500, 375, i, 0, seed=4) for i in range(20_000)]
    flipped = sum(d[4] for d in draws)
    assert abs(flipped - 10_000) < 4 * math.sqrt(5_000)
    assert draws == [gpufeed.draw_crop(500, 375, i, 0, seed=4) for i in range(20_000)]
    assert draws != [gpufeed.draw_crop(500, 375, i, 1, seed=4) for i in range(20_000)]
    with pytest.raises(ValueError, match="scale"):
        gpufeed.draw_crop(500, 375, 0, scale=(0.5, 0.1))


def test_train_crops_are_torchvisions_resized_crop_of_the_drawn_box():
    """Each row is Pillow's crop + resize (+ mirror) of the box the batch reports."""
    pipe = gpufeed.Pipeline(
        ASSETS, train=True, seed=3, crop=96, batch_size=4, device="cpu", dtype="float32",
        mean=(0, 0, 0), std=(1 / 255,) * 3,
    )
    rows = 0
    for batch in pipe:
        images = np.from_dlpack(batch.images)
        assert batch.crops is not None and len(batch.crops) == len(batch)
        for image, path, (top, left, h, w, flipped) in zip(images, batch.ids, batch.crops):
            want = Image.open(path).convert("RGB").crop((left, top, left + w, top + h))
            want = want.resize((96, 96), Image.BILINEAR)
            if flipped:
                want = want.transpose(Image.FLIP_LEFT_RIGHT)
            got = np.rint(image).transpose(1, 2, 0)
            diff = np.abs(got - np.asarray(want, dtype=np.float64))
            assert diff.mean() <= 0.5 and np.percentile(diff, 99.9) <= 3, (path, diff.mean())
            rows += 1
    assert rows == 7
    # A new epoch draws new boxes; the same seed in a new pipeline draws the first ones again.
    # Boxes by source index, so that the new epoch's new order alone cannot make them differ.
    def boxes(pipe):
        return {i: c for b in pipe for i, c in zip(b.indices, b.crops)}

    first = boxes(gpufeed.Pipeline(ASSETS, train=True, seed=3, device="cpu"))
    again = gpufeed.Pipeline(ASSETS, train=True, seed=3, device="cpu")
    assert boxes(again) == first
    second_epoch = boxes(again)
    assert second_epoch.keys() == first.keys()
    assert all(second_epoch[i] != first[i] for i in first)


def test_equal_shards_and_padding_flags():
    paths = sorted(p for p in ASSETS.iterdir() if p.suffix in (".png", ".jpg")) * 2  # 14 images
    lengths, real = [], []
    for rank in range(3):
        pipe = gpufeed.Pipeline(paths=paths, shard=(rank, 3), batch_size=4, device="cpu")
        batches = list(pipe)
        lengths.append([len(b) for b in batches])
        real += [i for b in batches for i, p in zip(b.indices, b.padded) if not p]
        report = pipe.epoch_report()
        assert report["padded"] == sum(sum(b.padded) for b in batches)
    assert lengths == [[4, 1]] * 3
    assert sorted(real) == list(range(14))
    uneven = [
        sum(len(b) for b in gpufeed.Pipeline(paths=paths, shard=(r, 3), shard_balance="uneven",
                                             device="cpu"))
        for r in range(3)
    ]
    assert uneven == [5, 5, 4]


def test_shard_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(ValueError, match="LOCAL_RANK"):
        gpufeed.Pipeline(ASSETS, shard="env", device="cpu")
    monkeypatch.setenv("LOCAL_RANK", "0")
    pipe = gpufeed.Pipeline(ASSETS, shard="env", device="cpu")
    assert pipe.num_images == 3 and len(pipe) == 1  # rank 1 of 2 over 7 images, one batch
    with pytest.raises(ValueError, match="env"):
        gpufeed.Pipeline(ASSETS, shard="everywhere", device="cpu")


def test_webdataset_shards_with_labels(tmp_path):
    photos = ["rocket.jpg", "chelsea.png", "camera.png"]
    with tarfile.open(tmp_path / "part-000.tar", "w") as tar:
        for i, photo in enumerate(photos):
            tar.add(ASSETS / photo, arcname=f"s{i}.{photo.rsplit('.', 1)[1]}")
            cls = tmp_path / f"s{i}.cls"
            cls.write_text(str(i + 5))
            tar.add(cls, arcname=f"s{i}.cls")
    pipe = gpufeed.Pipeline(tmp_path, webdataset=True, device="cpu", batch_size=2)
    batches = list(pipe)
    assert [l for b in batches for l in b.labels] == [5, 6, 7]
    assert all("part-000.tar:s" in i for b in batches for i in b.ids)
    files = gpufeed.Pipeline(paths=[ASSETS / p for p in photos], device="cpu", batch_size=2)
    for a, b in zip(batches, files):
        assert (np.from_dlpack(a.images).view(np.uint16) == np.from_dlpack(b.images).view(np.uint16)).all()


def test_recipe_keywords_give_calls_mixing_and_soft_labels(image_folder):
    """recipe="torchvision-imagenet": each row's torchvision calls, the batch's mixing, and soft
    labels over the folder's classes that sum to one; the same seed gives the same bytes."""
    def run(seed, threads):
        pipe = gpufeed.Pipeline(image_folder, image_folder=True, recipe="torchvision-imagenet",
                                seed=seed, crop=64, batch_size=4, device="cpu", threads=threads,
                                dtype="float32")
        out = []
        for batch in pipe:
            soft = np.from_dlpack(batch.soft_labels).reshape(len(batch), -1)
            assert soft.shape[1] == 2
            np.testing.assert_allclose(soft.sum(axis=1), 1.0, rtol=1e-6)
            assert batch.mix["fn"] in ("mixup", "cutmix") and 0.0 <= batch.mix["lam"] <= 1.0
            assert len(batch.augmentations) == len(batch)
            for calls in batch.augmentations:
                for name, kwargs in calls:
                    assert isinstance(name, str) and isinstance(kwargs, dict)
            out.append(np.from_dlpack(batch.images).copy())
        return out

    first = run(3, 1)
    assert all((a == b).all() for a, b in zip(first, run(3, 4)))
    assert any((a != b).any() for a, b in zip(first, run(4, 1)))


def test_augmentation_keywords_are_checked():
    pipe = gpufeed.Pipeline(ASSETS, train=True, augment="rand-augment:2:9",
                            color_jitter=(0.4, 0.4, 0.4, 0.1), random_erasing=0.25, crop=48,
                            batch_size=4, device="cpu")
    batch = next(iter(pipe))
    assert batch.mix is None and batch.soft_labels is None
    # The colour jitter's four calls, then the policy's (Identity makes none) and the erasing.
    assert all(len(calls) >= 4 for calls in batch.augmentations)
    with pytest.raises(ValueError, match="trivial-augment-wide"):
        gpufeed.Pipeline(ASSETS, augment="augmix", device="cpu")
    with pytest.raises(ValueError, match="mixup"):
        gpufeed.Pipeline(ASSETS, mixup=0.2, device="cpu")
