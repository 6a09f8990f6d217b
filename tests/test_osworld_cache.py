"""``legato osworld cache``: fill the file cache from a loopback stand-in for the hub.

Two real OSWorld task configs (tests/data/osworld) with ``download`` steps and ``cloud_file``
getters (one ``multi``); their seven files are served by a threaded ``http.server`` on 127.0.0.1
at huggingface.co's paths, reached through ``HF_ENDPOINT``. It answers Range requests, can
redirect like the hub, drop a connection half-way, or announce more bytes than it sends.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app
from legato_pipelines.osworld_format import preflight
from legato_pipelines.osworld_format.fetch import (
    CacheSettings,
    cache_file_name,
    fetch_url,
    fill_cache,
)
from legato_pipelines.osworld_format.files import task_files
from legato_pipelines.osworld_format.sources import find_source
from legato_pipelines.tasks import load_tasks
from tests.osworld_data import OSWORLD, REPO_ROOT

CALC = "3aaa4e37-dc91-482e-99af-132a612d40f3"  # download + cloud_file
MULTI = "3680a5ee-6870-426a-a997-eba929a0d25c"  # 2 downloads + a multi cloud_file of 3
ENTRIES = [
    {"task_id": CALC, "domain": "libreoffice_calc"},
    {"task_id": MULTI, "domain": "multi_apps"},
]
HUB = "https://huggingface.co"


class Hub:
    """A loopback hub: serves ``files`` (URL path -> bytes) with Content-Length and Range.

    ``redirect``: paths answered with a 302 to ``/blobs/<path>`` first (as the hub does);
    ``drop_once``: paths whose first GET sends half the bytes and closes the connection;
    ``lie``: paths answered with a Content-Length that many bytes too large (and the Range
    ignored). ``log`` holds ``(method, path, Range header)`` of every request.
    """

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.redirect: set[str] = set()
        self.drop_once: set[str] = set()
        self.lie: dict[str, int] = {}
        self.log: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body: bool):
                path = self.path
                hub.log.append((self.command, path, self.headers.get("Range")))
                if path in hub.redirect:
                    self.send_response(302)
                    self.send_header("Location", "/blobs" + path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                path = path.removeprefix("/blobs")
                data = hub.files.get(path)
                if data is None:
                    self.send_error(404)
                    return
                if path in hub.lie:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data) + hub.lie[path]))
                    self.end_headers()
                    if body:
                        self.wfile.write(data)
                    return
                start = 0
                ranged = self.headers.get("Range")
                if ranged:
                    start = int(ranged.removeprefix("bytes=").split("-")[0])
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not body:
                    return
                if self.command == "GET" and path in hub.drop_once and not ranged:
                    hub.drop_once.discard(path)
                    self.wfile.write(data[: len(data) // 2])
                    return  # HTTP/1.0: the connection closes, short of the Content-Length
                self.wfile.write(data[start:])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def __enter__(self) -> Hub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def gets(self, path: str | None = None) -> list[tuple[str, str, str | None]]:
        """The GET requests (of ``path``: its resolve URL or its /blobs redirect target)."""
        return [
            r
            for r in self.log
            if r[0] == "GET" and (path is None or r[1].removeprefix("/blobs") == path)
        ]


def url_path(url: str) -> str:
    return url.removeprefix(HUB)


@pytest.fixture
def task_set():
    return load_tasks(ENTRIES, osworld=OSWORLD)


@pytest.fixture
def hub(task_set):
    """The hub with every file of the two tasks (distinct sizes, 3 kB .. 303 kB of random bytes)."""
    urls = list(dict.fromkeys(f.url for t in task_set for f in task_files(t)))
    assert len(urls) == 7 and all(u.startswith(HUB + "/datasets/xlangai/") for u in urls)
    rng = random.Random(15)
    files = {url_path(u): rng.randbytes(3_000 + 50_000 * i) for i, u in enumerate(urls)}
    with Hub(files) as server:
        # the multi cloud_file's files come through a redirect, as from the real hub
        server.redirect = {p for p in files if "output" in p}
        yield server


def settings(tmp_path: Path, **kw) -> CacheSettings:
    return CacheSettings(cache_dir=tmp_path / "cache", retry_wait_s=0.05, **kw)


def run(task_set, s: CacheSettings):
    return asyncio.run(fill_cache(task_set, s))


def assert_all_resolve(task_set, hub: Hub, cache: Path) -> None:
    """Every reference resolves (sources.find_source) to its own bytes, under OSWorld's name."""
    for task in task_set:
        for file in task_files(task):
            found = find_source(file.url, dest=file.dest, cache_dir=cache, task_id=task.task_id)
            assert found == cache / task.task_id / cache_file_name(file), file
            assert found.read_bytes() == hub.files[url_path(file.url)], file
    assert not list(cache.rglob("*.part"))


