"""Live and recorded websites through ``collect`` on real local desktops (issue 34).

A stand-in shop (``tests/web_standin.py``: HTTPS on this host's loopback, its certificate
from a local CA, its name mapped by desktop option ``web_hosts``) is opened by a chrome task
(``chrome_open_tabs``) and graded by OSWorld's own getter ``page_info`` (Playwright over CDP:
the page's title as Chromium loads it). The task:

- runs live on desktops with a route out (``network=host`` reaches the loopback stand-in) and
  scores 1; the same task with no route out (``network=none``) is refused by the preflight;
- is recorded into an archive (``web=record:ARCHIVE``: mitmproxy between Chromium and the
  site) and then, the stand-in stopped, replayed from it (``web=replay:ARCHIVE``, on a
  network of its own that does not reach the host's loopback at all) with the same grade;
- every replay notes the request the archive cannot hold (the page fetches ``/fresh?<random>``)
  as a fact of the attempt (``eval_notes``), counted by the profile.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import orjson
import pytest
from typer.testing import CliRunner

from legato_pipelines import DesktopConfig, PolicyConfig, collect, read_records
from legato_pipelines.cli import app
from legato_pipelines.desktops.server import chrome
from legato_pipelines.desktops.server.recorder import mitmdump, web_recorder
from legato_pipelines.errors import TaskListError
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.policy.synthetic import qwen_response
from legato_pipelines.rollout.profile import profile
from legato_pipelines.tasks import load_tasks
from tests.desktop_local_support import needs_xvfb
from tests.osworld_backend_support import needs_vm_python
from tests.web_standin import NAME, TITLE, make_ca, serve_standin

pytestmark = [
    needs_xvfb,
    needs_vm_python,
    pytest.mark.desktop,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="sandboxes need root (uid maps)"),
    pytest.mark.skipif(not chrome.available(), reason="needs chromium (apt-get install chromium)"),
    pytest.mark.skipif(shutil.which("socat") is None, reason="needs socat (apt-get install socat)"),
    pytest.mark.skipif(shutil.which("certutil") is None, reason="needs libnss3-tools"),
    pytest.mark.skipif(
        mitmdump() is None or web_recorder() is None,
        reason="needs the web venv (scripts/web_venv.sh)",
    ),
]
TASK_ID = "standin-shop"
INSTRUCTION = "Look at the stand-in shop."


def _task_list(folder):
    config = {
        "id": TASK_ID,
        "instruction": INSTRUCTION,
        "config": [
            {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
            {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}},
            {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [f"https://{NAME}/page"]}},
        ],
        "evaluator": {
            "func": "check_direct_json_object",
            "result": {"type": "page_info", "url": f"https://{NAME}/page"},
            "expected": {"type": "rule", "rules": {"expected": {"title": TITLE}}},
        },
    }  # fmt: skip
    path = folder / "tasks.json"
    path.write_bytes(orjson.dumps([{"task_id": TASK_ID, "domain": "chrome", "config": config}]))
    return load_tasks(path)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("web")
    ca, cert, key = make_ca(folder / "ca")
    with serve_standin(cert, key) as standin:
        yield folder, ca, standin


def _collect(tasks, out, options: dict) -> dict:
    script = {
        "tasks": {
            INSTRUCTION: [qwen_response("Done.", {"action": "terminate", "status": "success"})]
        }
    }
    (out.parent / f"{out.name}-script.json").write_bytes(orjson.dumps(script))
    desktop = DesktopConfig(backend="local", options={"cache_dir": "", **options})
    with ScriptedPolicyServer(script=out.parent / f"{out.name}-script.json") as server:
        policy = PolicyConfig(base_url=server.url, model=server.model, version="v1")
        collect(tasks, policy, out, desktops=1, desktop=desktop, group=1, max_steps=2)
    return _settled(out)


def _settled(out) -> dict:
    """The attempt's settling record (a desktop failure on a loaded machine is retried: the
    ``retried`` record says why)."""
    records = read_records(out)
    settled = [r for r in records if r["status"] != "retried"]
    assert len(settled) == 1, [(r["status"], r.get("error")) for r in records]
    return settled[0]


def test_live_with_a_route_out_recorded_then_replayed_without_the_site(site, tmp_path):
    folder, ca, standin = site
    tasks = _task_list(tmp_path)
    mapped = {"web_hosts": {NAME: f"127.0.0.1:{standin.port}"}, "web_ca": [str(ca)]}
    routed = {"network": "host", "web_probe": f"127.0.0.1:{standin.port}", **mapped}
    # no route out: refused before any desktop starts
    with pytest.raises(TaskListError, match="no route out"):
        _collect(tasks, tmp_path / "none", {"network": "none", **mapped})
    # live, with a route out: Chromium reaches the stand-in itself
    live = _collect(tasks, tmp_path / "live", routed)
    assert (live["status"], live["reward"], live.get("eval_error")) == ("ok", 1.0, None), live.get(
        "error"
    )
    served = len(standin.requests)
    assert any(r.startswith("/page") for r in standin.requests)
    # recorded by `legato web record` (the default policy terminates at once): every
    # exchange through mitmproxy into the archive
    archive = tmp_path / "archive"
    flags = [
        f"--desktop-option={k}={json.dumps(v)}" for k, v in {"cache_dir": "", **routed}.items()
    ]
    result = CliRunner().invoke(
        app,
        ["web", "record", str(tmp_path / "tasks.json"), "--archive", str(archive), *flags],
    )
    assert result.exit_code == 0, result.output
    assert "recorded 1 of 1 task(s)" in " ".join(result.output.split())
    recorded = _settled(archive / "run")
    assert (recorded["status"], recorded["reward"]) == ("ok", 1.0), recorded
    assert len(standin.requests) > served  # the recorder fetched from the site
    assert (archive / f"{TASK_ID}.flows").stat().st_size > 0
    # replayed with the site stopped, on a network that reaches nothing of this host
    standin.stop()
    after = len(standin.requests)
    replay = {"web": f"replay:{archive}", **mapped}
    replayed = _collect(tasks, tmp_path / "replay", replay)
    assert (replayed["status"], replayed["reward"], replayed.get("eval_error")) == (
        "ok",
        1.0,
        None,
    ), replayed
    assert len(standin.requests) == after
    (note,) = [n for n in replayed["eval_notes"] if n.startswith("web_replay_missing: ")]
    # the page's /fresh?<random> (Chromium's own background requests, unrecorded, add theirs)
    assert int(re.search(rf"by host: .*\b{re.escape(NAME)} (\d+)", note)[1]) >= 1, note
    summary = profile(tmp_path / "replay")
    assert summary["web_replay_missing"]["attempts"] == 1
    assert summary["web_replay_missing"]["requests"] >= 1
    shown = CliRunner().invoke(app, ["profile", str(tmp_path / "replay")], terminal_width=200)
    assert "web requests not in the archive" in shown.output
