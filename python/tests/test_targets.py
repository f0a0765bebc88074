"""Dense targets against torchvision v2 on the drawn calls.

A small COCO-style set (random photos-like JPEGs, polygon objects of one and several parts,
uncompressed and compressed RLE objects, crowd regions, keypoints, boxes partly outside) and a
segmentation set (palette PNG masks) are made here; `gpufeed targets` runs each recipe with
`--save`; every row is then rebuilt with torchvision itself: `CocoDetection` wrapped by
`wrap_dataset_for_transforms_v2` (pycocotools rasterizes the masks), then each saved call as
`torchvision.transforms.v2.functional` on the PIL image, `BoundingBoxes` and `Mask`, and
`SanitizeBoundingBoxes`. Images and masks must be identical, boxes within 1e-4 pixels, the same
objects kept.
"""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")
pytest.importorskip("pycocotools", reason="pycocotools is not installed")

from PIL import Image  # noqa: E402
from pycocotools import mask as coco_mask  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402


def cli():
    path = os.environ.get("GPUFEED_CLI")
    if not path:
        pytest.skip("GPUFEED_CLI is not set (the gpufeed executable, e.g. target/release/gpufeed)")
    return path


def photo(rng, w, h):
    """A smooth image with some edges (so resampling differences would show)."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack(
        [
            127 + 100 * np.sin(x / (5 + rng.integers(20))),
            127 + 100 * np.cos(y / (5 + rng.integers(20))),
            (x * 3 + y * 5) % 256,
        ],
        axis=-1,
    )
    noise = rng.integers(0, 40, size=(h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def polygon(rng, w, h):
    cx, cy = rng.uniform(-0.1 * w, 1.1 * w), rng.uniform(-0.1 * h, 1.1 * h)
    n = int(rng.integers(3, 12))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = rng.uniform(2, 0.4 * min(w, h), n)
    pts = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], -1)
    return [round(float(v), 2) for v in pts.ravel()]


def make_coco(root, rng, n=10):
    images, annotations = [], []
    (root / "images").mkdir()
    for i in range(n):
        w, h = int(rng.integers(40, 300)), int(rng.integers(40, 300))
        Image.fromarray(photo(rng, w, h)).save(root / "images" / f"{i:03d}.jpg", quality=90)
        images.append({"id": 100 + i, "file_name": f"{i:03d}.jpg", "width": w, "height": h})
        for k in range(int(rng.integers(0, 6))):
            kind = k % 4
            if kind == 0:
                segm = [polygon(rng, w, h)]
            elif kind == 1:
                segm = [polygon(rng, w, h), polygon(rng, w, h)]
            else:
                m = np.zeros((h, w), np.uint8, order="F")
                x0, y0 = int(rng.integers(0, w - 5)), int(rng.integers(0, h - 5))
                m[y0 : y0 + int(rng.integers(1, h)), x0 : x0 + int(rng.integers(1, w))] = 1
                rle = coco_mask.encode(np.asfortranarray(m))
                if kind == 2:
                    segm = {"size": rle["size"], "counts": rle["counts"].decode()}
                else:
                    flat = m.ravel(order="F")
                    runs, cur, count = [], 0, 0
                    for v in flat:
                        if v != cur:
                            runs.append(count)
                            cur, count = v, 0
                        count += 1
                    runs.append(count)
                    segm = {"size": [h, w], "counts": runs}
            x, y = float(rng.uniform(-20, w)), float(rng.uniform(-20, h))
            bw, bh = float(rng.uniform(0, w / 2)), float(rng.uniform(0, h / 2))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": 100 + i,
                    "category_id": int(rng.integers(1, 4)),
                    "bbox": [round(x, 3), round(y, 3), round(bw, 3), round(bh, 3)],
                    "iscrowd": int(kind == 2),
                    "area": bw * bh,
                    "segmentation": segm,
                    "keypoints": [round(x + 1, 1), round(y + 1, 1), 2],
                }
            )
    cats = [{"id": c, "name": f"c{c}"} for c in (1, 2, 3)]
    ann = root / "instances.json"
    ann.write_text(json.dumps({"images": images, "annotations": annotations, "categories": cats}))
    return ann


def run_cli(args, out):
    subprocess.run([cli(), "targets", *args, "--save", str(out), "--batch-size", "4"], check=True)
    return [json.loads(line) for line in (out / "targets.jsonl").read_text().splitlines()]


DENSE = (tv_tensors.BoundingBoxes, tv_tensors.Mask, tv_tensors.KeyPoints)


def each(fn, image, target, **kwargs):
    """`fn` on the image and on every tv_tensor of the target."""
    out = {
        k: fn(v, **kwargs) if isinstance(v, DENSE) else v
        for k, v in target.items()
    }
    return fn(image, **kwargs), out


def replay(image, target, ops):
    """Each saved call as torchvision does it."""
    for op in ops:
        if "resize" in op:
            image, target = each(F.resize, image, target, size=op["resize"], antialias=True)
        elif "crop" in op:
            t, l, h, w = op["crop"]
            image, target = each(F.crop, image, target, top=t, left=l, height=h, width=w)
        elif "pad" in op:
            image = F.pad(image, op["pad"], fill=list(op["fill"]))
            target = {
                k: F.pad(v, op["pad"], fill=op["mask_fill"] if k == "semantic" else 0)
                if isinstance(v, DENSE)
                else v
                for k, v in target.items()
            }
        elif "iou_crop" in op:
            t, l, h, w = op["iou_crop"]
            boxes = target["boxes"]
            cx, cy = 0.5 * (boxes[:, 0] + boxes[:, 2]), 0.5 * (boxes[:, 1] + boxes[:, 3])
            inside = (l < cx) & (cx < l + w) & (t < cy) & (cy < t + h)
            image, target = each(F.crop, image, target, top=t, left=l, height=h, width=w)
            target["boxes"][~inside] = 0
        elif "color" in op:
            image = getattr(F, op["color"])(image, **op["args"])
        elif "permute_channels" in op:
            image = F.permute_channels(image, op["permute_channels"])
        elif "horizontal_flip" in op:
            image, target = each(F.horizontal_flip, image, target)
        elif "sanitize" in op:
            getter = "default"
            if "keypoints" in target:
                target["kp"] = target.pop("keypoints").as_subclass(torch.Tensor)
                getter = lambda inputs: (inputs[1]["labels"], inputs[1]["kp"])  # noqa: E731
            image, target = v2.SanitizeBoundingBoxes(labels_getter=getter)(image, target)
    return image, target


def check_row(row, saved, image, target, masks_file=None, semantic_file=None):
    h, w = row["size"]
    got = saved[row["row"]]
    want = image.permute(1, 2, 0).numpy() if isinstance(image, torch.Tensor) else np.asarray(image)
    assert want.shape == (h, w, 3), (row["id"], want.shape, (h, w))
    np.testing.assert_array_equal(got[:h, :w], want, err_msg=f"{row['id']} {row['ops']}")
    assert (got[h:] == 0).all() and (got[:, w:] == 0).all()
    if "boxes" in target:
        boxes = np.array(row["boxes"], np.float32).reshape(-1, 4)
        np.testing.assert_allclose(boxes, target["boxes"].numpy(), atol=1e-4, rtol=0)
        assert row["labels"] == target["labels"].tolist(), row["id"]
    if "kp" in target:
        got_kp = np.array([k[:2] for k in row["keypoints"]], np.float32).reshape(-1, 2)
        np.testing.assert_allclose(got_kp, target["kp"].numpy(), atol=1e-4, rtol=0)
    if masks_file is not None and "masks" in target:
        o0, o1 = row["objects"]
        planes = masks_file[o0:o1, :h, :w]
        np.testing.assert_array_equal(planes, target["masks"].numpy(), err_msg=row["id"])
    if semantic_file is not None:
        plane = semantic_file[row["row"], :h, :w]
        np.testing.assert_array_equal(plane, target["semantic"].numpy()[0], err_msg=row["id"])


def skip_before_pillow_13():
    """The targets' resizes follow Pillow 13's pass order (which pass runs first); on an older
    Pillow the reference's order differs, and so may a level at some pixels."""
    import PIL

    if int(PIL.__version__.split(".")[0]) < 13:
        pytest.skip(f"Pillow {PIL.__version__}: the targets' resizes follow Pillow 13's pass order")


