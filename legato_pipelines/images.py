"""Screenshots as PNG bytes with their content hash and data URL computed at most once.

The run directory stores each image once by SHA-256 (``images/<sha>.png``) and messages refer
to it as ``legato-image://<sha>``; the policy client splices the data URL in when it sends a
request. Both derived values are cached on the object, so an image that stays in the prompt
for 20 steps is hashed and base64-encoded once, not once per request.

:func:`resized_png` is the one resize of a screenshot to the model's size, wherever it runs:
the collector (``harness/resize.py``), the fake backend, the local desktop server and the
OSWorld worker, so what the model sees is the same pixels and bytes whichever side made it.
This module imports only the standard library (Pillow, numpy and imagecodecs inside the
functions that need them): the OSWorld worker, which runs under another interpreter, loads it
by its path.
"""

from __future__ import annotations

import base64
import hashlib
import io
import struct

IMAGE_REF_PREFIX = "legato-image://"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class Screenshot:
    """A PNG screenshot: ``png`` bytes, ``width`` x ``height`` in pixels.

    ``sha`` (hex SHA-256 of the PNG bytes), ``ref`` (``legato-image://<sha>``) and
    ``data_url`` (``data:image/png;base64,...`` as bytes) are computed lazily, once.

    Raises ``ValueError`` when ``png`` is not a PNG.
    """

    __slots__ = ("png", "width", "height", "_sha", "_data_url")

    def __init__(self, png: bytes, width: int | None = None, height: int | None = None):
        if width is None or height is None:
            width, height = png_size(png)
        self.png = png
        self.width = width
        self.height = height
        self._sha: str | None = None
        self._data_url: bytes | None = None

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return (self.width, self.height)

    @property
    def sha(self) -> str:
        if self._sha is None:
            self._sha = hashlib.sha256(self.png).hexdigest()
        return self._sha

    @property
    def ref(self) -> str:
        return IMAGE_REF_PREFIX + self.sha

    @property
    def data_url(self) -> bytes:
        if self._data_url is None:
            self._data_url = b"data:image/png;base64," + base64.b64encode(self.png)
        return self._data_url

    def to_pil(self):
        """Decode into a ``PIL.Image.Image`` (RGB or RGBA)."""
        from PIL import Image

        return Image.open(io.BytesIO(self.png))

    @classmethod
    def from_pil(cls, image, *, compress_level: int = 1) -> Screenshot:
        """Encode a PIL image as PNG (:func:`encode_png`; ``compress_level`` 0-9, zlib's)."""
        return cls(encode_png(image, compress_level=compress_level), image.width, image.height)

    def complete(self) -> bool:
        """Whether the PNG ends with its ``IEND`` chunk (cheap: no decoding). Half a PNG (a
        connection dropped mid-transfer) does not; the engine checks the screenshots it does not
        decode itself."""
        return png_complete(self.png)

    def __repr__(self) -> str:
        return f"Screenshot({self.width}x{self.height}, {len(self.png)} bytes)"


#: Image modes :func:`encode_png` hands to libpng (every screenshot is RGB or RGBA).
_LIBPNG_MODES = frozenset({"RGB", "RGBA", "L"})
#: ``image.info`` keys Pillow's encoder writes as chunks (tRNS, iCCP): such an image keeps it.
_PNG_INFO_KEPT = frozenset({"transparency", "icc_profile"})


def encode_png(image, *, compress_level: int = 1) -> bytes:
    """A PIL image as PNG bytes at zlib ``compress_level`` (0-9): the same pixels whatever
    the level.

    RGB, RGBA and L images (every screenshot) are encoded by libpng through imagecodecs, with
    the ``Up`` filter on every row. Pillow's own encoder tries four filters on each row and
    keeps the best: at 1280x704 that costs ~20 ms of CPU where libpng with ``Up`` costs ~7 ms,
    for the same size within a few percent on screenshots (their rows repeat; BENCHMARKS.md,
    issue 18 part 8). Other modes, and images whose ``info`` holds a transparent colour or an
    ICC profile (chunks Pillow writes), go through Pillow's encoder. Raises ``ImportError`` when
    imagecodecs is not installed (a project dependency; the OSWorld worker, which may lack
    it, checks :func:`png_codecs` before it encodes).
    """
    if image.mode in _LIBPNG_MODES and not _PNG_INFO_KEPT.intersection(image.info):
        import numpy as np
        from imagecodecs import PNG, png_encode

        return bytes(png_encode(np.asarray(image), level=compress_level, filter=PNG.FILTER.UP))
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


def png_codecs() -> str:
    """What makes :func:`resized_png`'s bytes here: Pillow's version (the resize) and
    imagecodecs' with the libpng and zlib it runs (the PNG encoder), e.g. ``"Pillow 13.0.0,
    imagecodecs 2026.3.6 (libpng 1.6.55, zlib 1.2.13)"``; a missing one is named ``none``.
    Two interpreters with the same string make the same bytes from the same pixels (the
    OSWorld worker resizes only when its string is the collector's)."""
    try:
        import PIL

        pillow = PIL.__version__
    except ImportError:
        pillow = "none"
    try:
        import imagecodecs

        codecs = (
            f"{imagecodecs.__version__} ({imagecodecs.png_version()}, {imagecodecs.zlib_version()})"
        )
    except ImportError:
        codecs = "none"
    return f"Pillow {pillow}, imagecodecs {codecs}"


def resized_png(image, size: tuple[int, int]) -> bytes:
    """``image`` (a PIL image) resized to ``size`` = (width, height), as PNG bytes.

    The resize OSWorld's Qwen agents do before sending a screenshot: ``Image.resize`` with
    Pillow's default filter (bicubic for RGB/RGBA; nearest for modes "1"/"P"), then a PNG,
    here at zlib level 1 (:func:`encode_png`: the same pixels as any level). An image already
    of that size is only encoded. Every side that resizes a screenshot for the model calls
    this (module docs), so the same pixels in give the same bytes out where
    :func:`png_codecs` is the same.
    """
    width, height = size
    if image.size != (width, height):
        # No explicit filter: Pillow's default, as OSWorld.
        image = image.resize((width, height))
    return encode_png(image)


_PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC-32: the last 8 bytes of a PNG


def png_complete(png: bytes) -> bool:
    """Whether ``png`` ends with a PNG's ``IEND`` chunk (trailing bytes after it are allowed
    up to 64): a cheap test for half a PNG, without decoding."""
    return png.rfind(_PNG_END, max(0, len(png) - 72)) != -1


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) read from a PNG's IHDR chunk without decoding it.

    Raises ``ValueError`` when the bytes are not a PNG.
    """
    if len(png) < 24 or not png.startswith(_PNG_SIGNATURE) or png[12:16] != b"IHDR":
        raise ValueError("not a PNG image (bad signature or missing IHDR chunk)")
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)
