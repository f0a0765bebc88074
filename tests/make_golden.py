#!/usr/bin/env python3
"""Regenerate tests/fixtures/ (odd-format inputs made from assets/) and tests/golden/ (what
torchvision's CPU stage makes of them, computed with Pillow).

usage (from the repository root):  python3 tests/make_golden.py      (needs Pillow and numpy)

Golden = PIL open -> convert("RGB") -> Resize(R) (BILINEAR unless the variant says otherwise,
long side int(R * long / short)) -> CenterCrop(C) with torchvision's zero padding when the crop is
larger than the image. The two 16-bit PNGs are made as v8 * 257 from an 8-bit image; their
goldens are what Pillow makes of the files (16-bit colour cut to its high byte, which is v8;
16-bit gray clipped to 255, torchvision's behaviour and gpufeed's default). The variant
gray16-scale is gpufeed's scaled 16-bit gray conversion, whose golden is the 8-bit v8 image.
"""
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageOps, __version__ as PIL_VERSION

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(ROOT, "assets")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
GOLDEN = os.path.join(ROOT, "tests", "golden")
FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST,
           "lanczos": Image.LANCZOS}


def asset(name):
    return Image.open(os.path.join(ASSETS, name))


def pixels_only(im):
    """Drop the metadata (ICC profile, comment, XMP) that Pillow carries from an asset into
    every image derived from it and that its PNG/TIFF/GIF/JPEG writers would copy into a fixture:
    each fixture is meant to test one thing, its format."""
    im.info = {}
    return im


def small(name, width):
    im = pixels_only(asset(name).convert("RGB"))
    w, h = im.size
    return im.resize((width, max(1, round(h * width / w))), Image.LANCZOS)


def cmyk_with_black(rgb, gcr=0.7):
    """RGB -> CMYK with a real K channel (Pillow's own convert("CMYK") always makes K = 0):
    K = gcr * (1 - max(R, G, B)), C/M/Y chosen so that (1 - C)(1 - K) = R, as Pillow decodes it."""
    a = np.asarray(rgb, np.float64) / 255.0
    k = gcr * (1.0 - a.max(axis=2, keepdims=True))
    cmy = 1.0 - a / (1.0 - k)
    cmyk = np.concatenate([cmy, k], axis=2)
    data = np.clip(np.rint(cmyk * 255.0), 0, 255).astype(np.uint8)
    return Image.frombytes("CMYK", rgb.size, data.tobytes())


