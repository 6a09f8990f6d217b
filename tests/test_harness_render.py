"""Rendering round-trip: the pyautogui code of every structured action, read back with ``ast``.

The code is parsed, never executed: each statement must be a call of one expected
``pyautogui`` function with literal arguments equal to the action's fields.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from legato_pipelines.actions import Action
from legato_pipelines.harness import Harness, render_pyautogui

DATA = Path(__file__).parent / "data"
INJECTION = "'); import os; os.system('touch /tmp/pwned'); ('"


def _calls(code: str) -> list[tuple[str, list, dict]]:
    """[(function, args, kwargs)] of a rendered command; fails on anything but literal calls."""
    tree = ast.parse(code, mode="exec")
    out = []
    for stmt in tree.body:
        assert isinstance(stmt, ast.Expr), ast.dump(stmt)
        call = stmt.value
        assert isinstance(call, ast.Call), ast.dump(stmt)
        func = call.func
        assert isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
        assert func.value.id == "pyautogui"
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        out.append((func.attr, args, kwargs))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert names <= {"pyautogui"}
    return out


CLICKS = {
    "left_click": "click",
    "right_click": "rightClick",
    "middle_click": "middleClick",
    "double_click": "doubleClick",
    "mouse_move": "moveTo",
}


def _typed(calls: list[tuple[str, list, dict]]) -> str:
    """The text a sequence of typewrite/press('enter') calls types."""
    text = []
    for fn, args, kwargs in calls:
        if fn == "typewrite":
            assert kwargs == {"interval": 0.03} and len(args) == 1
            text.append(args[0])
        else:
            assert (fn, args, kwargs) == ("press", ["enter"], {})
            text.append("\n")
    return "".join(text)


def _check_round_trip(action: Action, *, osworld_exact: bool = False) -> None:
    code = render_pyautogui(action, osworld_exact=osworld_exact)
    name = action.action
    if name == "wait":
        assert code == "WAIT"
        return
    if name == "terminate":
        fail = action.status == "failure" and not osworld_exact
        assert code == ("FAIL" if fail else "DONE")
        return
    if name == "type" and action.text == "":
        assert code == "pass"  # typing nothing: a valid no-op command
        return
    calls = _calls(code)
    if name in CLICKS:
        expected_args = [] if action.x is None else [action.x, action.y]
        assert calls == [(CLICKS[name], expected_args, {})]
    elif name == "left_click_drag":
        assert calls == [("dragTo", [action.x, action.y], {"duration": 0.5})]
    elif name == "type":
        assert _typed(calls) == action.text.replace("\r\n", "\n")
    elif name == "key":
        if len(action.keys) == 1:
            assert calls == [("press", [action.keys[0]], {})]
        else:
            assert calls == [("hotkey", list(action.keys), {})]
    elif name == "scroll":
        if action.x is None or osworld_exact:
            assert calls == [("scroll", [action.pixels], {})]
        else:
            assert calls == [("scroll", [action.pixels], {"x": action.x, "y": action.y})]
    else:  # pragma: no cover - every name is handled above
        raise AssertionError(name)


def _parsed_actions() -> list:
    params = []
    for name in ("qwen_responses.jsonl", "harness_extra.jsonl"):
        with open(DATA / name, encoding="utf-8") as f:
            for line in f:
                case = json.loads(line)
                harness = Harness(variant=case.get("variant", "qwen3vl"))
                ep = harness.episode("x", tuple(case.get("screen", (1920, 1080))))
                parsed = ep.parse(case["response"], case["finish_reason"])
                for i, action in enumerate(parsed.actions):
                    params.append(pytest.param(action, id=f"{case['id']}-{i}"))
    return params


PARSED = _parsed_actions()


@pytest.mark.parametrize("action", PARSED)
@pytest.mark.parametrize("osworld_exact", [False, True])
def test_round_trip_parsed_actions(action, osworld_exact):
    _check_round_trip(action, osworld_exact=osworld_exact)


def test_every_action_name_is_covered():
    assert {p.values[0].action for p in PARSED} == {
        "left_click", "right_click", "middle_click", "double_click", "mouse_move",
        "left_click_drag", "type", "key", "scroll", "wait", "terminate",
    }  # fmt: skip


@pytest.mark.parametrize(
    "action",
    [
        Action("type", text=INJECTION),
        Action("type", text='"""; import os #\n\\x00 \\n'),
        Action("type", text="line1\r\nline2\n\nline4\n"),
        Action("type", text="\n"),
        Action("type", text=""),
        Action("type", text="tab\there \x1b[31m é 中文 \ud800"),
        Action("key", keys=("'); os.system('x') #",)),
        Action("key", keys=("ctrl", "'", "\\")),
        Action("left_click", x=0, y=1079),
        Action("scroll", x=5, y=6, pixels=-10),
        Action("scroll", pixels=3),
    ],
    ids=lambda a: a.action,
)
def test_round_trip_hostile_and_edge_actions(action):
    _check_round_trip(action)


def test_injection_types_characters_only():
    code = render_pyautogui(Action("type", text=INJECTION))
    tree = ast.parse(code)
    assert not any(isinstance(n, ast.Import | ast.ImportFrom) for n in ast.walk(tree))
    assert _calls(code) == [("typewrite", [INJECTION], {"interval": 0.03})]


def test_type_with_newlines_follows_newer_osworld():
    code = render_pyautogui(Action("type", text='He said "hi"\nBye'))
    assert code.splitlines() == [
        "pyautogui.typewrite('He said \"hi\"', interval=0.03)",
        "pyautogui.press('enter')",
        "pyautogui.typewrite('Bye', interval=0.03)",
    ]


def test_terminate_and_scroll_osworld_exact():
    fail = Action("terminate", status="failure")
    assert render_pyautogui(fail) == "FAIL"
    assert render_pyautogui(fail, osworld_exact=True) == "DONE"
    assert Harness(osworld_exact=True).render(fail) == "DONE"
    scroll = Action("scroll", x=1, y=2, pixels=-5)
    assert render_pyautogui(scroll, osworld_exact=True) == "pyautogui.scroll(-5)"


@pytest.mark.parametrize(
    "action",
    [
        Action("left_click", x="1); import os; (", y=2),  # type: ignore[arg-type]
        Action("left_click", x=True, y=2),  # type: ignore[arg-type]
        Action("mouse_move"),
        Action("left_click_drag"),
        Action("type"),
        Action("key"),
        Action("scroll"),
        Action("triple_click", x=1, y=1),
    ],
    ids=lambda a: a.action,
)
def test_render_refuses_malformed_actions(action):
    with pytest.raises(ValueError):
        render_pyautogui(action)
