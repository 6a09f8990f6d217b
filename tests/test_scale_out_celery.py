"""Scale-out proof on one machine: every "host" is a process on loopback.

Started here (each in its own process group, all stopped at the end): Postgres, Redis, an
S3-compatible object store (moto's server) holding the lake, a gRPC code server, the Dagster
daemon, two Celery workers (each with its own DAGSTER_HOME, working directory and lake cache,
standing in for worker hosts, each driving the desktops of "its" desktop host), and two
``legato desktop serve`` desktop hosts. The deployment is deploy/celery as shipped.

Asserted: two new checkpoints in the watched directory give two collection runs that succeed
concurrently on different workers; both versions' samples are in the one shared lake and in
DuckDB; no "database is locked"; every attempt accounted for although a desktop server was
killed mid-batch (the loss is in the profile); after one worker is stopped, the next version
runs on the other; every process started here is stopped.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

from legato_pipelines.desktops.server.remote import desktop_name
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.policy.synthetic import qwen_response
from legato_pipelines.store.lake import Lake
from tests.desktop_local_support import needs_xvfb
from tests.scale_out_support import (
    Host,
    Postgres,
    Processes,
    free_port,
    needs_postgres,
    needs_redis,
    pid_alive,
    tasks,
    wait_port,
)

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")
pytestmark = [needs_xvfb, needs_postgres, needs_redis, pytest.mark.slow, pytest.mark.desktop]

REPO = Path(__file__).resolve().parents[1]
CELERY = REPO / "deploy" / "celery"
TASK_ID_TAG = "dagster-celery/task_id"
RUN_TIMEOUT_S = 240
SENSOR_INTERVAL_S = 30  # checkpoint_sensor.minimum_interval_seconds
TERMINAL = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
SCRIPT = {
    "default": [
        qwen_response("Click the middle.", {"action": "left_click", "coordinate": [500, 500]}),
        qwen_response("Done.", {"action": "terminate", "status": "success"}),
    ]
}


def home(base: Path, name: str) -> Path:
    """A DAGSTER_HOME with deploy/celery/dagster.yaml, as on a real host."""
    path = base / name / "dagster_home"
    path.mkdir(parents=True)
    shutil.copy(CELERY / "dagster.yaml", path / "dagster.yaml")
    return path


def wait_log(path: Path, needle: str, timeout: float, proc) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    text = path.read_text(errors="replace")[-3000:] if path.exists() else ""
    raise AssertionError(f"{needle!r} not in {path.name} after {timeout:g} s:\n{text}")


def runs(instance: DagsterInstance) -> list:
    return list(instance.get_run_records(RunsFilter(job_name="collect_job")))


def wait_runs(instance: DagsterInstance, n: int, timeout: float, on_poll=None) -> list:
    """Block until ``n`` collect_job runs exist and all are terminal; return their records."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_poll is not None:
            on_poll()
        records = runs(instance)
        if len(records) >= n and all(r.dagster_run.status in TERMINAL for r in records):
            return records
        time.sleep(0.5)
    states = [
        (r.dagster_run.tags.get("dagster/partition"), r.dagster_run.status) for r in runs(instance)
    ]
    raise AssertionError(f"runs not finished after {timeout:g} s: {states}")


def worker_of(run, logs: dict[str, Path]) -> str:
    """The worker whose log received the run's Celery task."""
    task_id = run.tags[TASK_ID_TAG]
    found = [w for w, log in logs.items() if task_id in log.read_text(errors="replace")]
    assert len(found) == 1, f"task {task_id} in worker logs {found}"
    return found[0]


def script(name: str) -> str:
    """A console script installed beside this Python (``dagster-celery``, ``dagster-daemon``)."""
    path = Path(sys.executable).with_name(name)
    found = str(path) if path.exists() else shutil.which(name)
    assert found, f"{name} not installed (pip install -e '.[scale]')"
    return found


