"""How actions become marks on a screenshot (issue 17): clicks, drags, scrolls at their screen
coordinates, typed text and keys as labels; the screen size behind a resized screenshot."""

from __future__ import annotations

from legato_pipelines.view.marks import marks_for, screen_size


def test_marks_for_every_kind_of_action():
    marks = marks_for(
        [
            {"action": "left_click", "arguments": {}, "screen": [640, 360]},
            {"action": "double_click", "arguments": {}, "screen": [10, 20], "clamped": True},
            {"action": "mouse_move", "arguments": {}, "screen": [100, 100]},
            {"action": "left_click_drag", "arguments": {}, "screen": [300, 200]},
            {"action": "scroll", "arguments": {}, "screen": [50, 60], "pixels": -5},
            {"action": "type", "arguments": {}, "text": "ls -la\n"},
            {"action": "key", "arguments": {}, "keys": ["ctrl", "s"]},
            {"action": "terminate", "arguments": {}, "status": "success"},
        ]
    )
    got = [(m.kind, m.label, m.x, m.y) for m in marks]
    assert got == [
        ("click", "click", 640.0, 360.0),
        ("click", "double (clamped)", 10.0, 20.0),
        ("move", "move", 100.0, 100.0),
        ("drag", "drag", 300.0, 200.0),
        ("scroll", "scroll down 5", 50.0, 60.0),
        ("label", "type: ls -la⏎", None, None),
        ("label", "key: ctrl+s", None, None),
        ("label", "terminate: success", None, None),
    ]
    assert (marks[3].x0, marks[3].y0) == (100.0, 100.0)  # the drag starts where the pointer was


def test_screen_size_behind_a_resized_screenshot():
    assert screen_size((1280, 704)) == (1280, 720)  # qwen3vl: multiples of 32
    assert screen_size((1920, 1088)) == (1920, 1080)
    assert screen_size((1316, 728), "qwen25vl") == (1920, 1080)
    assert screen_size((1280, 720)) == (1280, 720)
    assert screen_size((800, 600)) == (800, 600)  # unknown: the image itself