def test_fetches_every_file_where_the_local_backend_finds_it(task_set, hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    cache = tmp_path / "cache"
    before = preflight(task_set, "local", cache_dir=cache)
    assert len(before) == 7 and all("needs the internet" in p for p in before)

    report = run(task_set, settings(tmp_path, jobs=3))

    assert [f.status for f in report.files] == ["fetched"] * 7
    assert report.downloaded == sum(len(b) for b in hub.files.values())
    assert all(f.fetched_from.startswith(hub.endpoint + "/datasets/") for f in report.files)
    assert_all_resolve(task_set, hub, cache)
    # OSWorld's names: <uuid5(url)>_<basename(path)> for downloads, <dest> for cloud_file
    names = sorted(p.name for p in (cache / MULTI).iterdir())
    assert names[-3:] == ["output_gold.csv", "output_gold2.csv", "output_gold3.csv"]
    assert all(n.endswith(("_file1.xlsx", "_file2.ods")) for n in names[:2])
    assert "7 fetched" in report.summary() and "0 failed" in report.summary()
    # what collection checks first, and `legato tasks check --backend local --cache-dir`
    assert preflight(task_set, "local", cache_dir=cache) == []
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(ENTRIES))
    check = ["tasks", "check", str(tasks), "--osworld", str(OSWORLD), "--backend", "local"]
    assert CliRunner().invoke(app, check).exit_code == 1
    result = CliRunner().invoke(app, [*check, "--cache-dir", str(cache)])
    assert result.exit_code == 0, result.output


def test_collect_and_check_read_the_default_cache_the_cache_command_fills(
    task_set, hub, tmp_path, monkeypatch
):
    """`legato osworld cache` without --cache-dir fills $XDG_CACHE_HOME/legato/osworld-files;
    `legato tasks check` and collect's preflight then find the files there with no cache
    option given (one default, ``sources.default_cache_dir``); ``cache_dir=`` means none."""
    from legato_pipelines.desktops.base import DesktopConfig
    from legato_pipelines.desktops.osworld_worker.install import default_venv
    from legato_pipelines.desktops.support import backend_support
    from legato_pipelines.errors import TaskListError
    from legato_pipelines.osworld_format.sources import default_cache_dir
    from legato_pipelines.rollout.engine import _preflight

    monkeypatch.setenv("LEGATO_OSWORLD_VENV", str(default_venv()))  # the venv stays where it is
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    default = tmp_path / "xdg" / "legato" / "osworld-files"
    assert default_cache_dir() == default and backend_support("local", {}).cache_dir == default
    local = DesktopConfig(backend="local")
    with pytest.raises(TaskListError, match="needs the internet|not in the file cache"):
        _preflight(task_set, local)  # collect's preflight: nothing fetched yet
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(ENTRIES))
    check = ["tasks", "check", str(tasks), "--osworld", str(OSWORLD), "--backend", "local"]
    assert CliRunner().invoke(app, check).exit_code == 1

    filled = CliRunner().invoke(app, ["osworld", "cache", str(tasks), "--osworld", str(OSWORLD)])
    assert filled.exit_code == 0, filled.output
    assert_all_resolve(task_set, hub, default)
    _preflight(task_set, local)  # raises nothing: the files are found in the default cache
    result = CliRunner().invoke(app, check)
    assert result.exit_code == 0, result.output
    none = CliRunner().invoke(app, [*check, "--desktop-option", "cache_dir="])
    assert none.exit_code == 1 and "no file cache (cache_dir '')" in none.output


