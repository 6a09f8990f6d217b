"""The project stands alone: no file points at notes outside the clone, and the OSWorld task
configs the tests use ship with the repository."""

from __future__ import annotations

import re
import subprocess

import orjson

from tests.osworld_data import OSWORLD, REPO_ROOT

#: A reference to the design notes or data folder that lived beside the repository (the name is
#: spliced in so this file does not match a plain grep for the path itself).
NOTES = "shared"
OUTSIDE_NOTES = re.compile(rf"{NOTES}/(design|data)|\.\./{NOTES}|/work/{NOTES}")


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in out.decode().split("\0") if name]


def test_no_tracked_file_refers_to_notes_outside_the_repository():
    files = tracked_files()
    assert "README.md" in files and "pyproject.toml" in files
    hits = []
    for name in files:
        path = REPO_ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree
        text = path.read_bytes().decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_NOTES.search(line):
                hits.append(f"{name}:{number}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_doc_citations_name_docs_that_exist():
    cited = set()
    for name in tracked_files():
        if name.endswith((".py", ".md", ".yaml", ".toml", ".sh")) and (REPO_ROOT / name).is_file():
            cited |= set(re.findall(r"docs/[\w.-]+\.md", (REPO_ROOT / name).read_text()))
    assert cited, "nothing cites docs/"
    missing = sorted(c for c in cited if not (REPO_ROOT / c).is_file())
    assert not missing, missing


def test_the_vendored_osworld_index_lists_369_tasks_all_present():
    index = orjson.loads((OSWORLD / "test_all.json").read_bytes())
    ids = [(domain, task_id) for domain, task_ids in index.items() for task_id in task_ids]
    assert len(ids) == 369 and len(set(ids)) == 369
    assert len(index) == 10
    missing = [f"{d}/{t}.json" for d, t in ids if not (OSWORLD / d / f"{t}.json").is_file()]
    assert not missing, missing
    for domain, task_id in ids:
        assert orjson.loads((OSWORLD / domain / f"{task_id}.json").read_bytes())["id"] == task_id
    for name in ("test_small.json", "test_nogdrive.json", "test_infeasible.json"):
        subset = orjson.loads((OSWORLD / name).read_bytes())
        assert {(d, t) for d, ts in subset.items() for t in ts} <= set(ids), name


def test_the_vendored_osworld_configs_carry_their_licence_note():
    notice = " ".join((OSWORLD / "NOTICE.md").read_text().split())
    assert "xlang-ai/OSWorld" in notice and "Apache License 2.0" in notice
    assert "Apache License" in (OSWORLD / "LICENSE").read_text()
