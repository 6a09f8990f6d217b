"""The user's cache folder for legato: ``$XDG_CACHE_HOME/legato`` (else ``~/.cache/legato``).

Everything legato keeps between runs on a host lives under it, one folder each: the OSWorld
venv (``osworld-venv``), its metric and getter names (``osworld-names``), the task file cache
(``osworld-files``), DesktopEnv's caches (``osworld-cache``) and the desktops' pre-built app
profiles (``app-profiles``). Stdlib only: imported before anything heavy.
"""

from __future__ import annotations

import os
from pathlib import Path


def legato_cache(name: str) -> Path:
    """``$XDG_CACHE_HOME/legato/<name>`` of the user this process runs as (``~/.cache`` when
    ``XDG_CACHE_HOME`` is unset or empty); not created here."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "legato" / name