def test_second_run_makes_no_get_and_verify_only_heads(task_set, hub, tmp_path):
    s = settings(tmp_path, endpoint=hub.endpoint)
    run(task_set, s)
    hub.log.clear()

    again = run(task_set, s)
    assert [f.status for f in again.files] == ["present"] * 7 and hub.log == []
    assert again.downloaded == 0 and "7 already present" in again.summary()

    verified = run(task_set, s.model_copy(update={"verify": True}))
    assert [f.status for f in verified.files] == ["present"] * 7
    assert {r[0] for r in hub.log} == {"HEAD"} and len(hub.log) == 7 + 3  # 3 redirects

    # a file whose size is wrong is fetched again under --verify (and only that one)
    victim = next(iter(hub.files))
    task = next(t for t in task_set if t.task_id in victim)
    file = next(f for f in task_files(task) if url_path(f.url) == victim)
    path = tmp_path / "cache" / task.task_id / cache_file_name(file)
    path.write_bytes(b"stale")
    hub.log.clear()
    fixed = run(task_set, s.model_copy(update={"verify": True}))
    assert [f.status for f in fixed.files].count("fetched") == 1
    assert [r[1] for r in hub.gets()] == [victim]
    assert_all_resolve(task_set, hub, tmp_path / "cache")


def test_dropped_connection_resumes_with_a_range_request(task_set, hub, tmp_path):
    big = max(hub.files, key=lambda p: len(hub.files[p]))
    hub.drop_once = {big}
    report = run(task_set, settings(tmp_path, endpoint=hub.endpoint))

    assert [f.status for f in report.files] == ["fetched"] * 7
    half = len(hub.files[big]) // 2
    assert big in hub.redirect  # the Range survives the hub's redirect
    assert [r[2] for r in hub.gets(big) if r[1].startswith("/blobs/")] == [None, f"bytes={half}-"]
    assert_all_resolve(task_set, hub, tmp_path / "cache")
    # the half was received once, the rest once
    assert report.downloaded == sum(len(b) for b in hub.files.values())


def test_a_part_file_left_behind_is_continued(task_set, hub, tmp_path):
    task = next(t for t in task_set if t.task_id == MULTI)
    file = task_files(task)[0]  # a download
    data = hub.files[url_path(file.url)]
    target = tmp_path / "cache" / MULTI / cache_file_name(file)
    target.parent.mkdir(parents=True)
    target.with_name(target.name + ".part").write_bytes(data[:1000])

    report = run(task_set, settings(tmp_path, endpoint=hub.endpoint))

    assert [r[2] for r in hub.gets(url_path(file.url))] == ["bytes=1000-"]
    assert target.read_bytes() == data
    assert next(f for f in report.files if f.url == file.url).downloaded == len(data) - 1000
    assert_all_resolve(task_set, hub, tmp_path / "cache")


def test_a_missing_file_fails_alone_without_retries(task_set, hub, tmp_path):
    gone = next(p for p in hub.files if p.endswith(".xlsx"))
    del hub.files[gone]
    report = run(task_set, settings(tmp_path, endpoint=hub.endpoint))

    (failed,) = report.failed
    assert failed.url == HUB + gone and "HTTP 404" in failed.error
    assert len(hub.gets(gone)) == 1  # a 404 is final
    assert report.count("fetched") == 6 and "1 failed" in report.summary()


