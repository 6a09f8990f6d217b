"""The parts of the local backend's OSWorld grader that need no desktop: desktop-env's own
names (read from the installed venv, cached per install), the grader choice, and the task
files copied from the file cache under the names DesktopEnv looks for."""

from __future__ import annotations

import os
import uuid

import pytest

from legato_pipelines.desktops.osworld_worker.desktop_grader import stage_task_files
from legato_pipelines.desktops.osworld_worker.grader import installed_grader, local_grader
from legato_pipelines.errors import ConfigError
from legato_pipelines.osworld_format.grader_names import OWN_GRADER
from legato_pipelines.tasks import Task
from tests.osworld_backend_support import osworld_python


def test_desktop_envs_names_come_from_the_venv_and_are_cached(tmp_path, monkeypatch):
    python = osworld_python()  # before XDG_CACHE_HOME moves: the default venv lives under it
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    installed_grader.cache_clear()
    names = installed_grader(python)
    assert names.kind == "osworld" and names.source.startswith("desktop-env 1.0.2")
    assert {"compare_pptx_files", "compare_docx_files", "infeasible"} <= names.metrics
    assert {
        "vm_file",
        "cloud_file",
        "active_url_from_accessTree",
        "open_tabs_info",
    } <= names.getters
    assert {"chrome_open_tabs", "download", "execute", "launch"} <= names.step_types
    # the three names test_all uses that desktop-env 1.0.2 lacks
    assert not {"check_play_and_exit", "check_structure_sim_with_threshold"} & names.metrics
    assert "chrome_appearance_mode_ui" not in names.getters
    (stored,) = (tmp_path / "legato" / "osworld-names").glob("*.json")
    # a second process reads the stored answer: a changed answer there is what it gets
    stored.write_text(stored.read_text().replace('"infeasible"', '"infeasible_x"'))
    installed_grader.cache_clear()
    assert "infeasible_x" in installed_grader(python).metrics
    installed_grader.cache_clear()


def test_a_names_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    """The stored names only save the next start an interpreter run: a cache directory that
    cannot be written (here below a regular file) leaves the names uncached, not an error."""
    python = osworld_python()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))
    installed_grader.cache_clear()
    try:
        assert "infeasible" in installed_grader(python).metrics
    finally:
        installed_grader.cache_clear()


def test_grader_choice(tmp_path, monkeypatch):
    assert local_grader({"grader": "own"}) == (OWN_GRADER, None)
    names, python = local_grader({"osworld_python": osworld_python()})
    assert names.kind == "osworld" and str(python) == osworld_python()
    missing = str(tmp_path / "nowhere" / "python")
    # a named interpreter that is not there is an error, never a quiet fall back to the own
    # subset (auto) or a vague "no venv" (osworld)
    for grader in ("auto", "osworld"):
        with pytest.raises(ConfigError, match=r"osworld_python=.* does not exist"):
            local_grader({"grader": grader, "osworld_python": missing})
    with pytest.raises(ConfigError, match="desktop option grader='best'"):
        local_grader({"grader": "best"})
    # a host without the venv: auto grades with the own subset, osworld says what to install
    monkeypatch.setenv("LEGATO_OSWORLD_VENV", str(tmp_path / "no-venv"))
    assert local_grader({}) == (OWN_GRADER, None)
    with pytest.raises(ConfigError, match="grader=osworld needs the OSWorld venv"):
        local_grader({"grader": "osworld"})


def test_task_files_are_copied_under_desktop_envs_names(tmp_path):
    url = "https://huggingface.co/datasets/x/resolve/main/t1/Forests.pptx"
    gold = "https://huggingface.co/datasets/x/resolve/main/t1/Forests_Gold.pptx"
    local = tmp_path / "local.txt"
    local.write_text("local")
    config = {
        "instruction": "x",
        "config": [
            {"type": "download", "parameters": {"files": [
                {"url": url, "path": "/home/user/Desktop/Forests.pptx"},
                {"url": local.as_uri(), "path": "/home/user/notes.txt"},
                {"url": "https://example.org/uncached.bin", "path": "/home/user/u.bin"},
            ]}},
        ],
        "evaluator": {
            "func": "compare_pptx_files",
            "result": {"type": "vm_file", "path": "/home/user/Desktop/Forests.pptx", "dest": "Forests.pptx"},
            "expected": {"type": "cloud_file", "path": gold, "dest": "Forests_Gold.pptx"},
        },
    }  # fmt: skip
    task = Task("t1", "libreoffice_impress", config, "inline")
    cache = tmp_path / "cache"
    (cache / "t1").mkdir(parents=True)
    (cache / "t1" / "Forests.pptx").write_bytes(b"original")
    (cache / "t1" / "Forests_Gold.pptx").write_bytes(b"gold")
    task_dir = tmp_path / "desktop-env" / "t1"
    task_dir.mkdir(parents=True)
    (task_dir / "left-over").write_text("from the last attempt")
    written = stage_task_files(task, cache, task_dir)
    download = f"{uuid.uuid5(uuid.NAMESPACE_URL, url)}_Forests.pptx"
    from_file = f"{uuid.uuid5(uuid.NAMESPACE_URL, local.as_uri())}_notes.txt"
    assert written == [download, from_file, "Forests_Gold.pptx"]
    assert sorted(os.listdir(task_dir)) == sorted(written)  # emptied first; uncached skipped
    assert (task_dir / download).read_bytes() == b"original"
    # a getter writing its file there never changes the cache: copies, not links
    (task_dir / "Forests_Gold.pptx").write_bytes(b"overwritten")
    assert (cache / "t1" / "Forests_Gold.pptx").read_bytes() == b"gold"
