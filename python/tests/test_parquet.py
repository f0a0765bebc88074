"""parquet=True: a Parquet file written by pyarrow reads as the same images given as paths
(rows, labels, pixels), its extra columns come back by source index, and Parquet keywords
without parquet=True are refused. pyarrow is installed in CI; without it the tests skip."""

import os

import numpy as np
import pytest

import gpufeed
from conftest import ASSETS

PHOTOS = ["astronaut.png", "camera.png", "chelsea.png", "rocket.jpg", "retina.jpg"]


def write(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": (ASSETS / p).read_bytes(), "path": p} for p in PHOTOS],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            ),
            "label": pa.array([3, 1, 4, 1, 5], pa.int64()),
            "caption": pa.array([f"photo {p}" for p in PHOTOS]),
        }
    )
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(table, path, row_group_size=2)
    return path


def test_a_parquet_file_reads_as_its_images(tmp_path):
    path = write(tmp_path)
    pipe = gpufeed.Pipeline(path, parquet=True, extra_columns=["caption"], device="cpu",
                            batch_size=2)
    batches = list(pipe)
    assert [l for b in batches for l in b.labels] == [3, 1, 4, 1, 5]
    assert [i for b in batches for i in b.ids] == [f"{path}:{k}" for k in range(5)]
    files = gpufeed.Pipeline(paths=[ASSETS / p for p in PHOTOS], device="cpu", batch_size=2)
    for a, b in zip(batches, files):
        assert (np.from_dlpack(a.images).view(np.uint16)
                == np.from_dlpack(b.images).view(np.uint16)).all()
    assert pipe.extras(3) == {"caption": "photo rocket.jpg"}
    glob = gpufeed.Pipeline(os.path.join(tmp_path, "train-*.parquet"), parquet=True,
                            device="cpu")
    assert glob.num_images == 5


def test_parquet_keywords_need_parquet_true(tmp_path):
    with pytest.raises(TypeError, match="for parquet=True"):
        gpufeed.Pipeline(ASSETS, image_column="jpeg", device="cpu")
    with pytest.raises(TypeError, match="not an ImageFolder"):
        gpufeed.Pipeline(tmp_path, parquet=True, image_folder=True, device="cpu")
