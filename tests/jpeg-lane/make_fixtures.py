"""Makes the small JPEG fixtures that nvjpeg_probe embeds (run from the crate root).

Needs Pillow, numpy and libjpeg-turbo's cjpeg (Debian: libjpeg-turbo-progs). Every file is a few
KiB; the probe decodes the supported ones on the GPU and compares them with the `image` crate, and
checks that the others are refused before they reach the hardware decoder.
"""
import io
import os
import subprocess
import tempfile

import numpy as np
from PIL import Image

OUT = os.path.dirname(os.path.abspath(__file__))


def picture(w, h, seed=0):
    """Gradients, hard colour edges and a little noise: chroma upsampling and IDCT both show."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 255 * x / max(w - 1, 1)
    g = 255 * y / max(h - 1, 1)
    b = 128 + 100 * np.sin(x / 5.0) * np.cos(y / 7.0)
    img = np.stack([r, g, b], axis=-1)
    # a saturated red square and a blue disc: sharp chroma edges
    img[h // 4 : h // 2, w // 4 : w // 2] = (230, 20, 20)
    disc = (x - 0.7 * w) ** 2 + (y - 0.6 * h) ** 2 < (0.15 * min(w, h)) ** 2
    img[disc] = (20, 40, 220)
    img += rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def cjpeg(pixels, name, *args, gray=False):
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "in.pgm" if gray else "in.ppm")
        im = Image.fromarray(pixels)
        if gray:
            im = im.convert("L")
        im.save(src)
        data = subprocess.run(["cjpeg", "-quality", "90", *args, src], check=True,
                              capture_output=True).stdout
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    return data


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    base = picture(96, 64)
    odd = picture(37, 23, seed=1)
    # Supported by the hardware decoder (baseline, one interleaved scan, 1 or 3 components).
    cjpeg(base, "ok_444.jpg", "-sample", "1x1")
    cjpeg(base, "ok_422.jpg", "-sample", "2x1")
    good = cjpeg(base, "ok_420.jpg", "-sample", "2x2")
    cjpeg(base, "ok_440.jpg", "-sample", "1x2")
    cjpeg(base, "ok_gray.jpg", gray=True)
    cjpeg(odd, "ok_420_odd_37x23.jpg", "-sample", "2x2")
    cjpeg(odd, "ok_gray_odd_37x23.jpg", gray=True)
    cjpeg(picture(1, 1, seed=2), "ok_420_1x1.jpg", "-sample", "2x2")
    cjpeg(base, "ok_420_restart.jpg", "-sample", "2x2", "-restart", "1")
    cjpeg(base, "ok_420_optimized.jpg", "-sample", "2x2", "-optimize")
    # Not for the hardware decoder.
    cjpeg(base, "bad_progressive.jpg", "-sample", "2x2", "-progressive")
    cjpeg(base, "bad_arithmetic.jpg", "-sample", "2x2", "-arithmetic")
    cjpeg(base, "bad_411.jpg", "-sample", "4x1")
    cjpeg(base, "bad_rgb_colorspace.jpg", "-rgb")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as script:
        script.write("0;\n1;\n2;\n")  # three sequential scans, one component each
    try:
        cjpeg(base, "bad_multiscan.jpg", "-sample", "1x1", "-scans", script.name)
    finally:
        os.unlink(script.name)
    buf = io.BytesIO()
    Image.fromarray(base).convert("CMYK").save(buf, "JPEG", quality=90)
    write("bad_cmyk.jpg", buf.getvalue())
    write("bad_truncated.jpg", good[: len(good) * 6 // 10])
    write("bad_truncated_header.jpg", good[:120])
    # Synthetic headers: a good file with its SOF marker or precision changed. Only the header is
    # meant to be read: these must be refused before any decoder sees the entropy-coded data.
    sof = good.index(b"\xff\xc0")
    twelve = bytearray(good)
    twelve[sof + 1] = 0xC1
    twelve[sof + 4] = 12
    write("bad_12bit_header.jpg", bytes(twelve))
    lossless = bytearray(good)
    lossless[sof + 1] = 0xC3
    write("bad_lossless_header.jpg", bytes(lossless))
    png = io.BytesIO()
    Image.fromarray(base).save(png, "PNG")
    write("bad_not_jpeg.png", png.getvalue())


if __name__ == "__main__":
    main()
