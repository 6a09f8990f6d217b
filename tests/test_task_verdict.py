"""One verdict: ``legato tasks check --backend X`` and the engine's preflight refuse the same
tasks, for the same reasons; and the per-domain coverage of OSWorld's test_all on ``local``
(README's table), with and without a file cache holding every referenced file.

The cache here is built by the test: an empty placeholder under OSWorld's cache name for
every file a task references (``osworld_format/sources.py``), so "every file present" is
counted without downloading 1 GB. The counts assume this host's apps and the installed
OSWorld venv (CI installs both: scripts/osworld_venv.sh, docs/local-desktop.md §1).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import orjson
import pytest

from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.support import backend_support
from legato_pipelines.errors import TaskListError
from legato_pipelines.osworld_format import classify_task
from legato_pipelines.osworld_format.files import task_files
from legato_pipelines.osworld_format.sources import cache_names, is_internet_url
from legato_pipelines.rollout.engine import _preflight
from legato_pipelines.tasks import load_tasks
from tests.osworld_data import OSWORLD, REPO_ROOT

TEST_ALL = OSWORLD / "test_all.json"

#: domain -> (tasks, runnable on local with every file cached, without a cache, with every
#: file cached and a route out with a proxy set: desktops/web.py, with every file cached and
#: every task recorded in a web archive replayed with no route out: web=replay:ARCHIVE)
COVERAGE = {
    "chrome": (46, 10, 10, 45, 42),
    "gimp": (26, 26, 6, 26, 26),
    "libreoffice_calc": (47, 47, 0, 47, 47),
    "libreoffice_impress": (47, 47, 2, 47, 47),
    "libreoffice_writer": (23, 23, 0, 23, 23),
    "multi_apps": (101, 56, 4, 81, 76),
    "os": (24, 22, 14, 23, 22),
    "thunderbird": (15, 14, 0, 15, 14),
    "vlc": (17, 15, 8, 16, 16),
    "vs_code": (23, 0, 0, 0, 0),
}
#: why the others are not runnable with the cache (a task may have several reasons)
BLOCKERS = {
    "needs a route out": 76,
    "needs a Google account": 8,
    "app vs_code": 35,
    "evaluator: getter chrome_appearance_mode_ui": 1,
    "evaluator: metric check_play_and_exit": 1,
    "evaluator: metric check_structure_sim_with_threshold": 1,
    "system service systemd-timedated": 1,
}


@pytest.fixture(scope="module")
def task_set():
    return load_tasks(TEST_ALL)  # no --osworld: the index's own <domain>/<id>.json layout


@pytest.fixture(scope="module")
def placeholder_cache(task_set, tmp_path_factory) -> Path:
    """Every web file test_all references, as an empty file under OSWorld's cache name."""
    cache = tmp_path_factory.mktemp("osworld-files")
    for task in task_set:
        for file in task_files(task):
            if is_internet_url(file.url):
                path = cache / task.task_id / cache_names(file.url, file.dest)[0]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
    return cache


def _check(*args: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "tasks", "check", *args, "--json"],
        cwd=REPO_ROOT, capture_output=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr.decode()
    return orjson.loads(proc.stdout)


@pytest.mark.parametrize("backend", ["local", "osworld"])
def test_tasks_check_and_the_engine_preflight_refuse_the_same_tasks(
    backend, task_set, placeholder_cache
):
    doc = _check(str(TEST_ALL), "--backend", backend, "--cache-dir", str(placeholder_cache))
    refused = set(doc["not_runnable"][backend])
    config = DesktopConfig(backend=backend, options={"cache_dir": str(placeholder_cache)})
    by_id = {task.task_id: task for task in task_set}
    accepted = [t for t in task_set if t.task_id not in refused]
    _preflight(type(task_set)(tasks=tuple(accepted), task_set="accepted"), config)  # raises nothing
    for task_id in refused:
        one = type(task_set)(tasks=(by_id[task_id],), task_set="one")
        with pytest.raises(TaskListError) as caught:
            _preflight(one, config)
        listed = [p for p in doc["problems"][backend] if f"(task_id {task_id!r})" in p]
        assert f"{len(listed)} problem(s)" in str(caught.value), task_id
    if backend == "local":
        # a task collect runs on local (sudo inside the sandbox): the check accepts it too
        assert any(t.task_id.startswith("e0df059f") for t in accepted)
        assert doc["local_desktops"]["grader"] == "osworld"
    else:
        # names the installed desktop-env 1.0.2 lacks: refused before anything starts
        assert {by_id[i].task_id[:8] for i in refused} == {"5ac2891a", "e8172110", "93eabf48"}


def _coverage(task_set, cache: Path):
    with_cache = backend_support("local", {"cache_dir": str(cache)})
    without = backend_support("local", {"cache_dir": ""})  # no file cache at all
    # a route out and a proxy set (this host has no internet: the check's verdict is given)
    routed = with_cache.model_copy(
        update={"local_route_out": True, "local_route_why": "", "local_proxy": True}
    )
    # replay: a web archive holding a recording of every task, and no route out
    archive = cache.parent / f"{cache.name}-web-archive"
    archive.mkdir(exist_ok=True)
    for task in task_set:
        (archive / f"{task.task_id}.flows").touch()
    replayed = backend_support("local", {"cache_dir": str(cache), "web": f"replay:{archive}"})
    assert not replayed.local_route_out  # this host: no internet (else the column means less)
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    blockers: Counter[str] = Counter()
    for task in task_set:
        cached = classify_task(task, backend_support=with_cache)
        bare = classify_task(task, backend_support=without)
        row = rows[task.domain]
        row[0] += 1
        row[1] += "local" in cached.backends
        row[2] += "local" in bare.backends
        row[3] += "local" in classify_task(task, backend_support=routed).backends
        row[4] += "local" in classify_task(task, backend_support=replayed).backends
        if "local" not in cached.backends:
            blockers.update(cached.local_blockers)
    return {d: tuple(r) for d, r in sorted(rows.items())}, dict(blockers)


def test_coverage_per_domain_is_readmes_table(task_set, placeholder_cache):
    rows, blockers = _coverage(task_set, placeholder_cache)
    assert rows == COVERAGE
    assert blockers == BLOCKERS
    # README's table says the same (domain | tasks | with the cache | without | with a route
    # out | with a recorded archive | why not)
    readme = (REPO_ROOT / "README.md").read_text()
    row = r"^\| `(\w+)` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|"
    table = {m[1]: tuple(int(m[i]) for i in range(2, 7)) for m in re.finditer(row, readme, re.M)}
    assert table == COVERAGE
    total = tuple(sum(r[i] for r in COVERAGE.values()) for i in range(5))
    assert f"| all | {' | '.join(map(str, total))} |" in readme
