#!/usr/bin/env python3
"""Request images to Qwen2-VL's vision tower, end to end, through gpufeed.PatchServer.

Builds transformers' Qwen2-VL vision tower (`Qwen2VisionTransformerPretrainedModel`) from a
small configuration with random weights (nothing is downloaded), serves a request of photos with
`gpufeed.PatchServer("qwen2-vl")`, hands the tokens and `image_grid_thw` to the tower through
DLPack (no copy), and checks that the tower's output equals its output on transformers' own
processor (`Qwen2VLImageProcessorPil`) for the same photos, bit for bit. Where the tower takes
precomputed `cu_seqlens` and `position_ids` (transformers 5's `vision_utils`), gpufeed's
`served.cu_seqlens` and `served.coordinates` are handed over too.

    python3 python/examples/serve_qwen2vl.py --device cuda:0   # or --device cpu

Needs torch and transformers (`pip install torch transformers`); without them it says so and
exits with status 77.
"""

import argparse
import pathlib
import sys
import time

import gpufeed

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHOTOS = [ROOT / "assets" / name for name in ("rocket.jpg", "chelsea.png", "coffee.png")]
MAX_PIXELS = 28 * 28 * 64


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    parser.add_argument("--photos", nargs="*", type=pathlib.Path, default=PHOTOS)
    args = parser.parse_args()
    try:
        import torch
        import transformers
        from PIL import Image
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import (
            Qwen2VisionTransformerPretrainedModel,
        )
    except ImportError as e:
        print(f"skipped: {e.name or e} is not installed (pip install torch transformers)")
        sys.exit(77)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("skipped: no CUDA device (run with --device cpu)")
        sys.exit(77)
    device = torch.device(args.device)

    # A small tower with random weights: the layout of its input is the full-size model's.
    config = Qwen2VLVisionConfig(depth=2, embed_dim=64, num_heads=4, hidden_size=128)
    torch.manual_seed(0)
    tower = Qwen2VisionTransformerPretrainedModel._from_config(config).to(device).eval()

    # The server is built once; each request is one serve() call.
    server = gpufeed.PatchServer(
        "qwen2-vl", device=args.device, dtype="float32", max_pixels=MAX_PIXELS, max_images=8
    )
    request = [p.read_bytes() for p in args.photos]
    start = time.perf_counter()
    served = server.serve(request)
    tokens = torch.from_dlpack(served.tokens)  # [rows, 1176], on the device, no copy
    grids = torch.from_dlpack(served.grids)  # image_grid_thw, [images, 3]
    if device.type == "cuda":
        torch.cuda.current_stream().synchronize()
    served_ms = (time.perf_counter() - start) * 1e3

    processor_cls = getattr(transformers, "Qwen2VLImageProcessorPil", None)
    processor = (processor_cls or transformers.Qwen2VLImageProcessor)(
        max_pixels=MAX_PIXELS, do_convert_rgb=True
    )
    start = time.perf_counter()
    reference = processor(images=[Image.open(p) for p in args.photos], return_tensors="pt")
    processor_ms = (time.perf_counter() - start) * 1e3
    want_tokens = reference["pixel_values"].to(device)
    want_grids = reference["image_grid_thw"].to(device)

    def merged(output):
        """The tower's merged output, whichever form this transformers returns it in."""
        pooled = getattr(output, "pooler_output", None)
        return output if pooled is None else pooled

    with torch.no_grad():
        got = merged(tower(tokens, grid_thw=grids))
        want = merged(tower(want_tokens, grid_thw=want_grids))
        # Releases whose vision towers take precomputed `cu_seqlens` and `position_ids`
        # (transformers.vision_utils) can have gpufeed's too: nothing recomputed in Python.
        try:
            given = merged(
                tower(
                    tokens,
                    grid_thw=grids,
                    cu_seqlens=torch.from_dlpack(served.cu_seqlens),
                    position_ids=torch.from_dlpack(served.coordinates),
                )
            )
        except TypeError:
            given = None

    same_tokens = torch.equal(tokens, want_tokens) and torch.equal(grids, want_grids)
    same_output = torch.equal(got, want) and (given is None or torch.equal(given, want))
    print(
        f"{len(request)} images -> {tokens.shape[0]} tokens of {tokens.shape[1]} "
        f"(grids {grids.tolist()}) on {tokens.device}: served in {served_ms:.1f} ms, "
        f"transformers' processor {processor_ms:.1f} ms"
    )
    print(f"vision tower output {tuple(got.shape)}")
    if not (same_tokens and same_output):
        print(f"DIFFERENT: tokens equal {same_tokens}, tower output equal {same_output}")
        sys.exit(1)
    side = "" if given is None else " (also with gpufeed's cu_seqlens and position ids)"
    print(f"tokens, grids and the tower's output{side} equal transformers' bit for bit")


if __name__ == "__main__":
    main()
