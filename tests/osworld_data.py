"""Where the tests find OSWorld's 369 task configs: the copy in ``tests/data/osworld``.

The configs and their index files ship with the repository (see ``tests/data/osworld/NOTICE.md``
for their origin and licence), so every test that needs them runs on a plain clone.
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCAL_SUITE = REPO_ROOT / "examples" / "tasks" / "local" / "tasks.json"
OSWORLD = REPO_ROOT / "tests" / "data" / "osworld"
