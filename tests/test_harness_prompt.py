"""Prompt text, message layout and history policies (append-only growth, window, hysteresis)."""

from __future__ import annotations

import io
import json
import re

import orjson
import pytest
from PIL import Image

from legato_pipelines.errors import ConfigError
from legato_pipelines.harness import Harness, HistoryPolicy, HysteresisPolicy, WindowPolicy
from legato_pipelines.images import Screenshot

INSTRUCTION = 'Open "report.odt" and save it as PDF.'
ACTION_RE = re.compile(r"^Action: (.*)$", re.M)


def _shot(i: int, size=(1920, 1088)) -> Screenshot:
    """A distinct small-but-valid PNG per step (1920x1088 fits qwen3vl: no resize)."""
    img = Image.new("RGB", size, (i * 7 % 256, i * 13 % 256, i * 29 % 256))
    buf = io.BytesIO()
    img.save(buf, format="PNG", compress_level=1)
    return Screenshot(buf.getvalue())


SHOTS = [_shot(i) for i in range(16)]


def _response(i: int) -> str:
    args = {"action": "left_click", "coordinate": [10 * i, 20 * i]}
    call = json.dumps({"name": "computer_use", "arguments": args})
    return f"Action: Click target number {i}.\n<tool_call>\n{call}\n</tool_call>"


def _run(harness: Harness, steps: int) -> list[list[dict]]:
    """Drive an episode for ``steps`` policy steps; return every request's message list."""
    ep = harness.episode(INSTRUCTION, (1920, 1080))
    requests = []
    for i in range(1, steps + 1):
        shot = ep.prepare(SHOTS[i])
        messages = ep.request(shot)
        requests.append(messages)
        assert set(ep.images) == _shas(messages)
        content = _response(i)
        ep.record(content, ep.parse(content, "stop"))
    return requests


def _shas(messages: list[dict]) -> set[str]:
    return {
        part["image_url"]["url"].removeprefix("legato-image://")
        for m in messages
        for part in m["content"]
        if part["type"] == "image_url"
    }


def _images(messages: list[dict]) -> int:
    return sum(p["type"] == "image_url" for m in messages for p in m["content"])


def _extends(prev: list[dict], cur: list[dict]) -> bool:
    """``cur`` starts with ``prev``: same objects and the same serialized bytes."""
    if len(cur) <= len(prev) or any(a is not b for a, b in zip(prev, cur, strict=False)):
        return False
    before = orjson.dumps(prev)
    after = orjson.dumps(cur)
    return after.startswith(before[:-1] + b",")  # "[...m_k" then ",m_k+1..."


@pytest.mark.parametrize("history", ["window", "hysteresis"])
@pytest.mark.parametrize("variant", ["qwen3vl", "qwen25vl"])
def test_prompt_grows_append_only_for_15_steps(variant, history):
    requests = _run(Harness(variant=variant, history=history, image_max=20), 15)
    for step, (prev, cur) in enumerate(zip(requests, requests[1:], strict=False), start=2):
        assert _extends(prev, cur), f"step {step} does not extend step {step - 1}"
        assert len(cur) == len(prev) + 2  # the previous assistant turn + the new screenshot
    assert [_images(r) for r in requests] == list(range(1, 16))
    last = requests[-1]
    assert [m["role"] for m in last] == ["system"] + ["user", "assistant"] * 14 + ["user"]
    # The assistant turns replay the raw responses.
    assert [m["content"][0]["text"] for m in last if m["role"] == "assistant"] == [
        _response(i) for i in range(1, 15)
    ]


def test_requests_never_carry_data_urls():
    requests = _run(Harness(image_max=20), 3)
    blob = orjson.dumps(requests[-1])
    assert b"data:image" not in blob
    assert blob.count(b"legato-image://") == 3


def test_first_user_message_layout():
    requests = _run(Harness(), 2)
    first = requests[0][1]
    assert first["role"] == "user"
    assert first["content"][0] == {
        "type": "image_url",
        "image_url": {"url": SHOTS[1].ref},
    }
    assert first["content"][1] == {
        "type": "text",
        "text": "\nPlease generate the next move according to the UI screenshot, instruction "
        "and previous actions.\n\nInstruction: " + INSTRUCTION + "\n\nPrevious actions:\nNone",
    }
    # Later screenshots come alone; the instruction appears once.
    assert requests[1][3]["content"] == [{"type": "image_url", "image_url": {"url": SHOTS[2].ref}}]
    assert orjson.dumps(requests[1]).count(b"Instruction:") == 1


def _first_user_text(messages: list[dict]) -> str:
    return messages[1]["content"][1]["text"]


def test_window_drops_the_oldest_screenshot_each_step():
    requests = _run(Harness(history="window", image_max=4), 15)
    assert [_images(r) for r in requests] == [1, 2, 3, 4] + [4] * 11
    for step, messages in enumerate(requests, start=1):
        kept = list(range(max(1, step - 3), step + 1))
        refs = [p["image_url"]["url"] for m in messages for p in m["content"] if "image_url" in p]
        assert refs == [SHOTS[i].ref for i in kept]
        dropped = range(1, kept[0])
        text = _first_user_text(messages)
        expected = "\n".join(f"Step {i}: Click target number {i}." for i in dropped) or "None"
        assert text.endswith("Previous actions:\n" + expected)
        assert text.count("Step ") == len(dropped)
    changes = [
        step
        for step, (prev, cur) in enumerate(zip(requests, requests[1:], strict=False), start=2)
        if not _extends(prev, cur)
    ]
    assert changes == list(range(5, 16))