@pytest.mark.parametrize("recipe", ["none", "hflip", "lsj", "multiscale", "ssd", "ssdlite", "letterbox:320:256"])
def test_detection_recipes_match_torchvision(tmp_path, recipe):
    skip_before_pillow_13()
    rng = np.random.default_rng(59)
    data = tmp_path / "data"
    data.mkdir()
    ann = make_coco(data, rng)
    base = torchvision.datasets.CocoDetection(str(data / "images"), str(ann))
    dataset = torchvision.datasets.wrap_dataset_for_transforms_v2(
        base, target_keys={"boxes", "labels", "masks", "image_id"}
    )
    by_index = {}
    for seed in (0, 7):
        out = tmp_path / f"out-{seed}"
        rows = run_cli(
            [str(data / "images"), "--coco", str(ann), "--detection-recipe", recipe, "--seed", str(seed)],
            out,
        )
        assert len(rows) == len(base)
        for row in rows:
            image, target = dataset[row["index"]]
            anns = base.coco.loadAnns(base.coco.getAnnIds(base.ids[row["index"]]))
            if anns:
                target["keypoints"] = tv_tensors.KeyPoints(
                    torch.tensor([a["keypoints"][:2] for a in anns], dtype=torch.float32),
                    canvas_size=image.size[::-1],
                )
            if "boxes" not in target:
                target["boxes"] = tv_tensors.BoundingBoxes(
                    torch.zeros((0, 4)), format="XYXY", canvas_size=image.size[::-1]
                )
                target["labels"] = torch.zeros((0,), dtype=torch.int64)
            if recipe == "ssd":
                # The references' `--backend tensor`: the colour calls on the uint8 tensor.
                image = F.pil_to_tensor(image)
            image, target = replay(image, target, row["ops"])
            saved = np.load(out / row["file"])
            masks = out / row["file"].replace(".images.", ".masks.")
            check_row(row, saved, image, target, np.load(masks) if masks.exists() else None)
            by_index.setdefault(row["index"], []).append(row["ops"])
    if recipe not in ("none", "letterbox:320:256"):
        assert any(a != b for a, b in by_index.values()), "seeds drew the same calls"


