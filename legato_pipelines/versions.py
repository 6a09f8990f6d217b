"""Policy versions in training order: the training step a partition key carries.

Keys like ``step-50``, ``step_1200``, ``ckpt-3``, ``checkpoint-7``, ``global_step300``, ``v2``
or a bare ``42`` carry a step; reports, charts and tables sort by it (``step-50`` before
``step-100``), never as text or by creation order. Keys without one (``demo-2026...-ab12``,
a model id) sort after the numbered ones, by name.

Bottom layer: imports nothing else from the package.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_STEP = re.compile(
    r"^(?:.*[-_./=:])?(?:global_step|checkpoint|ckpt|step|iter|it|v)?[-_]?(\d+)$", re.IGNORECASE
)


def version_step(key: str | None) -> int | None:
    """The training step in a policy-version key (``step-50`` -> 50), or ``None`` when the
    key carries none."""
    if not key:
        return None
    match = _STEP.match(key)
    return int(match.group(1)) if match else None


def version_sort_key(key: str) -> tuple[int, int, str]:
    """Sort key: numbered versions by step, then the others by name."""
    step = version_step(key)
    return (0, step, key) if step is not None else (1, 0, key)


def sort_versions(keys: Iterable[str]) -> list[str]:
    """``keys`` in training order (see :func:`version_sort_key`)."""
    return sorted(keys, key=version_sort_key)
