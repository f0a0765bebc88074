"""Feed images to a GPU model as fast as the hardware allows.

The CPU decodes, resizes and crops each image while pixels stay uint8, the batch crosses PCIe as
uint8 (a quarter of the bytes of float32), and one CUDA kernel converts, normalizes and lays it
out on the device. Each batch's images are a DLPack tensor::

    import gpufeed, torch
    pipe = gpufeed.Pipeline("val/", batch_size=256, image_folder=True, device="cuda:0")
    for batch in pipe:                       # one epoch; iterating again runs the next one
        x = torch.from_dlpack(batch.images)  # [256, 3, 224, 224] float16 on cuda:0, no copy
        y = torch.tensor(batch.labels, device="cuda")

``torch.from_dlpack`` passes PyTorch's current stream: that stream waits for the batch on the
GPU (no host sync), and the batch's memory is not reused before the work that stream had queued
when the tensor was freed has run.
"""

from ._native import (
    KEYWORDS,
    Batch,
    CudaUnavailableError,
    GpufeedError,
    ItemError,
    PatchServer,
    Pipeline,
    ServedBatch,
    TargetLoader,
    Tensor,
    draw_crop,
    render_views,
    views_spec,
)

__all__ = [
    "KEYWORDS",
    "Batch",
    "CudaUnavailableError",
    "GpufeedError",
    "ItemError",
    "PatchServer",
    "Pipeline",
    "ServedBatch",
    "TargetLoader",
    "Tensor",
    "draw_crop",
    "render_views",
    "views_spec",
]
