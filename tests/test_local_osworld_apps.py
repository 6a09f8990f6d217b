"""OSWorld tasks that need the VM's PDF viewer, Picard, default video player and Chrome profile,
on ``--backend local`` through ``collect``, graded by OSWorld's own code (issue 15).

- vlc 386dbd0e: a lecture PDF opened by ``/setup/open_file`` (``xdg-open`` -> evince) beside
  VLC playing an MP3, then ``activate_window`` on evince's exact title (strict);
- multi_apps 5df7b33a: a book unzipped on the Desktop, nautilus on its folder, the PDF in evince;
- multi_apps 3f05f3b9 (Picard): files, archives and blank-tagged MP3s, Chrome and nautilus; its
  two live websites (Picard's and Kid3's) are pointed at a page on loopback (and its ``proxy``
  for them turned off), as there is no internet here;
- multi_apps 937087b6 "make VLC the default video player": the VM's default is totem;
- chrome 99146c54 "delete browsing data on close": a fresh profile has no
  ``profile.default_content_setting_values``, as the VM's Chrome.

Every task's setup runs with no recorded failure and terminating at once scores 0. Then the two
settings tasks are done from a terminal (``xdg-mime default``; the "clear on exit" cookie
setting written into Chrome's Preferences while Chrome is closed) and score 1. The files are
built here (``tests/built_media.py``) and served from a test file cache; nothing is downloaded.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import orjson
import pytest
from openpyxl import Workbook

from legato_pipelines.osworld_format.files import task_files
from legato_pipelines.osworld_format.sources import cache_names
from legato_pipelines.policy.synthetic import qwen_response
from legato_pipelines.tasks import load_tasks
from tests.built_media import mp3, pdf, tar_xz, zip_of
from tests.loopback_page import serve_page
from tests.osworld_backend_support import needs_desktop_apps, needs_vm_python
from tests.osworld_data import OSWORLD
from tests.scripted_runs import collect_scripted

pytestmark = [
    pytest.mark.desktop,
    pytest.mark.slow,
    needs_desktop_apps,
    needs_vm_python,
    pytest.mark.skipif(
        not all(shutil.which(p) for p in ("evince", "totem", "picard", "vlc", "nautilus")),
        reason="needs evince, totem, picard, vlc and nautilus (scripts/setup.sh)",
    ),
]

PDF_VLC = "386dbd0e-0241-4a0a-b6a2-6704fba26b1c"
PDF_BOOK = "5df7b33a-9f77-4101-823e-02f863e1c1ae"
PICARD = "3f05f3b9-29ba-4b6b-95aa-2204697ffc06"
VIDEO_PLAYER = "937087b6-f668-4ba6-9110-60682ee33441"
DELETE_ON_CLOSE = "99146c54-4f37-4ab8-9327-5f3291665e1e"
TASKS = {
    PDF_VLC: "vlc",
    PDF_BOOK: "multi_apps",
    PICARD: "multi_apps",
    VIDEO_PLAYER: "multi_apps",
    DELETE_ON_CLOSE: "chrome",
}
LECTURE = "6.006 Introduction to Algorithms, Lecture 2: Data Structures"


def _built(name: str) -> bytes:
    """The bytes of a task file by its base name (the task's ``path`` or ``dest``)."""
    if name == "lecture.pdf":
        return pdf(LECTURE, "Lecture 2")
    if name == "book.zip":  # unzipped into ~/Desktop/book by the setup
        return zip_of({"book/Spectral Graph Theory.pdf": pdf("Spectral Graph Theory", "Ch. 1")})
    if name == "gold_book.zip":  # one PDF per chapter
        return zip_of({f"Chapter {i}.pdf": pdf(f"Chapter {i}", f"Chapter {i}") for i in (1, 2)})
    if name.endswith(".mp3"):
        return mp3(2.0)
    if name.endswith(".pdf"):
        return pdf(name[:-4], name)
    if name.endswith(".tar.xz"):
        return tar_xz({"notes.txt": b"notes\n"})
    if name.endswith(".xlsx"):
        out = io.BytesIO()
        Workbook().save(out)
        return out.getvalue()
    raise AssertionError(f"no builder for {name}")


@pytest.fixture(scope="module")
def page_url():
    with serve_page("app site") as url:
        yield url


@pytest.fixture(scope="module")
def workload(tmp_path_factory, page_url):
    """(task list, file cache): the configs of test_all unchanged but for the Picard task's two
    live websites, which point at ``page_url`` without a proxy."""
    root = tmp_path_factory.mktemp("apps")
    entries = []
    for task_id, domain in TASKS.items():
        config = json.loads((OSWORLD / domain / f"{task_id}.json").read_text())
        for step in config["config"]:
            if step["type"] == "chrome_open_tabs":
                step["parameters"]["urls_to_open"] = [f"{page_url}/picard", f"{page_url}/kid3"]
                config["proxy"] = False  # OSWorld's proxy serves those websites only
        entries.append({"task_id": task_id, "domain": domain, "config": config})
    (root / "tasks.json").write_bytes(orjson.dumps(entries))
    tasks = load_tasks(root / "tasks.json")
    cache = root / "files"
    for task in tasks:
        for file in task_files(task):
            name = cache_names(file.url, file.dest)[0]
            path = cache / task.task_id / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_built(Path(file.dest or file.url).name))
    return tasks, cache