def write_png16(path, array16):
    """array16: HxW (gray) or HxWx3 uint16 -> 16-bit PNG written by hand (Pillow cannot)."""
    h, w = array16.shape[:2]
    colour = 0 if array16.ndim == 2 else 2
    raw = b"".join(b"\x00" + array16[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        f.write(chunk(b"IEND", b""))


def make_fixtures():
    os.makedirs(FIXTURES, exist_ok=True)
    base = {}  # fixture name -> 8-bit image its golden is computed from (16-bit cases only)
    rgb = small("rocket.jpg", 320)
    cat = small("chelsea.png", 300)
    coffee = small("coffee.png", 280)
    gray = pixels_only(asset("camera.png").convert("L")).resize((256, 256), Image.LANCZOS)
    save = lambda im, name, *a, **k: im.save(os.path.join(FIXTURES, name), *a, **k)
    save(gray.resize((240, 200)), "gray.jpg", "JPEG", quality=90)
    save(cat.convert("CMYK"), "cmyk.jpg", "JPEG", quality=90)
    save(cmyk_with_black(coffee.resize((260, 174))), "cmyk_k.jpg", "JPEG", quality=90)
    # YCCK: no encoder at hand writes it, so take the CMYK file and set its Adobe APP14 transform
    # flag to 2; decoders then read the four channels as YCCK (libjpeg converts YCCK -> CMYK).
    with open(os.path.join(FIXTURES, "cmyk_k.jpg"), "rb") as f:
        data = bytearray(f.read())
    adobe = data.find(b"Adobe")
    assert adobe > 0 and data[adobe + 11] == 0, "expected an Adobe APP14 marker, transform 0"
    data[adobe + 11] = 2
    with open(os.path.join(FIXTURES, "ycck.jpg"), "wb") as f:
        f.write(data)
    save(coffee, "progressive.jpg", "JPEG", quality=85, progressive=True)
    save(rgb, "rgb444.jpg", "JPEG", quality=92, subsampling=0)
    save(cat, "rgb420.jpg", "JPEG", quality=90, subsampling=2)
    rgba = coffee.convert("RGBA")
    alpha = np.tile(np.linspace(0, 255, rgba.size[0], dtype=np.uint8), (rgba.size[1], 1))
    rgba.putalpha(Image.fromarray(alpha))
    save(rgba, "rgba.png")
    la = gray.resize((200, 180)).convert("LA")
    la.putalpha(Image.fromarray(np.repeat(
        np.linspace(255, 16, la.size[1], dtype=np.uint8)[:, None], la.size[0], axis=1)))
    save(la, "gray_alpha.png")
    save(cat.convert("P", palette=Image.ADAPTIVE, colors=64), "palette.png")
    rgb16_src = small("hubble_deep_field.jpg", 220)
    write_png16(os.path.join(FIXTURES, "rgb16.png"), np.asarray(rgb16_src, np.uint16) * 257)
    gray16_src = gray.resize((210, 230))
    write_png16(os.path.join(FIXTURES, "gray16.png"), np.asarray(gray16_src, np.uint16) * 257)
    base["gray16.png:scaled"] = gray16_src
    save(coffee, "lossy.webp", "WEBP", quality=80)
    save(cat, "lossless.webp", "WEBP", lossless=True)
    save(rgb.resize((260, 180)), "plain.bmp", "BMP")
    save(cat.resize((230, 250)), "plain.tiff", "TIFF")
    frames = [rgb.resize((240, 160)).convert("P", palette=Image.ADAPTIVE),
              cat.resize((240, 160)).convert("P", palette=Image.ADAPTIVE)]
    frames[0].save(os.path.join(FIXTURES, "animated.gif"), save_all=True,
                   append_images=frames[1:], duration=100, loop=0)
    save(coffee.resize((250, 170)), "png_named.jpg", "PNG")
    save(rgb.resize((300, 200)), "UPPER.JPG", "JPEG", quality=88)
    save(Image.new("RGB", (1, 1), (200, 30, 90)), "one_pixel.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to display
    save(rgb.resize((320, 200)), "exif_rotate6.jpg", "JPEG", quality=90, exif=exif.tobytes())
    save(small("retina.jpg", 600).resize((4000, 10), Image.BILINEAR), "wide_4000x10.png")
    save(rgb.resize((10, 600), Image.BILINEAR), "tall_10x600.png")
    return base


def letterbox(im, size=224, pad=114):
    """Fit the whole image in size x size keeping its aspect ratio (sides rounded half up),
    centred on a canvas filled with pad (detection models' letterbox)."""
    im = im.convert("RGB")
    w, h = im.size
    scale = min(size / w, size / h)
    nw = min(size, max(1, int(w * scale + 0.5)))
    nh = min(size, max(1, int(h * scale + 0.5)))
    canvas = Image.new("RGB", (size, size), (pad, pad, pad))
    canvas.paste(im.resize((nw, nh), Image.BILINEAR), ((size - nw) // 2, (size - nh) // 2))
    return canvas


def torchvision(im, R=256, C=224, resample=Image.BILINEAR):
    im = im.convert("RGB")
    w, h = im.size
    nw, nh = (R, int(R * h / w)) if w <= h else (int(R * w / h), R)
    im = im.resize((nw, nh), resample)
    if nw < C or nh < C:  # torchvision pads with zeros, then crops the padded image
        pl, pt = ((C - nw) // 2 if C > nw else 0), ((C - nh) // 2 if C > nh else 0)
        pr, pb = ((C - nw + 1) // 2 if C > nw else 0), ((C - nh + 1) // 2 if C > nh else 0)
        canvas = Image.new("RGB", (nw + pl + pr, nh + pt + pb), (0, 0, 0))
        canvas.paste(im, (pl, pt))
        im, (nw, nh) = canvas, canvas.size
    left, top = int(round((nw - C) / 2.0)), int(round((nh - C) / 2.0))
    return im.crop((left, top, left + C, top + C))


def main():
    base = make_fixtures()
    os.makedirs(GOLDEN, exist_ok=True)
    for f in os.listdir(GOLDEN):
        os.remove(os.path.join(GOLDEN, f))
    lines = [
        f"# Pillow {PIL_VERSION}; golden = torchvision's CPU stage on PIL images: im = Image.open(input) "
        "(frame 0) .convert('RGB'); w, h = im.size; (nw, nh) = (R, int(R * h / w)) if w <= h else "
        "(int(R * w / h), R); im.resize((nw, nh), FILTER); CenterCrop(C): zero-pad to C if smaller "
        "(ltrb = (C-nw)//2, (C-nh)//2, (C-nw+1)//2, (C-nh+1)//2), left = int(round((nw - C) / 2.0)), "
        "top = int(round((nh - C) / 2.0)), crop C x C",
        "# variant default: R=256 C=224 BILINEAR; bicubic / nearest / lanczos: that FILTER; "
        "r160c128: R=160 C=128; stretch224: im.resize((224, 224), BILINEAR), no crop; "
        "letterbox224: whole image fitted in 224 x 224 (sides rounded half up), centred, pad 114; "
        "exif: ImageOps.exif_transpose first",
        "# rgb16.png / gray16.png hold v8 * 257; their goldens are Pillow's reading of the files "
        "(16-bit gray clipped to 255 on convert('RGB')); gray16-scale: the 8-bit v8 image",
        "# columns: input golden input-WxH variant",
    ]

    def add(rel, name, variant, out):
        pixels_only(out).save(os.path.join(GOLDEN, name))  # plain RGB PNG, no ICC from the input
        with Image.open(os.path.join(ROOT, rel)) as im:
            size = f"{im.size[0]}x{im.size[1]}"
        lines.append(f"{rel} {name} {size} {variant}")

    for name in sorted(os.listdir(FIXTURES)):
        src = base.get(name) or Image.open(os.path.join(FIXTURES, name))
        add(f"tests/fixtures/{name}", f"{name}.png", "default", torchvision(src))
    add("tests/fixtures/gray16.png", "gray16.png__scale.png", "gray16-scale",
        torchvision(base["gray16.png:scaled"]))
    for name in sorted(os.listdir(ASSETS)):
        if name.endswith((".png", ".jpg")):
            add(f"assets/{name}", f"assets__{name}.png", "default", torchvision(asset(name)))
    for name in ["chelsea.png", "rocket.jpg"]:
        im = asset(name)
        for variant, out in [
            ("bicubic", torchvision(im, resample=Image.BICUBIC)),
            ("nearest", torchvision(im, resample=Image.NEAREST)),
            ("lanczos", torchvision(im, resample=Image.LANCZOS)),
            ("r160c128", torchvision(im, 160, 128)),
            ("stretch224", im.convert("RGB").resize((224, 224), Image.BILINEAR)),
            ("letterbox224", letterbox(im)),
        ]:
            add(f"assets/{name}", f"assets__{name}__{variant}.png", variant, out)
    rotated = Image.open(os.path.join(FIXTURES, "exif_rotate6.jpg"))
    add("tests/fixtures/exif_rotate6.jpg", "exif_rotate6.jpg__exif.png", "exif",
        torchvision(ImageOps.exif_transpose(rotated)))
    with open(os.path.join(GOLDEN, "MANIFEST.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{sum(not l.startswith('#') for l in lines)} goldens, {len(os.listdir(FIXTURES))} fixtures")


if __name__ == "__main__":
    main()
