"""Type stubs of gpufeed's native module.

Pipeline.__init__ lists every keyword with the type and default of the binding's keyword table
(python/src/options.rs); python/tests/test_keywords.py checks that they agree.
"""

import os
from typing import Any, Iterator, List, Literal, Optional, Sequence, Tuple, Union

KEYWORDS: list[str]
"""Every keyword of Pipeline(), in the signature's order."""

def _keyword_table() -> list[Tuple[str, str, str, str]]:
    """(name, type, default, doc) of every keyword of Pipeline(), as help() shows them."""

class GpufeedError(RuntimeError):
    """Something gpufeed could not do (CUDA, the prefetch thread); the message says what."""

class ItemError(GpufeedError):
    """An image could not be read or decoded under on_error="fail"; the message names the file."""

class CudaUnavailableError(GpufeedError):
    """A CUDA device was asked for but cannot be used; the message says which piece is missing."""

class Tensor:
    """A batch's images, on a CUDA device or in host memory; hand it to torch.from_dlpack or
    numpy.from_dlpack (no copy)."""

    def __dlpack__(
        self,
        stream: Optional[int] = None,
        *,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self) -> Tuple[int, int]: ...
    @property
    def shape(self) -> Tuple[int, ...]: ...
    @property
    def strides(self) -> Tuple[int, ...]: ...
    @property
    def dtype(self) -> Literal["float16", "bfloat16", "float32", "int32", "int64"]: ...
    @property
    def layout(self) -> Literal["nchw", "nhwc"]: ...
    @property
    def device(self) -> str: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def cuda_stream(self) -> Optional[int]: ...
    def __len__(self) -> int: ...

class Batch:
    """One batch: the images, and which images they are."""

    images: Tensor
    labels: Optional[list[int]]
    ids: list[str]
    indices: list[int]
    skipped: list[Tuple[str, str]]
    epoch: int
    padded: list[bool]
    crops: Optional[list[Tuple[int, int, int, int, bool]]]
    augmentations: Optional[list[list[Tuple[str, dict[str, Any]]]]]
    mix: Optional[dict[str, Any]]
    soft_labels: Optional[Tensor]
    tokens: Optional[Tensor]
    """With patches=: [rows, patch_dim] packed or [N, length, patch_dim] padded (the images)."""
    grids: Optional[Tensor]
    """With patches=: [N, 3] int64, each image's (t, h, w) in patches (image_grid_thw)."""
    cu_seqlens: Optional[Tensor]
    """With patches=: [N + 1] int32, each image's first row, then the rows."""
    mask: Optional[Tensor]
    """With patches=: int32, 1 for an image's token: [N, length] padded, [rows] packed."""
    spatial_shapes: Optional[Tensor]
    """With patches=: [N, 2] int64, each image's (h, w) in patches."""
    coordinates: Optional[Tensor]
    """With patches=: int64 (row, column) of each token's patch: [N, length, 2] or [rows, 2]."""
    tokens_per_image: Optional[list[int]]
    views: Optional[list[Tensor]]
    """With views=: one tensor per view group, [count, N, 3, size, size] (nchw) or
    [count, N, size, size, 3] (nhwc), normalized, on the batch's device."""
    view_draws: Optional[list[list[dict[str, Any]]]]
    """With views=: for each image, what each of its views drew (box, flip, colour calls)."""
    def __len__(self) -> int: ...

def draw_crop(
    width: int,
    height: int,
    index: int,
    epoch: int = 0,
    *,
    seed: int = 0,
    scale: Tuple[float, float] = (0.08, 1.0),
    ratio: Tuple[float, float] = (0.75, 4.0 / 3.0),
    hflip: float = 0.5,
) -> Tuple[int, int, int, int, bool]:
    """(top, left, height, width, flipped): what a Pipeline(seed=seed) with RandomResizedCrop
    and RandomHorizontalFlip(hflip) draws for the image with this source index in this epoch."""

