"""Two kinds of OSWorld task that scored 0 when solved on local desktops now score 1 (issue 33).

- Impress ef9d12bd ("restore the slide panel"), graded from the accessibility tree
  (``check_left_panel`` looks for the ``Slides View`` document frame): LibreOffice is in the
  tree only with its GTK 3 front end (``libreoffice-gtk3``, scripts/setup.sh). The policy opens
  View > Slide Pane with the keys the task's own setup used to close it.
- Thunderbird 3f49d2cc ("set up a unified inbox"), graded from ``xulstore.json``, which
  Thunderbird writes 30 s after a change or when it exits: the postconfig closes the window of
  class ``Mail.thunderbird`` (strict, by class), Debian's Thunderbird has class
  ``Mail.thunderbird-default`` unless the desktop gives it the VM's (``vm_windows.py``). The
  policy picks View > Folders > Unified Folders by keyboard.

Both run unmodified configs through ``collect --backend local`` graded by OSWorld's own code;
the Thunderbird profile tarball is the oracle suite's stand-in (``examples/tasks/osworld_solved/
files.py``, no download): Debian's first-start windows off, a Local Folders account, under the
profile folder the config's getter reads.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import orjson
import pytest

from legato_pipelines.desktops.server import accessibility
from legato_pipelines.osworld_format.files import task_files
from legato_pipelines.osworld_format.sources import cache_names
from legato_pipelines.policy.synthetic import qwen_response
from legato_pipelines.tasks import load_tasks
from tests.osworld_backend_support import needs_desktop_apps, needs_vm_python
from tests.osworld_data import OSWORLD
from tests.scripted_runs import collect_scripted

needs_thunderbird_and_atspi = pytest.mark.skipif(
    not shutil.which("thunderbird") or bool(accessibility.missing()),
    reason="needs thunderbird and AT-SPI (scripts/setup.sh)",
)
pytestmark = [pytest.mark.desktop, pytest.mark.slow, needs_desktop_apps, needs_vm_python]
pytestmark.append(needs_thunderbird_and_atspi)

SLIDE_PANE = "ef9d12bd-bcee-4ba0-a40e-918400f43ddf"
UNIFIED_INBOX = "3f49d2cc-f400-4e7d-90cc-9b18e401cc31"
TASKS = {SLIDE_PANE: "libreoffice_impress", UNIFIED_INBOX: "thunderbird"}
ROOT = Path(__file__).resolve().parents[1]


def _profile_tarball() -> bytes:
    """The oracle suite's stand-in ``thunderbird-profile.tar.gz`` (``files.py``, loaded by path:
    not a package)."""
    path = ROOT / "examples" / "tasks" / "osworld_solved" / "files.py"
    spec = importlib.util.spec_from_file_location("osworld_solved_files", path)
    files = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(files)
    return files.thunderbird_profile()


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    root = tmp_path_factory.mktemp("graded")
    entries = [
        {"task_id": t, "domain": d, "config": json.loads((OSWORLD / d / f"{t}.json").read_text())}
        for t, d in TASKS.items()
    ]
    (root / "tasks.json").write_bytes(orjson.dumps(entries))
    tasks = load_tasks(root / "tasks.json")
    cache = root / "files"
    for task in tasks:
        for file in task_files(task):
            assert Path(file.dest or file.url).name == "thunderbird-profile.tar.gz"
            path = cache / task.task_id / cache_names(file.url, file.dest)[0]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_profile_tarball())
    return tasks, cache


def _key(*keys: str) -> str:
    return qwen_response(f"Press {'+'.join(keys)}.", {"action": "key", "keys": list(keys)})


def _done() -> str:
    return qwen_response("The task is done.", {"action": "terminate", "status": "success"})


#: View > Slide Pane: the keys the task's setup pressed to close it (F10, View, 11 down).
SHOW_SLIDE_PANE = [_key("f10"), _key("right"), _key("right"), *[_key("down")] * 11, _key("enter")]
#: View > Folders > Unified Folders (Thunderbird's menu bar shows with Alt).
UNIFIED_FOLDERS = [_key("alt", "v"), _key("f"), _key("u"), _key("escape")]


def _run(tasks, cache: Path, script: dict, out: Path) -> dict[str, dict]:
    return collect_scripted(tasks, script, out, {"cache_dir": str(cache)}, max_steps=20)


def test_solved_impress_tree_task_and_thunderbird_close_task_score_one(workload, tmp_path):
    tasks, cache = workload
    by_id = {t.task_id: t for t in tasks}
    script = {
        "tasks": {
            by_id[SLIDE_PANE].instruction: [*SHOW_SLIDE_PANE, _done()],
            by_id[UNIFIED_INBOX].instruction: [*UNIFIED_FOLDERS, _done()],
        }
    }
    records = _run(tasks, cache, script, tmp_path / "solved")
    got = {t: (r["status"], r["reward"], r.get("eval_error")) for t, r in records.items()}
    assert got == {SLIDE_PANE: ("ok", 1.0, None), UNIFIED_INBOX: ("ok", 1.0, None)}


def test_doing_nothing_scores_zero(workload, tmp_path):
    tasks, cache = workload
    records = _run(
        tasks, cache, {"tasks": {t.instruction: [_done()] for t in tasks}}, tmp_path / "idle"
    )
    got = {t: (r["status"], r["reward"]) for t, r in records.items()}
    assert got == {SLIDE_PANE: ("ok", 0.0), UNIFIED_INBOX: ("ok", 0.0)}
