"""Desktops on other hosts: one batch spread over desktop servers of two ``legato desktop
serve`` processes (two "hosts" on loopback) keeps the local contract (every attempt accounted
for), and a desktop or a whole host that disappears mid-batch has its attempts retried on the
others, with the loss (or the recovery) in the profile.

Real parts: Xvfb desktop servers started by the CLI, the scripted policy server, the engine.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from legato_pipelines import PolicyConfig, collect_async, export_steps, profile, read_records
from legato_pipelines.desktops import open_desktops
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.server.remote import desktop_name
from legato_pipelines.desktops.server.wire import DEFAULT_TOKEN_ENV
from legato_pipelines.errors import ConfigError, DesktopError
from legato_pipelines.resources import DesktopPoolResource
from legato_pipelines.rollout import statuses as st
from tests.desktop_local_support import needs_xvfb
from tests.scale_out_support import Host, Processes, free_port, pid_alive, tasks

pytestmark = [needs_xvfb, pytest.mark.desktop, pytest.mark.slow]  # real desktops: 5-15 s each


@pytest.fixture
def token(monkeypatch) -> str:
    value = secrets.token_urlsafe(16)
    monkeypatch.setenv(DEFAULT_TOKEN_ENV, value)
    return value


@pytest.fixture
def two_hosts(tmp_path, token):
    """Two stand-in hosts with two desktop servers each; every process stopped afterwards."""
    procs = Processes()
    try:
        hosts = [Host(procs, name, 2, token, tmp_path) for name in ("host-a", "host-b")]
        pids = {}
        for h in hosts:
            pids.update(h.wait_ready())
        yield hosts, pids
    finally:
        # SIGINT is the CLI's Ctrl-C: it stops its servers (their own sessions) on the way out
        for name, _ in procs.procs:
            procs.stop(name, signal.SIGINT, timeout=30)
        leftover = procs.alive()
        procs.stop_all()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids.values()):
            time.sleep(0.2)
        stray = [p for p in pids.values() if pid_alive(p)]
        for pid in stray:
            os.killpg(pid, signal.SIGKILL)
        assert not leftover and not stray, f"left running: {leftover} servers {stray}"


def policy(server, version: str) -> PolicyConfig:
    return PolicyConfig(base_url=server.url, model=server.model, version=version)


def assert_every_attempt_accounted_for(run_dir: Path, summary: dict, n_tasks: int, group: int):
    records = read_records(run_dir)
    final = Counter(
        (r["task_id"], r["attempt"]) for r in records if r["status"] in st.FINAL_FOR_TRAINING
    )
    assert summary["missing"] == 0
    assert summary["records"] == summary["scheduled"] + summary["retries"] == len(records)
    assert len(final) == n_tasks * group and set(final.values()) == {1}
    return records


async def test_one_batch_over_two_hosts_keeps_the_local_contract(
    two_hosts, policy_server, tmp_path
):
    hosts, _ = two_hosts
    urls = [u for h in hosts for u in h.urls]
    pool = DesktopPoolResource(backend="local", desktops=0, urls=urls)
    summary = await collect_async(
        tasks(8),
        policy(policy_server, "step-remote"),
        tmp_path / "run",
        desktops=pool.count(),
        desktop=pool.config(),
        group=2,
        max_steps=2,
    )
    records = assert_every_attempt_accounted_for(tmp_path / "run", summary, 8, 2)
    used = {r["desktop"] for r in records}
    assert used == {desktop_name(u) for u in urls}  # both hosts did work
    assert summary["desktops"] == {"used": 4, "env_failures": {}, "recovered": [], "lost": []}
    assert profile(tmp_path / "run")["desktops"] == summary["desktops"]

    # the same batch on desktops started here: the same contract, record for record
    here = await collect_async(
        tasks(8),
        policy(policy_server, "step-remote"),
        tmp_path / "run-here",
        desktops=2,
        desktop=DesktopConfig(backend="local", screen_width=640, screen_height=480),
        group=2,
        max_steps=2,
    )
    local_records = assert_every_attempt_accounted_for(tmp_path / "run-here", here, 8, 2)
    for key in ("scheduled", "missing", "groups", "counts"):
        assert summary[key] == here[key], key
    assert set(summary) == set(here)
    assert sorted(set(records[0])) == sorted(set(local_records[0]))
    logical = sorted((r["task_id"], r["attempt"], r["status"]) for r in records)
    assert logical == sorted((r["task_id"], r["attempt"], r["status"]) for r in local_records)
    remote_steps, local_steps = export_steps(tmp_path / "run"), export_steps(tmp_path / "run-here")
    assert (
        remote_steps.schema == local_steps.schema and remote_steps.num_rows == local_steps.num_rows
    )


async def test_a_host_that_disappears_has_its_attempts_retried_on_the_other(
    two_hosts, policy_server, tmp_path
):
    hosts, pids = two_hosts
    host_a, host_b = hosts
    urls = host_a.urls + host_b.urls
    config = DesktopConfig(
        backend="local", options={"urls": urls, "reconnect_s": 1.0}, screen_width=640
    )
    killed = []

    def on_record(record):
        if not killed and record["desktop"] in {desktop_name(u) for u in host_a.urls}:
            # the whole host goes away: its CLI and both desktop servers, mid-batch
            os.killpg(host_a.proc.pid, signal.SIGKILL)
            for url in host_a.urls:
                os.killpg(pids[url], signal.SIGKILL)
            killed.append(time.time())

    summary = await collect_async(
        tasks(10),
        policy(policy_server, "step-lost-host"),
        tmp_path / "run",
        desktops=4,
        desktop=config,
        group=2,
        max_steps=2,
        env_retries=2,
        on_record=on_record,
    )
    assert killed
    records = assert_every_attempt_accounted_for(tmp_path / "run", summary, 10, 2)
    lost = {desktop_name(u) for u in host_a.urls}
    health = summary["desktops"]
    assert set(health["lost"]) <= lost and health["lost"], health
    assert not set(health["env_failures"]) - lost
    assert summary["counts"][st.ERROR] == 0  # every failed execution was retried, and succeeded
    retried = [r for r in records if r["status"] == st.RETRIED]
    assert retried and all(r["desktop"] in lost for r in retried)
    after = [r for r in records if r["started_at"] > killed[0] + 0.5 and r["status"] != st.RETRIED]
    assert after and all(r["desktop"] not in lost for r in after)


async def test_a_desktop_server_restarted_by_serve_is_recovered(two_hosts, policy_server, tmp_path):
    hosts, pids = two_hosts
    victim = hosts[0].urls[0]
    config = DesktopConfig(backend="local", options={"urls": [victim]}, screen_width=640)
    killed = []

    def on_record(record):
        if not killed:
            os.killpg(pids[victim], signal.SIGKILL)  # `legato desktop serve` restarts it
            killed.append(record["rollout_id"])

    summary = await collect_async(
        tasks(3),
        policy(policy_server, "step-recovered"),
        tmp_path / "run",
        desktops=1,
        desktop=config,
        group=1,
        max_steps=1,
        env_retries=1,
        on_record=on_record,
    )
    assert_every_attempt_accounted_for(tmp_path / "run", summary, 3, 1)
    name = desktop_name(victim)
    assert summary["desktops"]["env_failures"] == {name: 1}
    assert summary["desktops"]["recovered"] == [name] and summary["desktops"]["lost"] == []


async def test_health_check_before_the_batch_leaves_out_dead_servers(two_hosts, token):
    hosts, _ = two_hosts
    dead = f"http://127.0.0.1:{free_port()}"
    config = DesktopConfig(backend="local", options={"urls": [dead, *hosts[1].urls]})
    pool = await open_desktops(config, 3)
    try:
        assert [d.name for d in pool] == [desktop_name(u) for u in hosts[1].urls]
    finally:
        for d in pool:
            await d.close()
    with pytest.raises(DesktopError, match="no desktop server answered"):
        await open_desktops(DesktopConfig(backend="local", options={"urls": [dead]}), 1)


async def test_pool_options_are_checked(monkeypatch, token):
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    with pytest.raises(ConfigError, match="lists 2 servers but 3"):
        await open_desktops(DesktopConfig(backend="local", options={"urls": urls}), 3)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        await open_desktops(DesktopConfig(backend="local", options={"urls": ["desk1"]}), 1)
    with pytest.raises(ConfigError, match="twice"):
        await open_desktops(DesktopConfig(backend="local", options={"urls": urls[:1] * 2}), 1)
    monkeypatch.delenv(DEFAULT_TOKEN_ENV)
    with pytest.raises(ConfigError, match=DEFAULT_TOKEN_ENV):
        await open_desktops(DesktopConfig(backend="local", options={"urls": urls}), 1)
    with pytest.raises(ConfigError, match="does not attach desktop servers by URL"):
        DesktopPoolResource(backend="fake", urls=urls).count()
    pool = DesktopPoolResource(backend="local", desktops=1, urls=urls)
    assert pool.count() == 3
    assert pool.config().options == {"urls": urls, "token_env": DEFAULT_TOKEN_ENV, "local": 1}


def test_a_host_whose_port_is_taken_before_it_binds_starts_again_on_new_ports(
    tmp_path, token, monkeypatch
):
    """The race of picking a free port and binding it later: another process takes the port in
    between. The desktop server says so and the host is started again on new ports."""
    import tests.scale_out_support as support

    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen(1)
    taken = squatter.getsockname()[1]
    picks = []
    real_free_ports = support.free_ports

    def taken_first(count: int = 1) -> int:
        picks.append(taken if not picks else real_free_ports(count))
        return picks[-1]

    monkeypatch.setattr(support, "free_ports", taken_first)
    procs = Processes()
    pids = {}
    try:
        host = Host(procs, "host-a", 2, token, tmp_path)
        pids = host.wait_ready()
        assert len(picks) == 2 and host.port_start == picks[1] != taken
        log = host.log.read_text()
        assert f"cannot listen on 127.0.0.1:{taken}: Address already in use" in log
        assert sorted(pids) == host.urls
        for url in host.urls:  # the desktops answer on the new ports, with our token
            with httpx.Client() as client:
                response = client.get(
                    f"{url}/legato/health", headers={"Authorization": f"Bearer {token}"}
                )
            assert response.status_code == 200 and response.json()["ok"], response.text
            assert response.json()["pid"] == pids[url]
        assert [n for n, _ in procs.procs] == ["host-a"]  # the failed start is forgotten
    finally:
        squatter.close()
        for name, _ in procs.procs:
            procs.stop(name, signal.SIGINT, timeout=30)
        procs.stop_all()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(pid_alive(p) for p in pids.values()):
            time.sleep(0.2)
    assert not procs.alive() and not [p for p in pids.values() if pid_alive(p)]