def test_hysteresis_drops_to_low_water_and_changes_prefix_less_often():
    requests = _run(Harness(history="hysteresis", image_max=4), 15)
    assert [_images(r) for r in requests] == [1, 2, 3, 4, 2, 3, 4, 2, 3, 4, 2, 3, 4, 2, 3]
    changes = [
        step
        for step, (prev, cur) in enumerate(zip(requests, requests[1:], strict=False), start=2)
        if not _extends(prev, cur)
    ]
    assert changes == [5, 8, 11, 14]
    window = _run(Harness(history="window", image_max=4), 15)
    window_changes = sum(not _extends(p, c) for p, c in zip(window, window[1:], strict=False))
    assert len(changes) < window_changes
    # After the drop at step 5 the prompt holds steps 4 and 5; steps 1-3 became text.
    assert _first_user_text(requests[4]).endswith(
        "Previous actions:\nStep 1: Click target number 1.\n"
        "Step 2: Click target number 2.\nStep 3: Click target number 3."
    )
    # Between drops the kept messages are the very same objects (engine hashes by identity).
    assert requests[5][2] is requests[4][2]


def test_hysteresis_custom_low_water():
    requests = _run(Harness(history="hysteresis", image_max=5, low_water=1), 8)
    assert [_images(r) for r in requests] == [1, 2, 3, 4, 5, 1, 2, 3]
    # With one image left, the current screenshot's message carries the instruction.
    only = requests[5]
    assert [m["role"] for m in only] == ["system", "user"]
    assert only[1]["content"][0]["image_url"]["url"] == SHOTS[6].ref
    assert "Step 5: Click target number 5." in only[1]["content"][1]["text"]


def test_system_message_is_shared_across_episodes():
    harness = Harness()
    a = _run(harness, 1)[0][0]
    b = _run(harness, 1)[0][0]
    assert a is b and a["role"] == "system"


def test_qwen3vl_system_prompt():
    text = Harness(variant="qwen3vl").system_message["content"][0]["text"]
    assert text.startswith("# Tools\n\nYou may call one or more functions")
    tools = json.loads(text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0])
    fn = tools["function"]
    assert fn["name"] == "computer_use"
    assert fn["parameters"]["properties"]["action"]["enum"] == [
        "key", "type", "mouse_move", "left_click", "left_click_drag", "right_click",
        "middle_click", "double_click", "scroll", "wait", "terminate",
    ]  # fmt: skip
    assert "* The screen's resolution is 1000x1000." in fn["description"]
    assert "\n# Response format\n" in text
    assert text.endswith("- If finishing, use action=terminate in the tool call.")
    # json.dumps defaults (", " and ": " separators, ASCII) as in OSWorld.
    assert '{"type": "function", "function": {"name_for_human": "computer_use"' in text


def test_qwen25vl_system_prompt():
    text = Harness(variant="qwen25vl").system_message["content"][0]["text"]
    assert text.startswith("You are a helpful assistant\n\n# Tools\n")
    assert "Response format" not in text and "1000x1000" not in text
    assert text.endswith('{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def test_request_twice_before_record_and_record_without_request():
    ep = Harness().episode(INSTRUCTION, (1920, 1080))
    first = ep.request(SHOTS[1])
    assert ep.request(SHOTS[1]) == first
    replaced = ep.request(SHOTS[2])  # a new screenshot replaces the pending one
    assert _shas(replaced) == {SHOTS[2].sha} and set(ep.images) == {SHOTS[2].sha}
    ep.record(None, None)  # a missing content is replayed as ""
    assert ep.request(SHOTS[3])[-2] == {
        "role": "assistant",
        "content": [{"type": "text", "text": ""}],
    }
    ep.record("x", None)
    with pytest.raises(RuntimeError, match="request"):
        ep.record("y", None)


def test_pluggable_policy_object():
    class KeepTwo:
        image_max = 2

        def keep(self, images: int) -> int:
            return min(images, 2)

    assert isinstance(KeepTwo(), HistoryPolicy)
    requests = _run(Harness(history=KeepTwo()), 4)
    assert [_images(r) for r in requests] == [1, 2, 2, 2]


def test_policies():
    assert [WindowPolicy(3).keep(n) for n in range(1, 6)] == [1, 2, 3, 3, 3]
    assert [HysteresisPolicy(4).keep(n) for n in range(1, 7)] == [1, 2, 3, 4, 2, 2]
    assert HysteresisPolicy(1).low_water == 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"variant": "qwen2vl"}, "variant"),
        ({"history": "lru"}, "history"),
        ({"history": 3}, "history"),
        ({"image_max": 0}, "image_max"),
        ({"image_max": "20"}, "image_max"),
        ({"history": "window", "low_water": 2}, "low_water"),
        ({"history": "hysteresis", "image_max": 4, "low_water": 5}, "low_water"),
        ({"history": "hysteresis", "low_water": 0}, "low_water"),
        ({"osworld_exact": "yes"}, "osworld_exact"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        Harness(**kwargs)


@pytest.mark.parametrize("size", [(0, 1080), (1920,), "1920x1080", (1920.0, 1080)])
def test_bad_screen_size(size):
    with pytest.raises(ConfigError, match="screen_size"):
        Harness().episode("x", size)


def test_broken_policy_is_reported():
    class Bad:
        image_max = 1

        def keep(self, images: int) -> int:
            return 0

    ep = Harness(history=Bad()).episode("x", (1920, 1080))
    with pytest.raises(ConfigError, match="keep=0"):
        ep.request(SHOTS[1])
