"""Live websites in the local verdict (issue 34): a task that opens live sites runs on local
desktops whose network has a route out (the network setting plus the preflight's reachability
check, a real TCP connection), is refused without one, and OSWorld's ``proxy: true`` tasks need
an upstream proxy (desktop option ``proxy``) besides."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from legato_pipelines.cli import app
from legato_pipelines.desktops import web
from legato_pipelines.desktops.support import backend_support
from legato_pipelines.errors import ConfigError
from legato_pipelines.osworld_format import classify_task
from legato_pipelines.osworld_format.verdict import preflight
from legato_pipelines.tasks import Task
from tests.osworld_data import OSWORLD

#: chrome 7b6c7e24: Amazon's cookies; opens amazon.com, OSWorld runs it through a proxy
AMAZON = ("chrome", "7b6c7e24-c58a-49fc-a5bb-d57b80e5b4c3")


def _task(domain: str, task_id: str, **change) -> Task:
    config = json.loads((OSWORLD / domain / f"{task_id}.json").read_text())
    config.update(change)
    return Task(task_id=task_id, domain=domain, config=config, source="test")


@pytest.fixture
def listening():
    """A TCP port on this host's loopback that accepts connections: the probe's target."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture
def closed_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return f"127.0.0.1:{port}"


def _local(options: dict):
    web.reachable.cache_clear()
    support = backend_support("local", {"cache_dir": "", **options})
    return support, preflight([_task(*AMAZON, proxy=False)], "local", support=support)


def test_a_live_site_task_runs_with_a_route_out_and_is_refused_without_one(listening, closed_port):
    # the host network reaches this host's loopback, where the probe answers: a route out
    support, problems = _local({"network": "host", "web_probe": listening})
    assert support.local_route_out, support.local_route_why
    assert problems == []
    # network=none: no route out, whatever the host reaches
    support, problems = _local({"network": "none", "web_probe": listening})
    assert not support.local_route_out
    (problem,) = [p for p in problems if "needs the internet" in p]  # and Chrome's port
    assert "https://www.amazon.com" in problem and "no route out (network=none" in problem
    assert "fix: desktop option network=own" in problem
    # a route the reachability check does not find
    support, problems = _local({"network": "host", "web_probe": closed_port})
    (problem,) = problems
    assert f"found no way to {closed_port}" in problem
    # own desktops do not reach this host's loopback: a probe there proves nothing for them
    support, problems = _local({"network": "own", "web_probe": listening})
    assert not support.local_route_out and "loopback" in support.local_route_why


def test_a_proxy_task_needs_the_proxy_setting_on_a_route_out(listening, monkeypatch):
    monkeypatch.delenv(web.PROXY_ENV, raising=False)
    task = _task(*AMAZON)  # proxy: true, as in OSWorld
    web.reachable.cache_clear()
    support = backend_support("local", {"cache_dir": "", "network": "host", "web_probe": listening})
    (problem,) = preflight([task], "local", support=support)
    assert "'proxy': true" in problem and "no proxy is set" in problem
    assert "proxy=http://HOST:PORT" in problem
    assert classify_task(task, backend_support=support).local_blockers == ["needs a proxy"]
    # the proxy from the environment; the reachability check connects to it
    monkeypatch.setenv(web.PROXY_ENV, f"http://{listening}")
    web.reachable.cache_clear()
    support = backend_support("local", {"cache_dir": "", "network": "host"})
    assert support.local_proxy and support.local_route_out
    assert preflight([task], "local", support=support) == []
    # a proxy on this host's loopback is no way out for network=own desktops
    support = backend_support("local", {"cache_dir": "", "network": "own"})
    (problem,) = preflight([task], "local", support=support)
    assert f"the proxy {listening} is on this host's loopback" in problem


