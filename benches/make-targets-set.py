#!/usr/bin/env python3
"""A COCO-style detection set and a segmentation set from a folder of JPEGs (make-corpus's).

Each image gets 3-9 objects: polygons of one or two parts (most), uncompressed RLE and crowd
regions (some), boxes from the shapes; the segmentation set gets a palette PNG mask per image
(21 classes and 255 borders, VOC's layout). Deterministic from SEED. Needs numpy and Pillow.

usage: python3 benches/make-targets-set.py CORPUS OUT [SEED]
  writes OUT/instances.json (file names relative to CORPUS) and OUT/masks/<same path>.png
"""
import json
import pathlib
import sys

import numpy as np
from PIL import Image, ImageDraw


def polygon(rng, w, h):
    cx, cy = rng.uniform(0, w), rng.uniform(0, h)
    n = int(rng.integers(5, 16))
    angles = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = rng.uniform(0.05, 0.3, n) * min(w, h)
    pts = np.stack([cx + radii * np.cos(angles), cy + radii * np.sin(angles)], -1)
    pts[:, 0] = pts[:, 0].clip(0, w)
    pts[:, 1] = pts[:, 1].clip(0, h)
    return [round(float(v), 2) for v in pts.ravel()]


def box_of(parts):
    xs = [v for p in parts for v in p[0::2]]
    ys = [v for p in parts for v in p[1::2]]
    return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]


def rle_of(mask):
    flat = mask.ravel(order="F")
    runs, cur, count = [], 0, 0
    for v in flat:
        if v != cur:
            runs.append(count)
            cur, count = v, 0
        count += 1
    runs.append(count)
    return runs


def main():
    corpus, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    rng = np.random.default_rng(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    files = sorted(corpus.rglob("*.jpg"))
    images, annotations = [], []
    for i, path in enumerate(files):
        with Image.open(path) as im:
            w, h = im.size
        rel = path.relative_to(corpus).as_posix()
        images.append({"id": i + 1, "file_name": rel, "width": w, "height": h})
        semantic = Image.new("P", (w, h), 0)
        draw = ImageDraw.Draw(semantic)
        for k in range(int(rng.integers(3, 10))):
            label = int(rng.integers(1, 21))
            if k % 5 == 4:
                m = np.zeros((h, w), np.uint8)
                x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
                bw, bh = int(rng.integers(4, w - x0 + 1)), int(rng.integers(4, h - y0 + 1))
                m[y0 : y0 + bh, x0 : x0 + bw] = 1
                segm = {"size": [h, w], "counts": rle_of(m)}
                bbox = [x0, y0, bw, bh]
                crowd = int(k % 10 == 9)
                draw.rectangle([x0, y0, x0 + bw - 1, y0 + bh - 1], fill=label, outline=255)
            else:
                parts = [polygon(rng, w, h) for _ in range(1 + int(k % 3 == 1))]
                segm, bbox, crowd = parts, box_of(parts), 0
                for p in parts:
                    draw.polygon(p, fill=label, outline=255)
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": label,
                                "bbox": bbox, "iscrowd": crowd, "area": bbox[2] * bbox[3],
                                "segmentation": segm})
        palette = (np.arange(256 * 3) * 37 % 256).astype(np.uint8).tolist()
        semantic.putpalette(palette)
        dest = out / "masks" / pathlib.Path(rel).with_suffix(".png")
        dest.parent.mkdir(parents=True, exist_ok=True)
        semantic.save(dest)
    cats = [{"id": c, "name": f"class{c}"} for c in range(1, 21)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "instances.json").write_text(json.dumps({"images": images, "annotations": annotations, "categories": cats}))
    print(f"{len(images)} images, {len(annotations)} objects -> {out}")


if __name__ == "__main__":
    main()