def test_hf_endpoint_keeps_the_path():
    url = HUB + "/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/a/b/c.xlsx?download=1"
    assert fetch_url(url, None) == url
    assert (
        fetch_url(url, "https://hf-mirror.com/")
        == "https://hf-mirror.com/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/a/b/c.xlsx?download=1"
    )
    assert fetch_url(url, "http://10.1.2.3/hf").startswith("http://10.1.2.3/hf/datasets/")
    other = "https://example.org/huggingface.co/x.csv"
    assert fetch_url(other, "https://hf-mirror.com") == other


def test_task_lists_load_as_other_commands_take_them():
    from legato_pipelines.cli.osworld import _load_task_list

    assert len(_load_task_list(OSWORLD, None)) == 369  # a directory: its test_all.json
    small = _load_task_list(OSWORLD / "test_small.json", None)  # an index, tasks beside it
    assert len(small) == 39 and small.tasks[0].source.startswith(f"osworld:{OSWORLD}")


@pytest.mark.slow
def test_cli_size_mismatch_fails_that_file_and_lands_the_others(task_set, hub, tmp_path):
    liar = sorted(hub.files)[0]
    hub.lie = {liar: 100}
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(ENTRIES))
    cache = tmp_path / "cache"
    env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "PYTHONPATH": str(REPO_ROOT)}
    command = [sys.executable, "-m", "legato_pipelines", "osworld", "cache", str(tasks)]
    command += ["--osworld", str(OSWORLD), "--cache-dir", str(cache), "--attempts", "2", "-j", "2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == 1, done.stderr
    size = len(hub.files[liar])
    error = next(line for line in done.stderr.splitlines() if line.startswith("error:"))
    assert error.startswith(f"error: {HUB}{liar} from {hub.endpoint}{liar}: size mismatch")
    assert f"got {size} of {size + 100} bytes (Content-Length)" in error
    assert "(after 2 attempts)" in error and "needed by" in error
    assert len(hub.gets(liar)) == 2
    assert "6 fetched" in done.stdout and "1 failed of 7 file(s)" in done.stdout
    for task in task_set:
        for file in task_files(task):
            found = find_source(file.url, dest=file.dest, cache_dir=cache, task_id=task.task_id)
            assert (found is None) == (url_path(file.url) == liar)

    # the server fixed, the next run fetches only that file
    hub.lie = {}
    hub.log.clear()
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "1 fetched" in again.stdout and "6 already present, 0 failed" in again.stdout
    assert [r[1] for r in hub.gets()] == [liar]
    assert_all_resolve(task_set, hub, cache)


def test_a_shared_url_is_fetched_once_and_linked_to_every_name(hub, tmp_path):
    url = HUB + "/datasets/xlangai/ubuntu_osworld_file_cache/resolve/main/gimp/t/dog.png"
    hub.files[url_path(url)] = b"\x89PNG" + bytes(5000)

    def task(task_id: str) -> dict:
        config = {
            "instruction": "x",
            "config": [{"type": "download", "parameters": {"files": [{"url": url, "path": "/home/user/Desktop/dog.png"}]}}],
            "evaluator": {"func": "compare_images", "result": {"type": "vm_file", "path": "/a", "dest": "a"},
                          "expected": {"type": "cloud_file", "path": url, "dest": "dog_gold.png"}},
        }  # fmt: skip
        return {"task_id": task_id, "config": config}

    shared = load_tasks([task("t1"), task("t2")])
    report = run(shared, settings(tmp_path, endpoint=hub.endpoint))

    (result,) = report.files
    assert result.status == "fetched" and len(result.paths) == 4 and len(result.refs) == 4
    assert len(hub.gets()) == 1
    inodes = {Path(p).stat().st_ino for p in result.paths}
    assert len(inodes) == 1  # hard links of one file
    assert_all_resolve(shared, hub, tmp_path / "cache")