class Pipeline:
    """Batches of images, prepared in the background. Iterating runs one epoch; iterating again
    runs the next one. Defaults follow torchvision's evaluation transform: Resize(256) +
    CenterCrop(224), ImageNet mean and std, float16 NCHW on cuda:0, batches of 256."""

    def __init__(
        self,
        source: Union[str, os.PathLike[str], None] = None,
        *,
        paths: Union[str, os.PathLike[str], Sequence[Union[str, os.PathLike[str]]], None] = None,
        labels: Optional[Sequence[int]] = None,
        image_folder: bool = False,
        webdataset: bool = False,
        parquet: bool = False,
        image_column: str = "image",
        label_column: Optional[str] = None,
        extra_columns: Optional[Sequence[str]] = None,
        split: str = "train",
        state: Union[dict[str, Any], str, None] = None,
        cache_dir: Union[str, os.PathLike[str], None] = None,
        cache_limit: Optional[int] = None,
        read_budget: int = 1073741824,  # 1 GiB
        max_requests: int = 64,
        shuffle_window: Optional[int] = None,
        batch_size: int = 256,
        resize_mode: Literal["center-crop", "stretch", "letterbox", "random-resized-crop"] = "center-crop",
        resize: Optional[int] = None,
        crop: Union[int, Tuple[int, int]] = (224, 224),
        pad: int = 0,
        interpolation: Literal["bilinear", "bicubic", "nearest", "lanczos", "box", "hamming"] = "bilinear",
        mean: Sequence[float] = (0.485, 0.456, 0.406),
        std: Sequence[float] = (0.229, 0.224, 0.225),
        dtype: Union[str, Any] = "float16",
        layout: Literal["nchw", "nhwc"] = "nchw",
        channel_order: Literal["rgb", "bgr"] = "rgb",
        device: Union[str, int, Any, None] = None,
        on_error: Literal["skip", "fail"] = "skip",
        drop_last: bool = False,
        shuffle: Optional[bool] = None,
        shard: Union[Tuple[int, int], Literal["env"], None] = None,
        shard_balance: Literal["pad", "drop", "uneven"] = "pad",
        pillow_version: Optional[str] = None,
        train: bool = False,
        seed: int = 0,
        hflip: Optional[float] = None,
        scale: Tuple[float, float] = (0.08, 1.0),
        ratio: Tuple[float, float] = (0.75, 1.3333333333333333),
        threads: int = 0,
        prefetch: int = 2,
        max_pixels: Optional[int] = None,
        exif_orientation: bool = False,
        dct_scaling: bool = False,
        max_file_bytes: int = 1073741824,  # 1 GiB
        decode_memory: int = 4294967296,  # 4 GiB
        decode: Literal["auto", "cpu", "hybrid"] = "auto",
        gpu_share: Optional[float] = None,
        min_gpu_share: Optional[float] = None,
        assisted_share: float = 1.0,
        planned_epochs: Optional[int] = None,
        gray16: Literal["clip", "scale"] = "clip",
        augment: str = "none",
        color_jitter: Optional[Tuple[float, float, float, float]] = None,
        random_erasing: Optional[float] = None,
        mixup: Optional[float] = None,
        cutmix: Optional[float] = None,
        num_classes: Optional[int] = None,
        recipe: Optional[Literal["torchvision-imagenet"]] = None,
        patches: Optional[str] = None,
        min_pixels: Optional[int] = None,
        max_patches: Optional[int] = None,
        patch_size: Optional[int] = None,
        seq_lens: Optional[Sequence[int]] = None,
        tokens_per_batch: Optional[int] = None,
        packing: Optional[Literal["packed", "padded"]] = None,
        eval_preset: Optional[Literal["clip", "siglip-384", "siglip-224", "dinov2"]] = None,
        views: Union[Literal["dinov2", "simclr"], str, os.PathLike[str], Sequence[dict[str, Any]], None] = None,
    ) -> None: ...
    def __iter__(self) -> Iterator[Batch]: ...
    def __next__(self) -> Batch: ...
    def next_batch(self) -> Optional[Batch]: ...
    def next_epoch(self) -> int: ...
    def state_dict(self) -> dict[str, Any]:
        """Where the pipeline stands (the position after the last batch taken), to save with the
        model's checkpoint; give it back as Pipeline(..., state=d) or load_state_dict(d)."""
    def load_state_dict(self, state_dict: Union[dict[str, Any], str]) -> None:
        """Go on from a state_dict(); ValueError names a source or option that differs."""
    def __len__(self) -> int:
        """Batches an epoch yields when no image fails (as len(DataLoader) counts them)."""
    @property
    def num_images(self) -> int:
        """Images an epoch of this process (its shard) holds, before any is skipped."""
    def extras(self, index: int) -> Optional[dict[str, Union[int, float, bool, str, None]]]:
        """A Parquet source's extra_columns for source index `index` (batch.indices)."""
    @property
    def left_out(self) -> dict[str, int]:
        """Files the folder listing left out because of their extension, by extension."""
    @property
    def epoch(self) -> int: ...
    @property
    def source_len(self) -> int: ...
    @property
    def class_names(self) -> Optional[list[str]]: ...
    @property
    def device_description(self) -> str: ...
    @property
    def decode_description(self) -> str:
        """Which lanes decode the images, and why."""
    def profile(self) -> dict[str, dict[str, float]]:
        """Where the time went: each stage's seconds (summed over threads) and count."""
    @property
    def cuda_stream(self) -> Optional[int]: ...
    def epoch_report(self) -> dict[str, Any]: ...

