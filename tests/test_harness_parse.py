"""Response parsing: every case of qwen_responses.jsonl and harness_extra.jsonl.

Case format (one JSON object per line): ``id``, ``response`` (str or null), ``finish_reason``,
optional ``variant`` (default qwen3vl), ``screen`` ([W, H], default 1920x1080),
``osworld_exact``; ``expect`` holds ``actions`` (the tool calls' arguments as given),
``action_text``, ``parse_error`` (bool) and optionally ``error`` (a substring of the reason),
``terminal``, ``screen`` (mapped [x, y] or null per action), ``keys`` (normalized per key
action) and ``history_text``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from legato_pipelines.actions import Action
from legato_pipelines.harness import Harness, ParsedResponse
from legato_pipelines.images import Screenshot

DATA = Path(__file__).parent / "data"


def _cases(name: str) -> list:
    with open(DATA / name, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    return [pytest.param(c, id=c["id"]) for c in cases]


SHARED = _cases("qwen_responses.jsonl")
EXTRA = _cases("harness_extra.jsonl")


def _fake_png(width: int, height: int) -> bytes:
    # A PNG header only: enough for Screenshot's size, never decoded by request().
    import struct

    return b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)


def _parse(case: dict) -> ParsedResponse:
    variant = case.get("variant", "qwen3vl")
    harness = Harness(variant=variant, osworld_exact=case.get("osworld_exact", False))
    screen = tuple(case.get("screen", (1920, 1080)))
    ep = harness.episode("Do the task.", screen)
    # The model answers about the prepared screenshot; its size is qwen25vl's coordinate space.
    w, h = harness.resize_rule.size(*screen)
    ep.request(Screenshot(_fake_png(w, h)))
    return ep.parse(case["response"], case["finish_reason"])


def _check(case: dict) -> None:
    parsed = _parse(case)
    expect = case["expect"]
    assert [a.arguments for a in parsed.actions] == expect["actions"]
    assert [a.action for a in parsed.actions] == [a["action"] for a in expect["actions"]]
    assert parsed.action_text == expect["action_text"]
    assert (parsed.parse_error is not None) == expect["parse_error"], parsed.parse_error
    if expect["parse_error"]:
        assert parsed.actions == [] and parsed.terminal is None
        assert parsed.parse_error  # a reason, not an empty string
    if "error" in expect:
        assert expect["error"] in parsed.parse_error
    if "terminal" in expect:
        assert parsed.terminal == expect["terminal"]
    if "screen" in expect:
        got = [None if a.x is None else [a.x, a.y] for a in parsed.actions]
        assert got == expect["screen"]
    if "keys" in expect:
        assert [list(a.keys) for a in parsed.actions if a.action == "key"] == expect["keys"]
    if "history_text" in expect:
        assert parsed.history_text == expect["history_text"]
    for action in parsed.actions:
        assert isinstance(action, Action)
        json.dumps(action.to_record())  # the record form is JSON-able


@pytest.mark.parametrize("case", SHARED)
def test_shared_case(case):
    _check(case)


@pytest.mark.parametrize("case", EXTRA)
def test_extra_case(case):
    _check(case)


def test_shared_cases_all_present():
    assert len(SHARED) == 22


def _one(response: str, finish_reason: str = "stop", **harness) -> ParsedResponse:
    ep = Harness(**harness).episode("Do the task.", (1920, 1080))
    return ep.parse(response, finish_reason)


def _call(args: dict) -> str:
    return (
        "<tool_call>\n" + json.dumps({"name": "computer_use", "arguments": args}) + "\n</tool_call>"
    )


def test_terminal_statuses():
    fail = _call({"action": "terminate", "status": "failure"})
    assert _one("Action: x\n" + fail).terminal == "fail"
    assert _one("Action: x\n" + fail, osworld_exact=True).terminal == "done"
    assert (
        _one("Action: x\n" + _call({"action": "terminate", "status": "success"})).terminal == "done"
    )
    assert _one("Action: x\n" + _call({"action": "left_click"})).terminal is None


def test_structured_fields():
    p = _one(
        "Action: a\n"
        + _call({"action": "type", "text": "a\nb"})
        + _call({"action": "scroll", "pixels": "-3"})
        + _call({"action": "wait", "time": 2.5})
        + _call({"action": "terminate", "status": "FAILURE"})
    )
    typed, scroll, wait, term = p.actions
    assert typed.text == "a\nb"
    assert scroll.pixels == -3 and scroll.x is None
    assert wait.seconds == 2.5
    assert term.status == "failure" and p.terminal == "fail"


def test_qwen3vl_history_text_follows_osworld_split():
    # OSWorld's Qwen3-VL agent keeps line.split("Action:")[-1]; action_text strips the prefix.
    p = _one("ACTION: Click. Action: then type\n" + _call({"action": "left_click"}))
    assert p.action_text == "Click. Action: then type"
    assert p.history_text == "then type"


def test_qwen25vl_history_text_is_the_whole_line():
    ep = Harness(variant="qwen25vl").episode("t", (1920, 1080))
    p = ep.parse("I will click the button.\n" + _call({"action": "left_click"}), "stop")
    assert p.action_text is None
    assert p.history_text == "I will click the button."


@pytest.mark.parametrize(
    "content",
    [
        "{",
        "<tool_call>",
        "<tool_call>\n</tool_call>",
        "<tool_call>\nnull\n</tool_call>",
        "<tool_call>\n[1, 2]\n</tool_call>",
        '<tool_call>\n{"name": "computer_use", "arguments": 5}\n</tool_call>',
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": ["x"]}}\n</tool_call>',
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "key", "keys": [null]}}\n</tool_call>',
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "type", "text": {"a": 1}}}\n</tool_call>',
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [NaN, 1]}}\n</tool_call>',
        '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1e999, 1]}}\n</tool_call>',
        '{"name": "computer_use", "arguments": {"action": "left_click"',
        "</think>",
        "\x00\ud800",
    ],
)
def test_garbage_never_raises(content):
    p = _one(content)
    assert p.parse_error and p.actions == [] and p.terminal is None


def test_bare_json_line_and_block_keep_order():
    bare = json.dumps({"name": "computer_use", "arguments": {"action": "key", "keys": ["tab"]}})
    p = _one(
        "Action: Tab then click.\n"
        + bare
        + "\n"
        + _call({"action": "left_click", "coordinate": [0, 0]})
    )
    assert [a.action for a in p.actions] == ["key", "left_click"]


def test_reasons_quote_model_text_briefly():
    p = _one("Action: x\n" + _call({"action": "zap" * 5000}))
    assert p.parse_error.startswith("tool call 1: unknown action 'zapzap")
    assert len(p.parse_error) < 200
