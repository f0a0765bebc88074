"""Writes the Parquet fixtures of tests/parquet.rs into the folder given (argv[1]):

- folder/: 23 small JPEG and PNG images (img_000.jpg ...), the reference, in sorted order;
- hf/: the same images as a Hugging Face dataset written by `datasets` itself (an `Image()`
  column, a `ClassLabel` label of 3 names, a caption), two files data/train-0000{0,1}-of-00002
  in row groups of 4 rows, and a data/test-00000-of-00001.parquet of the first 5 rows;
- plain/: the same images written by pyarrow as plain binary with text labels and an int64 id,
  files part-0 (snappy) and part-1 (zstd), row groups of 5 rows, a dataset card giving nothing;
- bad/: a null image (row 1), corrupt bytes (row 2), a row group whose page checksum fails
  (rows 4..8 of checksum.parquet), a file without the label column, a file whose label column
  is text where the others' is an integer.
"""

import io
import os
import sys

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

out = sys.argv[1]
N = 23
NAMES = ["cat", "dog", "bird"]
rng = np.random.default_rng(7)

folder = os.path.join(out, "folder")
os.makedirs(folder, exist_ok=True)
files, blobs, labels, captions = [], [], [], []
for i in range(N):
    h, w = int(rng.integers(20, 48)), int(rng.integers(20, 48))
    pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    ext = "png" if i % 4 == 3 else "jpg"
    path = os.path.join(folder, f"img_{i:03d}.{ext}")
    Image.fromarray(pixels).save(path, quality=90)
    files.append(path)
    with open(path, "rb") as f:
        blobs.append(f.read())
    labels.append(int(rng.integers(0, 3)))
    captions.append(f"caption {i}: a {NAMES[labels[-1]]}")
with open(os.path.join(out, "labels.txt"), "w") as f:
    f.write("".join(f"{label}\n" for label in labels))

# datasets: Image() + ClassLabel + caption, in two files of row groups of 4.
features = datasets.Features(
    {
        "image": datasets.Image(),
        "label": datasets.ClassLabel(names=NAMES),
        "caption": datasets.Value("string"),
    }
)
ds = datasets.Dataset.from_dict(
    {
        "image": [{"bytes": b, "path": os.path.basename(p)} for b, p in zip(blobs, files)],
        "label": labels,
        "caption": captions,
    },
    features=features,
)
os.makedirs(os.path.join(out, "hf", "data"), exist_ok=True)
for k in range(2):
    part = ds.shard(num_shards=2, index=k, contiguous=True)
    part.to_parquet(
        os.path.join(out, "hf", "data", f"train-{k:05d}-of-00002.parquet"), batch_size=4
    )
ds.select(range(5)).to_parquet(
    os.path.join(out, "hf", "data", "test-00000-of-00001.parquet"), batch_size=4
)

# pyarrow: plain binary, text labels, an id column.
os.makedirs(os.path.join(out, "plain"), exist_ok=True)
table = pa.table(
    {
        "jpeg": pa.array(blobs, pa.binary()),
        "cls": pa.array([NAMES[label] for label in labels], pa.string()),
        "id": pa.array([1000 + i for i in range(N)], pa.int64()),
    }
)
cut = 12
pq.write_table(table.slice(0, cut), os.path.join(out, "plain", "part-0.parquet"),
               row_group_size=5, compression="snappy")
pq.write_table(table.slice(cut), os.path.join(out, "plain", "part-1.parquet"),
               row_group_size=5, compression="zstd")

# Bad data.
bad = os.path.join(out, "bad")
os.makedirs(bad, exist_ok=True)
images = [blobs[0], None, b"\xff\xd8\xff\xe0 not really a JPEG", blobs[3]]
pq.write_table(
    pa.table({"image": pa.array(images, pa.binary()), "label": pa.array([0, 1, 2, 0], pa.int64())}),
    os.path.join(bad, "nulls.parquet"),
)
rows = 12
table = pa.table(
    {
        "image": pa.array(blobs[:rows], pa.binary()),
        "label": pa.array(labels[:rows], pa.int64()),
    }
)
path = os.path.join(bad, "checksum.parquet")
pq.write_table(table, path, row_group_size=4, write_page_checksum=True, compression="none",
               use_dictionary=False)
meta = pq.read_metadata(path)
chunk = meta.row_group(1).column(0)
start = chunk.data_page_offset
with open(path, "r+b") as f:
    f.seek(start + chunk.total_compressed_size - 10)
    byte = f.read(1)
    f.seek(start + chunk.total_compressed_size - 10)
    f.write(bytes([byte[0] ^ 0xFF]))
pq.write_table(pa.table({"image": pa.array(blobs[:2], pa.binary())}),
               os.path.join(bad, "no-label.parquet"))
pq.write_table(
    pa.table({"image": pa.array(blobs[:2], pa.binary()), "label": pa.array(["a", "b"])}),
    os.path.join(bad, "text-label.parquet"),
)
print("written", out)
