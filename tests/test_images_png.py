"""images.encode_png: libpng (imagecodecs) for screenshots, Pillow's encoder for the rest;
the same pixels whatever the mode, and the chunks Pillow wrote kept."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from legato_pipelines.images import encode_png, png_codecs


def picture(mode: str) -> Image.Image:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    rgb[10:20] = rgb[10]  # repeated rows, as on screens
    return Image.fromarray(rgb).convert(mode)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "1", "I;16"])
@pytest.mark.parametrize("level", [0, 1, 6, 9])
def test_every_mode_and_level_decodes_to_the_same_pixels(mode, level):
    image = picture(mode)
    png = encode_png(image, compress_level=level)
    back = Image.open(io.BytesIO(png))
    assert back.mode == image.mode and back.size == image.size
    assert back.tobytes() == image.tobytes()


def test_screenshots_go_through_libpng_with_the_up_filter():
    """RGB: every row's filter byte is 2 (Up), which Pillow's encoder never uses on all rows
    of a noisy picture (it picks per row)."""
    import zlib

    png = encode_png(picture("RGB"))
    idat = b""
    pos = 8
    while pos < len(png):
        length = int.from_bytes(png[pos : pos + 4], "big")
        if png[pos + 4 : pos + 8] == b"IDAT":
            idat += png[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 53 * 3 + 1
    assert {raw[i] for i in range(0, len(raw), stride)} == {2}
    assert "imagecodecs" in png_codecs() and "libpng" in png_codecs()


def test_a_transparent_colour_and_an_icc_profile_are_kept():
    image = picture("RGB")
    image.info["transparency"] = (1, 2, 3)
    back = Image.open(io.BytesIO(encode_png(image)))
    assert back.info.get("transparency") == (1, 2, 3)
    image = picture("RGB")
    image.info["icc_profile"] = b"not really a profile"
    back = Image.open(io.BytesIO(encode_png(image)))
    assert back.info.get("icc_profile") == b"not really a profile"
