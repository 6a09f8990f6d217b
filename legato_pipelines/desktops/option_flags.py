"""``--desktop-option KEY=VALUE`` flags as a backend's options dict.

Stdlib only: read by ``legato collect`` and ``legato tasks check``, and on ``legato``'s first
line (:mod:`.early`), before the CLI's imports.
"""

from __future__ import annotations

import json
from typing import Any


def parse_desktop_options(items: list[str]) -> dict[str, Any]:
    """``--desktop-option KEY=VALUE`` items as the options dict: VALUE is JSON when it parses
    (``latency='{"act": 0.1}'``, ``cache_dir='"/c"'``, ``sandbox=false``), else the bare text
    (``cache_dir=/c``: a path needs no JSON quotes). Raises ``ValueError`` for an item
    without ``=``."""
    options: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(
                f"--desktop-option {item!r}: use KEY=JSON, e.g. latency='{{\"act\": 0.1}}'"
            )
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options