def _key(*keys: str, what: str) -> str:
    return qwen_response(what, {"action": "key", "keys": list(keys)})


def _type(text: str) -> str:
    return qwen_response(f"Type {text!r}.", {"action": "type", "text": text})


def _done(status: str = "success") -> str:
    return qwen_response("The task is done.", {"action": "terminate", "status": status})


def _terminal(*commands: str) -> list[str]:
    """Open a terminal as on OSWorld's GNOME VM (Ctrl+Alt+T), type each command, terminate."""
    return [
        _key("ctrl", "alt", "t", what="Open a terminal with Ctrl+Alt+T."),
        *(_type(f"{command}\n") for command in commands),
        qwen_response("Wait for the commands.", {"action": "wait", "time": 2}),
        _done(),
    ]


#: OSWorld's getter asks xdg-mime for ~40 video types and takes the most common answer.
SET_VLC = (
    "xdg-mime default vlc.desktop $(grep -o '^video/[^=]*' /usr/share/applications/defaults.list)"
)
#: Chrome's "delete data sites saved when you close all windows": cookies SESSION_ONLY (4),
#: written with Chrome closed (it rewrites Preferences on exit).
SET_CLEAR_ON_EXIT = (
    'pkill chrome; sleep 2; python3 -c "import json,os; '
    "p=os.path.expanduser('~/.config/google-chrome/Default/Preferences'); d=json.load(open(p)); "
    "d['profile'].setdefault('default_content_setting_values', {})['cookies']=4; "
    "json.dump(d, open(p, 'w'))\""
)


def _run(tasks, cache: Path, script: dict, out: Path) -> dict[str, dict]:
    # network=host: the websites of the Picard task are served on this host's loopback, which
    # the default (auto: a network of its own) does not reach (docs/sandbox.md §1)
    options = {"cache_dir": str(cache), "network": "host"}
    return collect_scripted(tasks, script, out, options, max_steps=8)


def test_setups_run_and_doing_nothing_scores_zero(workload, tmp_path):
    tasks, cache = workload
    script = {"tasks": {t.instruction: [_done()] for t in tasks}}
    records = _run(tasks, cache, script, tmp_path / "idle")
    assert set(records) == set(TASKS)
    for task_id, record in records.items():
        assert record["status"] == "ok", (task_id, record.get("error"))
        assert not (record["reset"] or {}).get("setup_failures"), (task_id, record["reset"])
        assert record.get("eval_error") is None, (task_id, record.get("eval_error"))
    assert {t: r["reward"] for t, r in records.items()} == dict.fromkeys(TASKS, 0.0)


def test_changing_the_default_player_and_chromes_clear_on_exit_scores_one(workload, tmp_path):
    tasks, cache = workload
    chosen = type(tasks)(
        tasks=tuple(t for t in tasks if t.task_id in (VIDEO_PLAYER, DELETE_ON_CLOSE)),
        task_set="settings",
    )
    by_id = {t.task_id: t for t in chosen}
    script = {
        "tasks": {
            by_id[VIDEO_PLAYER].instruction: _terminal(SET_VLC),
            by_id[DELETE_ON_CLOSE].instruction: _terminal(SET_CLEAR_ON_EXIT),
        }
    }
    records = _run(chosen, cache, script, tmp_path / "solve")
    got = {t: (r["status"], r["reward"], r.get("eval_error")) for t, r in records.items()}
    assert got == {VIDEO_PLAYER: ("ok", 1.0, None), DELETE_ON_CLOSE: ("ok", 1.0, None)}
