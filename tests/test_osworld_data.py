"""The tests find OSWorld's task configs beside the clone (CI) before /work/shared (dev machine)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import tests.osworld_data as osworld_data


def load_from(clone: Path):
    """``tests/osworld_data.py`` imported from a copy of it inside ``clone``."""
    target = clone / "tests" / "osworld_data.py"
    target.parent.mkdir(parents=True)
    shutil.copy(osworld_data.__file__, target)
    spec = importlib.util.spec_from_file_location("osworld_data_copy", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shared_beside_the_clone_wins(tmp_path):
    shared = tmp_path / "shared" / "data" / "osworld"
    shared.mkdir(parents=True)
    (shared / "test_all.json").write_text('{"os": []}')
    module = load_from(tmp_path / "clone")
    assert module.find_osworld() == shared == module.OSWORLD
    assert module.LOCAL_SUITE == tmp_path / "clone" / "examples" / "tasks" / "local" / "tasks.json"


def test_without_shared_beside_the_clone_falls_back_or_skips(tmp_path):
    module = load_from(tmp_path / "clone")
    fallback = Path("/work/shared/data/osworld")
    found = module.find_osworld()
    assert found == (fallback if (fallback / "test_all.json").is_file() else None)
    mark = module.needs_osworld.mark
    assert mark.args == (found is None,)
    assert str(tmp_path / "shared" / "data" / "osworld") in mark.kwargs["reason"]