def test_two_versions_collect_concurrently_on_two_workers(tmp_path, monkeypatch):
    procs = Processes()
    pg = Postgres()
    policy = ScriptedPolicyServer(flavor="vllm", script=SCRIPT)
    server_pids: dict[str, int] = {}
    instance = None
    try:
        pg.start()
        pg.create_db("legato")
        _, redis_port = procs.start_listening(
            "redis",
            lambda port: ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save",
                          "", "--appendonly", "no"],
            log=tmp_path / "logs" / "redis.log",
            ready="Ready to accept connections",
        )  # fmt: skip
        policy.start()

        token = secrets.token_urlsafe(16)
        desk = [Host(procs, n, 2, token, tmp_path / "logs") for n in ("desk-a", "desk-b")]
        for h in desk:
            server_pids.update(h.wait_ready())

        _, s3_port = procs.start_listening(
            "s3",
            lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            log=tmp_path / "logs" / "s3.log",
            ready="Running on http://127.0.0.1:",
        )
        aws = {
            "AWS_ACCESS_KEY_ID": "legato-test",
            "AWS_SECRET_ACCESS_KEY": "legato-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
            "LEGATO_LAKE_CACHE": str(tmp_path / "observer" / "lake-cache"),
        }
        for k, v in aws.items():
            monkeypatch.setenv(k, v)
        fsspec.filesystem("s3", skip_instance_cache=True).mkdir("legato-lake")
        lake = "s3://legato-lake/lake"
        checkpoints = tmp_path / "shared" / "checkpoints"
        checkpoints.mkdir(parents=True)
        task_file = tmp_path / "shared" / "tasks.json"
        task_file.write_text(json.dumps(tasks(3)))
        code_port = free_port()
        common = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("LEGATO_", "DAGSTER_"))},
            **pg.env("legato"),
            "LEGATO_CELERY_BROKER": f"redis://127.0.0.1:{redis_port}/0",
            "LEGATO_CELERY_BACKEND": f"redis://127.0.0.1:{redis_port}/1",
            "LEGATO_CODE_SERVER_HOST": "127.0.0.1",
            "LEGATO_CODE_SERVER_PORT": str(code_port),
            "LEGATO_POLICY_URL": policy.url,
            "LEGATO_POLICY_MODEL": policy.model,
            "LEGATO_BACKEND": "local",
            "LEGATO_DESKTOPS": "0",
            "LEGATO_DESKTOP_TOKEN": token,
            "LEGATO_LAKE": lake,
            **aws,
            "LEGATO_CHECKPOINTS": str(checkpoints),
            "LEGATO_TASKS": str(task_file),
        }
        control = home(tmp_path, "control")
        control_env = {**common, "DAGSTER_HOME": str(control)}
        # one process creates the Postgres schema before the others start: their first
        # connections would race on CREATE TYPE / TABLE ("type runs already exists")
        subprocess.run(
            [script("dagster"), "instance", "migrate"],
            env=control_env, cwd=control.parent, check=True, capture_output=True, timeout=180,
        )  # fmt: skip
        logs = tmp_path / "logs"
        code = procs.start(
            "code-server",
            [sys.executable, "-m", "dagster", "code-server", "start", "-h", "127.0.0.1",
             "-p", str(code_port), "-m", "legato_pipelines.definitions"],
            log=logs / "code-server.log", env=control_env, cwd=control.parent,
        )  # fmt: skip
        workers = {}
        for name, host in (("w1", desk[0]), ("w2", desk[1])):
            wh = home(tmp_path, name)
            env = {
                **common,
                "DAGSTER_HOME": str(wh),
                "LEGATO_DESKTOP_URLS": " ".join(host.urls),
                "LEGATO_LAKE_CACHE": str(wh.parent / "lake-cache"),  # this host's local disk
            }
            workers[name] = procs.start(
                name,
                [script("dagster-celery"), "worker", "start",
                 "-A", "dagster_celery.app", "-y", str(CELERY / "celery.yaml"), "-n", name,
                 "--", "--concurrency=1", "--max-tasks-per-child=1"],
                log=logs / f"{name}.log", env=env, cwd=wh.parent,
            )  # fmt: skip
        wait_port(code_port, 90, code)
        daemon = procs.start(
            "daemon",
            [script("dagster-daemon"), "run", "-w", str(CELERY / "workspace.yaml")],
            log=logs / "daemon.log", env=control_env, cwd=control.parent,
        )  # fmt: skip
        for name, proc in workers.items():
            wait_log(logs / f"{name}.log", "ready.", 90, proc)

        # two new checkpoints, then the sensor (stopped by default) is switched on; finished
        # a while ago, so they count at once (the sensor waits a tick for fresh folders)
        for version in ("step-1", "step-2"):
            (checkpoints / version).mkdir()
            os.utime(checkpoints / version, (time.time() - 120, time.time() - 120))
        started = procs.start(
            "sensor-start",
            [sys.executable, "-m", "dagster", "sensor", "start", "checkpoint_sensor",
             "-w", str(CELERY / "workspace.yaml")],
            log=logs / "sensor-start.log", env=control_env,
        )  # fmt: skip
        assert started.wait(120) == 0, (logs / "sensor-start.log").read_text()[-2000:]

        test_home = home(tmp_path, "observer")
        for k in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD",
                  "DAGSTER_PG_DB", "LEGATO_CELERY_BROKER", "LEGATO_CELERY_BACKEND"):  # fmt: skip
            monkeypatch.setenv(k, common[k])
        instance = DagsterInstance.from_config(str(test_home))

        # kill one of desk-a's two servers once its run has recorded an attempt there
        victim = desk[0].urls[0]
        killed: list[float] = []

        def kill_mid_batch():
            if killed:
                return
            for f in tmp_path.glob("w*/lake-cache/*/runs/*/rollouts.jsonl"):
                if desktop_name(victim) in f.read_text(errors="replace"):
                    os.killpg(server_pids[victim], signal.SIGKILL)
                    killed.append(time.time())
                    return

        first = wait_runs(instance, 2, RUN_TIMEOUT_S, on_poll=kill_mid_batch)
        assert killed, "the desktop server was never killed mid-batch"
        assert daemon.poll() is None
        by_version = {r.dagster_run.tags["dagster/partition"]: r for r in first}
        assert set(by_version) == {"step-1", "step-2"}
        assert all(r.dagster_run.status == DagsterRunStatus.SUCCESS for r in first), [
            (v, r.dagster_run.status) for v, r in by_version.items()
        ]
        worker_logs = {n: logs / f"{n}.log" for n in workers}
        placed = {v: worker_of(r.dagster_run, worker_logs) for v, r in by_version.items()}
        assert sorted(placed.values()) == ["w1", "w2"], placed
        a, b = first
        assert a.start_time < b.end_time and b.start_time < a.end_time  # they overlapped

        # one worker goes away between runs: the next version runs on the other
        procs.stop("w1", signal.SIGKILL)  # the host dies: no warm shutdown
        (checkpoints / "step-3").mkdir()
        os.utime(checkpoints / "step-3", (time.time() - 120, time.time() - 120))
        third = wait_runs(instance, 3, RUN_TIMEOUT_S + SENSOR_INTERVAL_S)
        (run3,) = [r for r in third if r.dagster_run.tags["dagster/partition"] == "step-3"]
        assert run3.dagster_run.status == DagsterRunStatus.SUCCESS
        assert worker_of(run3.dagster_run, worker_logs) == "w2"

        # one lake: every version's samples, in Parquet and through DuckDB, read by another host
        store = Lake(lake)
        assert store.remote and not store.duckdb_path.exists()
        assert store.versions("samples") == ["step-1", "step-2", "step-3"]
        rows = store.query("SELECT policy_version, count(*) AS n FROM samples GROUP BY 1")
        counts = {r["policy_version"]: r["n"] for r in rows.to_pylist()}
        assert set(counts) == {"step-1", "step-2", "step-3"} and min(counts.values()) > 0
        # nothing lost: every attempt of every version accounted for; the loss is recorded
        killed_name = desktop_name(victim)
        for version in ("step-1", "step-2", "step-3"):
            summary = json.loads(store.fs.cat(f"{store.run_location(version)}/summary.json"))
            assert summary["missing"] == 0 and summary["counts"]["error"] == 0, summary["counts"]
            assert summary["records"] == summary["scheduled"] + summary["retries"]
        host_a_version = next(v for v, w in placed.items() if w == "w1")
        health = json.loads(store.fs.cat(f"{store.run_location(host_a_version)}/summary.json"))[
            "desktops"
        ]
        assert health["env_failures"].get(killed_name, 0) >= 1, health
        assert killed_name in health["recovered"] + health["lost"]
        for log in logs.glob("*.log"):
            text = log.read_text(errors="replace")
            assert "database is locked" not in text, log.name
    finally:
        if instance is not None:
            instance.dispose()
        for name, _ in list(procs.procs):
            if name.startswith("desk-"):
                procs.stop(name, signal.SIGINT, timeout=30)  # the CLI stops its servers
        needed_kill = procs.stop_all()
        policy.stop()
        pg.stop()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(pid_alive(p) for p in server_pids.values()):
            time.sleep(0.2)
        stray = [p for p in server_pids.values() if pid_alive(p)]
        for pid in stray:
            os.killpg(pid, signal.SIGKILL)
    assert not procs.alive() and not stray and not pg.running()
    assert not needed_kill, f"needed SIGKILL: {needed_kill}"
