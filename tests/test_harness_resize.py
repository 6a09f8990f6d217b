"""smart_resize math, Episode.prepare (resize / fast path) and coordinate mapping to the screen."""

from __future__ import annotations

import io
import json
import struct

import pytest
from PIL import Image

from legato_pipelines.errors import ConfigError
from legato_pipelines.harness import Harness, smart_resize
from legato_pipelines.images import Screenshot

QWEN3VL = {"factor": 32, "max_pixels": 13_107_200}
QWEN25VL = {"factor": 28, "max_pixels": 1_003_520}


@pytest.mark.parametrize(
    "width, height, rule, expected",
    [
        # docs/osworld.md §4: 1920x1080 is sent as 1920x1088 (qwen3vl) / 1316x728 (qwen25vl).
        (1920, 1080, QWEN3VL, (1920, 1088)),
        (1920, 1080, QWEN25VL, (1316, 728)),
        # Python's round() is round-half-even: 720/32 = 22.5 -> 22.
        (1280, 720, QWEN3VL, (1280, 704)),
        (1280, 720, QWEN25VL, (1288, 728)),
        (3840, 2160, QWEN3VL, (3840, 2176)),
        (3840, 2160, QWEN25VL, (1316, 728)),
        # Under min_pixels (56*56): scaled up and ceiled.
        (40, 40, QWEN25VL, (56, 56)),
    ],
)
def test_smart_resize_known_values(width, height, rule, expected):
    h, w = smart_resize(height, width, **rule)
    assert (w, h) == expected
    assert w % rule["factor"] == 0 and h % rule["factor"] == 0


def test_smart_resize_long_side_cap():
    # Sides over 8192 scale down first: 16384x1024 -> 8192x512 -> rounded to factor 32.
    assert smart_resize(1024, 16384, **QWEN3VL) == (512, 8192)


@pytest.mark.parametrize("height, width", [(1, 100), (100, 1), (2, 1000)])
def test_smart_resize_rejects_degenerate(height, width):
    with pytest.raises(ConfigError):
        smart_resize(height, width, factor=28)


def _png(width: int, height: int, mode: str = "RGB") -> Screenshot:
    img = Image.new(mode, (width, height), "white")
    img.putpixel((0, 0), (255, 0, 0) if mode == "RGB" else (255, 0, 0, 255))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return Screenshot(buf.getvalue())


@pytest.mark.parametrize("variant, size", [("qwen3vl", (1920, 1088)), ("qwen25vl", (1316, 728))])
def test_prepare_resizes(variant, size):
    ep = Harness(variant=variant).episode("x", (1920, 1080))
    shot = _png(1920, 1080)
    out = ep.prepare(shot)
    assert out is not shot and out.size == size
    decoded = Image.open(io.BytesIO(out.png))
    assert decoded.size == size and decoded.mode == "RGB"
    # Re-encoded with zlib level 1: the first IDAT's zlib header is 78 01.
    assert b"IDAT\x78\x01" in out.png


def test_prepare_keeps_rgba():
    out = Harness().episode("x", (1920, 1080)).prepare(_png(1920, 1080, "RGBA"))
    assert Image.open(io.BytesIO(out.png)).mode == "RGBA"


@pytest.mark.parametrize("variant, size", [("qwen3vl", (1920, 1088)), ("qwen25vl", (1316, 728))])
def test_prepare_fast_path_does_not_decode(variant, size):
    # Only a PNG signature and IHDR: decoding would fail, so the same object proves no decode.
    header = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + struct.pack(">II", *size)
    shot = Screenshot(header)
    assert Harness(variant=variant).episode("x", (1920, 1080)).prepare(shot) is shot


def _click(x, y) -> str:
    args = {"action": "left_click", "coordinate": [x, y]}
    return (
        "Action: c\n<tool_call>\n"
        + json.dumps({"name": "computer_use", "arguments": args})
        + "\n</tool_call>"
    )


@pytest.mark.parametrize(
    "screen, model, expected",
    [
        # OSWorld's scale x * (W / 999), rounded to the nearest pixel (OSWorld truncates).
        ((1920, 1080), (0, 0), (0, 0)),
        ((1920, 1080), (500, 500), (961, 541)),
        ((1920, 1080), (100, 900), (192, 973)),
        ((1280, 720), (250, 750), (320, 541)),
        ((1920, 1080), (999, 999), (1919, 1079)),
    ],
)
def test_qwen3vl_relative_mapping(screen, model, expected):
    ep = Harness(variant="qwen3vl").episode("x", screen)
    (action,) = ep.parse(_click(*model), "stop").actions
    assert (action.x, action.y) == expected
    assert action.arguments["coordinate"] == list(model)  # model coordinates kept as given
    assert action.to_record()["screen"] == list(expected)


def test_qwen25vl_absolute_mapping_uses_the_requested_image_size():
    ep = Harness(variant="qwen25vl").episode("x", (1920, 1080))
    shot = ep.prepare(_png(1920, 1080))
    ep.request(shot)
    (action,) = ep.parse(_click(658, 364), "stop").actions
    assert (action.x, action.y) == (960, 540)  # int(658 * 1920/1316), int(364 * 1080/728)
    (corner,) = ep.parse(_click(1315, 727), "stop").actions
    assert (corner.x, corner.y) == (1919, 1079)  # 1918.54, 1078.52
    off = ep.parse(_click(-20, 800), "stop")
    assert off.actions == [] and "outside the model's image (x 0..1315, y 0..727)" in (
        off.parse_error or ""
    )


def test_qwen25vl_absolute_click_rounds_to_the_nearest_pixel():
    # 1522x1022 screen -> 1512x1008 image; (756, 504) is (761, 511) on the screen:
    # 756 * (1522 / 1512) computes as 760.9999..., which truncation would make 760.
    from legato_pipelines.harness.parse import CoordinateMap, parse_response

    coords = CoordinateMap.absolute((1522, 1022), (1512, 1008))
    assert 756 * (1522 / 1512) < 761
    (action,) = parse_response(_click(756, 504), "stop", variant="qwen25vl", coords=coords).actions
    assert (action.x, action.y) == (761, 511)
    assert action.to_record()["screen"] == [761, 511]
    # relative coordinates round too: 500 * 1522 / 999 = 761.76 -> 762 (truncated: 761)
    assert CoordinateMap.relative((1522, 1022)).map(500, 500) == (762, 512)
