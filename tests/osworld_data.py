"""Where the tests find OSWorld's 369 task configs (``shared/data/osworld``).

CI runs a fresh clone with a copy of ``shared/`` beside it (``<clone>/../shared``); a developer
machine has ``/work/shared``. The first that exists wins; tests that need it skip otherwise.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_SUITE = REPO_ROOT / "examples" / "tasks" / "local" / "tasks.json"
OSWORLD_CANDIDATES = (
    REPO_ROOT.parent / "shared" / "data" / "osworld",
    Path("/work/shared/data/osworld"),
)


def find_osworld() -> Path | None:
    """The first candidate holding ``test_all.json``, else ``None``."""
    return next((p for p in OSWORLD_CANDIDATES if (p / "test_all.json").is_file()), None)


OSWORLD = find_osworld() or OSWORLD_CANDIDATES[0]
needs_osworld = pytest.mark.skipif(
    find_osworld() is None,
    reason="OSWorld task configs not found: looked for test_all.json in "
    + " and ".join(str(p) for p in OSWORLD_CANDIDATES)
    + " (copy shared/ beside the clone)",
)
