#!/usr/bin/env python3
"""The `datasets` baseline of Parquet sources: a Hugging Face dataset of Parquet files read with
`datasets` (its Image() feature decoding with PIL) and torchvision's Resize(256) +
CenterCrop(224) in a PyTorch DataLoader, the batch pinned, moved with non_blocking=True and
normalized to f16 NCHW on the GPU (on the CPU without one). Prints images/s of the median of
EPOCHS epochs (the first is a warm-up). `write` makes the dataset from a folder of images, so
gpufeed reads the same files: `gpufeed run OUT --parquet --json`.

usage: python3 benches/parquet-datasets.py write DIR OUT [ROWS_PER_GROUP]
       python3 benches/parquet-datasets.py run OUT [WORKERS] [BATCH] [EPOCHS]
(needs datasets, pyarrow; `run` also torch and torchvision)
"""
import glob
import os
import statistics
import sys
import time

EXTENSIONS = (".jpg", ".jpeg", ".png")


def write(root, out, rows_per_group=256):
    """The images under `root` (sorted; labels from their first folder, ImageFolder's way) as
    OUT/data/train-0000K-of-0000N.parquet, 8 row groups a file, with a ClassLabel."""
    import datasets

    paths = sorted(os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs
                   if f.lower().endswith(EXTENSIONS))
    classes = sorted({os.path.relpath(p, root).split(os.sep)[0] for p in paths})
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)}
    )

    def rows():
        for p in paths:
            with open(p, "rb") as f:
                yield {"image": {"bytes": f.read(), "path": os.path.basename(p)},
                       "label": classes.index(os.path.relpath(p, root).split(os.sep)[0])}

    ds = datasets.Dataset.from_generator(rows, features=features)
    per_file = rows_per_group * 8
    files = max(1, -(-len(ds) // per_file))
    os.makedirs(os.path.join(out, "data"), exist_ok=True)
    for k in range(files):
        part = ds.select(range(k * per_file, min(len(ds), (k + 1) * per_file)))
        part.to_parquet(os.path.join(out, "data", f"train-{k:05d}-of-{files:05d}.parquet"),
                        batch_size=rows_per_group)
    print(f"wrote {len(ds)} rows in {files} files under {out}/data")


def run(out, workers, batch, epochs):
    import datasets
    import torch
    from torchvision import transforms
    from torchvision.transforms import functional as F

    files = sorted(glob.glob(os.path.join(out, "data", "train-*.parquet")))
    ds = datasets.load_dataset("parquet", data_files=files, split="train")
    transform = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224)])

    def prepare(batch_rows):
        batch_rows["image"] = [F.pil_to_tensor(transform(im.convert("RGB")))
                               for im in batch_rows["image"]]
        return batch_rows

    ds.set_transform(prepare)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers,
                                         pin_memory=device == "cuda", persistent_workers=workers > 0)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    rates = []
    for epoch in range(epochs):
        start, images = time.perf_counter(), 0
        for rows in loader:
            x = rows["image"].to(device, non_blocking=True)
            x = ((x.float() - mean) / std).half()
            images += x.shape[0]
        if device == "cuda":
            torch.cuda.synchronize()
        if epoch > 0 or epochs == 1:
            rates.append(images / (time.perf_counter() - start))
    print(f"datasets_dataloader_img_per_s={statistics.median(rates):.0f} images={len(ds)} "
          f"workers={workers} batch={batch} device={device}")


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "write":
        write(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 256)
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        workers = int(sys.argv[3]) if len(sys.argv) > 3 else os.cpu_count()
        batch = int(sys.argv[4]) if len(sys.argv) > 4 else 256
        epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 3
        run(sys.argv[2], workers, batch, epochs)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