class ServedBatch:
    """One served request: its tokens and side tensors as DLPack tensors on the server's device
    (each side tensor is made the first time it is read, then kept)."""

    tokens: Tensor
    """[rows, patch_dim] packed (Qwen2-VL's pixel_values), [images, max_patches, patch_dim]
    padded (SigLIP2's)."""
    ids: list[str]
    """Each image's id: its path, or "image N of the request" for bytes."""
    indices: list[int]
    """Which image of the request each one is."""
    skipped: list[Tuple[str, str]]
    """Images left out under on_error="skip": (id, reason)."""
    preset: str
    decoded_by: Tuple[int, int]
    """How many images the CPU threads decoded and how many the GPU decode lane: (cpu, gpu)."""
    @property
    def grids(self) -> Tensor:
        """image_grid_thw: [images, 3] int64."""
    @property
    def cu_seqlens(self) -> Tensor:
        """[images + 1] int32: each image's first row, then the rows."""
    @property
    def mask(self) -> Tensor:
        """1 for a token, 0 for padding: [images, length] int32 padded, [rows] packed."""
    @property
    def spatial_shapes(self) -> Tensor:
        """SigLIP2's spatial_shapes: [images, 2] int64."""
    @property
    def coordinates(self) -> Tensor:
        """Each token's patch (row, column): [images, length, 2] or [rows, 2] int64."""
    @property
    def grid_list(self) -> list[Tuple[int, int, int]]: ...
    @property
    def sizes(self) -> list[Tuple[int, int]]:
        """Each image's resized (height, width)."""
    def __len__(self) -> int: ...