@pytest.mark.parametrize("recipe", ["train", "eval"])
def test_segmentation_recipes_match_torchvision(tmp_path, recipe):
    skip_before_pillow_13()
    rng = np.random.default_rng(60)
    images, masks = tmp_path / "images", tmp_path / "masks"
    images.mkdir()
    masks.mkdir()
    palette = list(rng.integers(0, 256, 768))
    for i in range(6):
        w, h = int(rng.integers(100, 600)), int(rng.integers(100, 600))
        Image.fromarray(photo(rng, w, h)).save(images / f"{i}.jpg", quality=90)
        m = Image.fromarray(rng.integers(0, 21, (h // 8 + 1, w // 8 + 1)).astype(np.uint8)).resize(
            (w, h), Image.NEAREST
        )
        m = Image.frombytes("P", (w, h), m.tobytes())
        m.putpalette(palette)
        m.save(masks / f"{i}.png")
    for seed in (0, 3):
        out = tmp_path / f"out-{seed}"
        rows = run_cli(
            [str(images), "--masks", str(masks), "--segmentation-recipe", recipe, "--seed", str(seed)],
            out,
        )
        assert len(rows) == 6
        for row in rows:
            stem = pathlib.Path(row["id"]).stem
            image = Image.open(images / f"{stem}.jpg").convert("RGB")
            semantic = tv_tensors.Mask(torch.from_numpy(np.array(Image.open(masks / f"{stem}.png")))[None])
            image, target = replay(image, {"semantic": semantic}, row["ops"])
            saved = np.load(out / row["file"])
            sem = np.load(out / row["file"].replace(".images.", ".semantic."))
            check_row(row, saved, image, target, semantic_file=sem)


def test_masks_match_pycocotools_on_random_polygons(tmp_path):
    """Many odd polygons (outside the image, repeated points, slivers) rasterized as pycocotools
    does: the saved instance masks of the `none` recipe against `annToMask`."""
    from pycocotools.coco import COCO

    rng = np.random.default_rng(61)
    (tmp_path / "images").mkdir()
    w, h = 61, 47
    Image.fromarray(photo(rng, w, h)).save(tmp_path / "images" / "a.png")
    annotations = []
    for k in range(300):
        n = int(rng.integers(3, 9))
        pts = rng.uniform(-15, 75, 2 * n)
        if k % 5 == 0:
            pts = np.round(pts)  # on pixel edges
        if k % 7 == 0:
            pts[2:4] = pts[0:2]  # a repeated point
        if k % 11 == 0:
            pts = pts * 0.1 + 20  # a sliver
        annotations.append(
            {"id": k + 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2], "iscrowd": 0,
             "segmentation": [[float(v) for v in pts]], "area": 1.0}
        )
    ann = tmp_path / "ann.json"
    ann.write_text(json.dumps({
        "images": [{"id": 1, "file_name": "a.png", "width": w, "height": h}],
        "annotations": annotations, "categories": [{"id": 1, "name": "x"}],
    }))
    out = tmp_path / "out"
    subprocess.run(
        [cli(), "targets", str(tmp_path / "images"), "--coco", str(ann), "--save", str(out),
         "--size-divisible", "1"],
        check=True,
    )
    # `none` still sanitizes: the 2x2 boxes are all kept.
    masks = np.load(out / "batch-0-00000.masks.npy")
    coco = COCO(str(ann))
    want = np.stack([coco.annToMask(a) for a in coco.loadAnns(coco.getAnnIds(imgIds=[1]))])
    assert masks.shape == want.shape
    np.testing.assert_array_equal(masks, want)


def test_python_loader_gives_torchvision_style_targets(tmp_path):
    """`gpufeed.TargetLoader`: the padded images and a list of dicts, each row equal to
    torchvision's replay of its calls."""
    gpufeed = pytest.importorskip("gpufeed", reason="the gpufeed package is not installed")
    rng = np.random.default_rng(62)
    data = tmp_path / "data"
    data.mkdir()
    ann = make_coco(data, rng, n=6)
    base = torchvision.datasets.CocoDetection(str(data / "images"), str(ann))
    dataset = torchvision.datasets.wrap_dataset_for_transforms_v2(
        base, target_keys={"boxes", "labels", "masks"}
    )
    loader = gpufeed.TargetLoader(str(data / "images"), coco=str(ann), recipe="lsj", seed=3, batch_size=4)
    rows = 0
    for images, targets in loader:
        assert images.dtype == np.uint8 and images.shape[1:] == (1024, 1024, 3)
        for i, t in enumerate(targets):
            image, target = dataset[t["index"]]
            if "boxes" not in target:
                continue
            image, target = replay(image, target, t["ops"])
            h, w = t["size"]
            np.testing.assert_array_equal(images[i, :h, :w], np.asarray(image))
            np.testing.assert_allclose(t["boxes"], target["boxes"].numpy(), atol=1e-4, rtol=0)
            assert t["labels"].tolist() == target["labels"].tolist()
            np.testing.assert_array_equal(t["masks"], target["masks"].numpy())
            rows += 1
    assert rows > 0
    assert loader.report()["skipped"] == []
    # Host batches are decoded on the CPU.
    assert loader.report()["decoded_on_device"] == 0
    with pytest.raises(ValueError, match="recipe"):
        gpufeed.TargetLoader(str(data / "images"), coco=str(ann), recipe="nope")
    with pytest.raises(ValueError, match="nope"):
        gpufeed.TargetLoader(str(data / "images"), coco=str(ann), decode="nope")


def test_python_loader_on_the_gpu_matches_the_host_batch(tmp_path):
    """`TargetLoader(..., device="cuda:0")`: the images normalized on the GPU equal the host
    batch scaled on the host (f32, detection's default [0, 1]); the masks on the GPU equal the
    host masks laid out at the padded size; the targets the same."""
    gpufeed = pytest.importorskip("gpufeed", reason="the gpufeed package is not installed")
    from conftest import cuda_torch

    cuda = cuda_torch()
    rng = np.random.default_rng(63)
    data = tmp_path / "data"
    data.mkdir()
    ann = make_coco(data, rng, n=7)
    args = dict(coco=str(ann), recipe="lsj", seed=4, batch_size=3)
    host = gpufeed.TargetLoader(str(data / "images"), **args)
    device = gpufeed.TargetLoader(str(data / "images"), device="cuda:0", **args)
    batches = 0
    for (images, targets), (gimages, gtargets, gmasks) in zip(host, device):
        x = cuda.from_dlpack(gimages)
        assert x.dtype == cuda.float32 and x.is_cuda
        want = cuda.from_numpy(images).permute(0, 3, 1, 2).float().mul_(1.0 / 255.0)
        assert cuda.equal(x.cpu(), want)
        masks = cuda.from_dlpack(gmasks["instance"]).cpu().numpy()
        for i, (t, g) in enumerate(zip(targets, gtargets)):
            np.testing.assert_array_equal(t["boxes"], g["boxes"])
            h, w = t["size"]
            o = g["mask_offset"]
            np.testing.assert_array_equal(masks[o : o + len(t["labels"]), :h, :w], t["masks"])
        assert gmasks["semantic"] is None
        batches += 1
    assert batches == 3


def test_python_loader_reads_webdataset_shards_as_the_folder(tmp_path):
    """`gpufeed.TargetLoader(shards, webdataset="instances")`: shards written by Python's
    tarfile (`KEY.jpg` and `KEY.json` in COCO's per-image form) give the batches of the folder
    and its COCO file, byte for byte."""
    import tarfile

    gpufeed = pytest.importorskip("gpufeed", reason="the gpufeed package is not installed")
    rng = np.random.default_rng(63)
    data = tmp_path / "data"
    data.mkdir()
    ann = make_coco(data, rng, n=7)
    coco = json.loads(ann.read_text())
    shards = tmp_path / "shards"
    shards.mkdir()
    for first in range(0, len(coco["images"]), 3):
        with tarfile.open(shards / f"part-{first:03d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for image in coco["images"][first : first + 3]:
                key = pathlib.Path(image["file_name"]).stem
                tar.add(data / "images" / image["file_name"], arcname=f"{key}.jpg")
                mine = [a for a in coco["annotations"] if a["image_id"] == image["id"]]
                body = json.dumps({"annotations": mine, "categories": coco["categories"]}).encode()
                info = tarfile.TarInfo(f"{key}.json")
                info.size = len(body)
                tar.addfile(info, __import__("io").BytesIO(body))
    args = dict(recipe="hflip", seed=4, shuffle=True, batch_size=3)
    folder = gpufeed.TargetLoader(str(data / "images"), coco=str(ann), **args)
    wds = gpufeed.TargetLoader(str(shards), webdataset="instances", **args)
    batches = 0
    for (a_images, a_targets), (b_images, b_targets) in zip(folder, wds, strict=True):
        np.testing.assert_array_equal(a_images, b_images)
        for a, b in zip(a_targets, b_targets, strict=True):
            assert b["id"].startswith(str(shards)) and b["id"].endswith(".jpg")
            for key in ("boxes", "labels", "iscrowd", "masks", "size", "index", "ops"):
                np.testing.assert_array_equal(np.asarray(a[key]), np.asarray(b[key]), err_msg=key)
        batches += 1
    assert batches == 3
    assert wds.report()["skipped"] == []
    with pytest.raises(ValueError, match="webdataset"):
        gpufeed.TargetLoader(str(shards), webdataset="boxes")
