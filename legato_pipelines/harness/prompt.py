"""The prompt text of OSWorld's Qwen agents and the chat message dicts built from it.

Source: OSWorld ``mm_agents/qwen3vl_agent.py`` (Qwen3VLAgent, relative coordinates) and
``mm_agents/qwen25vl_agent.py`` (Qwen25VLAgent). The wording, the tool JSON (key order,
``json.dumps`` defaults) and the whitespace are reproduced exactly, because results must be
comparable with OSWorld's own numbers. Messages use OpenAI's multi-part content format;
image parts carry ``legato-image://<sha>`` refs, which the policy client turns into data URLs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..images import Screenshot

VARIANTS = ("qwen3vl", "qwen25vl")

_ACTION_ENUM = [
    "key",
    "type",
    "mouse_move",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "scroll",
    "wait",
    "terminate",
]

# Qwen3-VL: tool description with the screen notes; "1000x1000" because coordinates are
# relative (0..999), whatever the real screen size is.
_QWEN3VL_DESCRIPTION = "\n".join(
    [
        "Use a mouse and keyboard to interact with a computer, and take screenshots.",
        "* This is an interface to a desktop GUI. You do not have access to a terminal or applications menu. You must click on desktop icons to start applications.",
        "* Some applications may take time to start or process actions, so you may need to wait and take successive screenshots to see the results of your actions. E.g. if you click on Firefox and a window doesn't open, try wait and taking another screenshot.",
        "* The screen's resolution is 1000x1000.",
        "* Whenever you intend to move the cursor to click on an element like an icon, you should consult a screenshot to determine the coordinates of the element before moving the cursor.",
        "* If you tried clicking on a program or link but it failed to load even after waiting, try adjusting your cursor position so that the tip of the cursor visually falls on the element that you want to click.",
        "* Make sure to click any buttons, links, icons, etc with the cursor tip in the center of the element. Don't click boxes on their edges unless asked.",
    ]
)

# Qwen3-VL's action description lists triple_click, hscroll and answer, which are not in the
# enum (OSWorld's parser ignores them). The trailing "\n        " is the source's indentation.
_QWEN3VL_ACTION_DESCRIPTION = """
* `key`: Performs key down presses on the arguments passed in order, then performs key releases in reverse order.
* `type`: Type a string of text on the keyboard.
* `mouse_move`: Move the cursor to a specified (x, y) pixel coordinate on the screen.
* `left_click`: Click the left mouse button at a specified (x, y) pixel coordinate on the screen.
* `left_click_drag`: Click and drag the cursor to a specified (x, y) pixel coordinate on the screen.
* `right_click`: Click the right mouse button at a specified (x, y) pixel coordinate on the screen.
* `middle_click`: Click the middle mouse button at a specified (x, y) pixel coordinate on the screen.
* `double_click`: Double-click the left mouse button at a specified (x, y) pixel coordinate on the screen.
* `triple_click`: Triple-click the left mouse button at a specified (x, y) pixel coordinate on the screen (simulated as double-click since it's the closest action).
* `scroll`: Performs a scroll of the mouse scroll wheel.
* `hscroll`: Performs a horizontal scroll (mapped to regular scroll).
* `wait`: Wait specified seconds for the change to happen.
* `terminate`: Terminate the current task and report its completion status.
* `answer`: Answer a question.
        """

_TOOLS_HEADER = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
"""

_TOOLS_FOOTER = """
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>"""

_QWEN3VL_RESPONSE_FORMAT = """

# Response format

Response format for every step:
1) Action: a short imperative describing what to do in the UI.
2) A single <tool_call>...</tool_call> block containing only the JSON: {"name": <function-name>, "arguments": <args-json-object>}.

Rules:
- Output exactly in the order: Action, <tool_call>.
- Be brief: one sentence for Action.
- Do not output anything else outside those parts.
- If finishing, use action=terminate in the tool call."""

USER_PROMPT_TEMPLATE = """
Please generate the next move according to the UI screenshot, instruction and previous actions.

Instruction: {instruction}

Previous actions:
{previous_actions}"""
"""OSWorld's user text (both variants); it starts with a newline, as in the source."""


def _tool(description: str, action_description: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name_for_human": "computer_use",
            "name": "computer_use",
            "description": description,
            "parameters": {
                "properties": {
                    "action": {
                        "description": action_description,
                        "enum": list(_ACTION_ENUM),
                        "type": "string",
                    },
                    "keys": {"description": "Required only by `action=key`.", "type": "array"},
                    "text": {"description": "Required only by `action=type`.", "type": "string"},
                    "coordinate": {
                        "description": "The x,y coordinates for mouse actions.",
                        "type": "array",
                    },
                    "pixels": {"description": "The amount of scrolling.", "type": "number"},
                    "time": {"description": "The seconds to wait.", "type": "number"},
                    "status": {
                        "description": "The status of the task.",
                        "type": "string",
                        "enum": ["success", "failure"],
                    },
                },
                "required": ["action"],
                "type": "object",
            },
            "args_format": "Format the arguments as a JSON object.",
        },
    }


def system_prompt(variant: str) -> str:
    """The system prompt text of OSWorld's agent for ``variant`` (``qwen3vl`` | ``qwen25vl``).

    ``qwen3vl``: the tools block (with the screen notes) plus the "Response format" rules.
    ``qwen25vl``: "You are a helpful assistant" plus the tools block.
    Raises ``ValueError`` for an unknown variant.
    """
    if variant == "qwen3vl":
        tool = _tool(_QWEN3VL_DESCRIPTION, _QWEN3VL_ACTION_DESCRIPTION)
        return _TOOLS_HEADER + json.dumps(tool) + _TOOLS_FOOTER + _QWEN3VL_RESPONSE_FORMAT
    if variant == "qwen25vl":
        tool = _tool(
            "Use a mouse and keyboard to interact with a computer, and take screenshots.",
            "The action to perform.",
        )
        return "You are a helpful assistant\n\n" + _TOOLS_HEADER + json.dumps(tool) + _TOOLS_FOOTER
    raise ValueError(f"unknown variant {variant!r}: expected one of {VARIANTS}")


def user_text(instruction: str, previous: Sequence[str]) -> str:
    """The user text: the instruction and the "Step i: <action line>" lines of the turns
    no longer replayed in full (``"None"`` when there are none), as OSWorld writes it."""
    if previous:
        lines = "\n".join(f"Step {i}: {text}" for i, text in enumerate(previous, start=1))
    else:
        lines = "None"
    return USER_PROMPT_TEMPLATE.format(instruction=instruction, previous_actions=lines)


def system_message(text: str) -> dict[str, Any]:
    """``{"role": "system", "content": [{"type": "text", "text": text}]}``."""
    return {"role": "system", "content": [{"type": "text", "text": text}]}


def image_part(shot: Screenshot) -> dict[str, Any]:
    """An ``image_url`` content part referring to ``shot`` by ``legato-image://<sha>``."""
    return {"type": "image_url", "image_url": {"url": shot.ref}}


def user_message(image: dict[str, Any], text: str | None = None) -> dict[str, Any]:
    """A user turn: the screenshot part, then the user text when given (OSWorld's order)."""
    content: list[dict[str, Any]] = [image]
    if text is not None:
        content.append({"type": "text", "text": text})
    return {"role": "user", "content": content}


def assistant_message(text: str) -> dict[str, Any]:
    """An assistant turn replaying the model's raw response text."""
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}