def test_google_account_tasks_stay_refused_with_a_route_out(listening):
    task = Task(
        task_id="drive",
        domain="multi_apps",
        config={
            "instruction": "x",
            "config": [{"type": "googledrive", "parameters": {"settings_file": "s.json"}}],
            "evaluator": {"func": "infeasible"},
        },
        source="inline",
    )
    web.reachable.cache_clear()
    support = backend_support("local", {"cache_dir": "", "network": "host", "web_probe": listening})
    problems = classify_task(task, backend_support=support).problems["local"]
    assert any("needs a Google account" in p for p in problems), problems
    assert not any("no route out" in p for p in problems)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("http://user:s3cret@10.0.0.5:3128", "holds credentials"),
        ("ftp://10.0.0.5:21", "SCHEME://HOST:PORT"),
        ("http://10.0.0.5", "SCHEME://HOST:PORT"),
        ("http://10.0.0.5:3128/path", "no path"),
        # no scheme: the credentials or a query's token must not be echoed either
        ("user:s3cret@10.0.0.5:3128", "holds credentials"),
        ("10.0.0.5:3128/?token=s3cret", "SCHEME://HOST:PORT"),
        ("http://10.0.0.5:3128/?token=s3cret", "no path"),
        ("http://[::1/s3cret", "not a valid URL"),
    ],
)
def test_a_bad_proxy_is_refused_by_name_and_never_echoes_a_password(value, needle):
    with pytest.raises(ConfigError) as caught:
        backend_support("local", {"proxy": value})
    assert "'proxy'" in str(caught.value) and needle in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_replay_accepts_a_recorded_task_with_no_route_out(tmp_path):
    task = _task(*AMAZON)  # live sites and proxy: true, both served by a recording
    archive = tmp_path / "archive"
    archive.mkdir()
    support = backend_support("local", {"cache_dir": "", "web": f"replay:{archive}"})
    assert not support.local_route_out and support.local_web_archive == archive.resolve()
    (problem,) = [p for p in preflight([task], "local", support=support) if "archive" in p]
    assert f"holds no recording of it ({task.task_id}.flows)" in problem
    assert "legato web record" in problem
    (archive / f"{task.task_id}.flows").write_bytes(b"")  # what `legato web record` writes
    support = backend_support("local", {"cache_dir": "", "web": f"replay:{archive}"})
    assert preflight([task], "local", support=support) == []
    # a download by a command's own client (curl) is no browser traffic: it needs a route out
    curl = Task(
        task_id=task.task_id,
        domain="os",
        config={
            "instruction": "x",
            "config": [
                {"type": "execute", "parameters": {"command": "curl -O https://example.org/f"}}
            ],
            "evaluator": {"func": "infeasible"},
        },
        source="inline",
    )
    (problem,) = preflight([curl], "local", support=support)
    assert "https://example.org/f" in problem and "no route out" in problem


def test_collect_web_flag_reaches_the_preflight(tmp_path):
    """``legato collect --web replay:ARCHIVE`` refuses an unrecorded task before any desktop
    or policy request."""
    task_id = AMAZON[1]
    config = json.loads((OSWORLD / AMAZON[0] / f"{task_id}.json").read_text())
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"task_id": task_id, "domain": "chrome", "config": config}]))
    argv = ["collect", "--tasks", str(tasks), "--policy-url", "http://127.0.0.1:9", "--model", "m"]
    argv += [
        "--out",
        str(tmp_path / "out"),
        "--backend",
        "local",
        "--desktop-option",
        'cache_dir=""',
    ]
    missing = CliRunner().invoke(app, [*argv, "--web", f"replay:{tmp_path / 'archive'}"])
    assert missing.exit_code == 2  # no such folder: said so, not "no recording" per task
    assert "is not a folder" in missing.output and "legato web record" in missing.output
    assert not (tmp_path / "out").exists()
    (tmp_path / "archive").mkdir()
    out = CliRunner().invoke(app, [*argv, "--web", f"replay:{tmp_path / 'archive'}"])
    assert out.exit_code == 2
    assert f"holds no recording of it ({task_id}.flows)" in " ".join(out.output.split())


def test_tasks_check_says_whether_the_desktops_have_a_route_out(tmp_path, listening, closed_port):
    task_id = AMAZON[1]
    config = json.loads((OSWORLD / AMAZON[0] / f"{task_id}.json").read_text())
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"task_id": task_id, "domain": "chrome", "config": config}]))
    web.reachable.cache_clear()
    argv = ["tasks", "check", str(tasks), "--backend", "local", "--json"]
    argv += ["--desktop-option", "network=host", "--desktop-option", f"web_probe={listening}"]
    out = CliRunner().invoke(app, [*argv, "--desktop-option", f"proxy=http://{closed_port}"])
    local = json.loads(out.stdout)["local_desktops"]
    # the proxy is what the check connects to, and nothing listens there
    assert local["proxy"] is True and local["route_out"] is False
    assert f"does not reach the proxy {closed_port}" in local["route_out_why_not"]
    out = CliRunner().invoke(app, argv)
    local = json.loads(out.stdout)["local_desktops"]
    assert (local["route_out"], local["route_out_why_not"], local["proxy"]) == (True, None, False)


def test_the_check_on_port_443_wants_a_verified_tls_handshake():
    """A network that accepts every TCP connection (a transparent firewall) is no route out:
    on port 443 the check also verifies the site's certificate."""
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 443))
    except OSError:
        pytest.skip("port 443 of the loopback is taken")
    sock.listen(8)
    try:
        web.reachable.cache_clear()
        assert web._connects("127.0.0.1", 443) is False  # TCP accepted, no TLS
        support = backend_support("local", {"network": "host", "web_probe": "127.0.0.1:443"})
        assert not support.local_route_out
    finally:
        sock.close()