class PatchServer:
    """Serves patch sequences: each serve([...]) turns a request's images (bytes or paths) into
    one packed batch on the device, as a Pipeline with the same preset would, without starting
    one per request."""

    def __init__(
        self,
        preset: Literal["qwen2-vl", "qwen3-vl", "siglip2-naflex"] = "qwen2-vl",
        *,
        device: Optional[Union[str, Any]] = None,
        dtype: Optional[Union[str, Any]] = None,
        max_images: int = 32,
        max_tokens: Optional[int] = None,
        threads: int = 0,
        on_error: Literal["fail", "skip"] = "fail",
        decode: Literal["auto", "cpu", "hybrid"] = "auto",
        min_pixels: Optional[int] = None,
        max_pixels: Optional[int] = None,
        max_patches: Optional[int] = None,
        packed: Optional[bool] = None,
        torchvision: bool = False,
        mean: Optional[Sequence[float]] = None,
        std: Optional[Sequence[float]] = None,
        pillow_version: Optional[Tuple[int, int]] = None,
    ) -> None:
        """device "cuda:0" (default) or "cpu"; dtype float16 (default), bfloat16 or float32;
        the settings the model's processor config changes (min_pixels, max_pixels for Qwen2-VL;
        max_patches for SigLIP2); torchvision=True for transformers' torchvision processor;
        decode="cpu" leaves every image to the CPU threads (by default on a CUDA device the GPU
        decode lane takes the JPEGs it decodes exactly as they do)."""
    def serve(
        self, images: Sequence[Union[bytes, bytearray, memoryview, str, os.PathLike[str]]]
    ) -> ServedBatch:
        """One request: encoded images or paths. A bad image raises ItemError naming it (or is
        listed in .skipped under on_error="skip"); the server goes on serving."""
    @property
    def max_images(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def preset(self) -> str: ...
    @property
    def device_description(self) -> str: ...
    @property
    def decode_description(self) -> str:
        """Which lanes decode the requests' images, and why."""
def views_spec(preset: Union[str, os.PathLike[str], Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """A multi-crop preset's view groups ("dinov2" or "simclr"), or a spec's, as the list of
    dicts Pipeline's views= takes: every field written, to start a recipe of one's own from."""

def render_views(
    data: bytes,
    preset: Union[str, os.PathLike[str], Sequence[dict[str, Any]]] = "dinov2",
    index: int = 0,
    epoch: int = 0,
    *,
    seed: int = 0,
    pillow_version: Optional[Tuple[int, int]] = None,
) -> List[Tuple[bytes, int, str]]:
    """The views of a multi-crop preset ("dinov2" or "simclr"), or of a spec of view groups as
    Pipeline's views= takes it, of one encoded image, decoded once: (pixels, size, draw) per view, pixels size*size*3 uint8 bytes (HWC, RGB), draw a JSON
    object of what the view drew, as `gpufeed run --views` saves it. The resize follows
    `pillow_version` ((major, minor)), by default the installed Pillow's."""
class TargetLoader:
    """Detection or segmentation batches with their targets: COCO (coco=), image/mask pairs
    (masks=) or WebDataset shards or their URL (webdataset="detection", "instances" or
    "semantic"), through one of torchvision's reference recipes. Iterating runs one epoch and yields
    (images, targets): uint8 [N, H, W, 3] padded images and one dict a row (boxes float32 XYXY,
    labels int64, iscrowd, masks or semantic uint8, keypoints, size, index, id, ops, inverse).
    With device="cuda:0": (images, targets, masks), images a gpufeed.Tensor [N, 3, H, W] normalized
    on the GPU (dtype, mean, std), masks {"instance": Tensor or None, "semantic": Tensor or None}.
    prefetch batches (by default six rows for each of gpufeed's threads, at least 3) are made
    ahead while one is used (0: each made when asked for). decode (with a device): "auto" (the
    GPU's cores decode baseline JPEGs once their decoders are open), "hybrid" (the same, the first
    batch waiting for them) or "cpu"; the bytes are the same either way."""
    def __init__(
        self,
        images: Union[str, os.PathLike[str]],
        *,
        coco: Optional[Union[str, os.PathLike[str]]] = None,
        masks: Optional[Union[str, os.PathLike[str]]] = None,
        webdataset: Optional[str] = None,
        recipe: str = "none",
        seed: int = 0,
        batch_size: int = 8,
        shuffle: bool = False,
        size_divisible: int = 32,
        rank: int = 0,
        world: int = 1,
        device: Optional[str] = None,
        dtype: Optional[str] = None,
        mean: Optional[Tuple[float, float, float]] = None,
        std: Optional[Tuple[float, float, float]] = None,
        prefetch: Optional[int] = None,
        decode: str = "auto",
    ) -> None: ...
    def __iter__(self) -> "TargetLoader": ...
    def __next__(self) -> Tuple[Any, ...]: ...
    def report(self) -> dict[str, Any]:
        """Samples delivered and skipped (id, reason), objects dropped by SanitizeBoundingBoxes,
        samples whose JPEG the GPU decoded (decoded_on_device)."""
