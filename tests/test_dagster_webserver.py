"""The UI for real: ``dagster-webserver`` and ``dagster-daemon`` on loopback against
``workspace.yaml``, partitioned runs of ``collect_job`` launched through GraphQL (fake
desktops, the scripted policy server), and the asset page loaded in headless Chromium.

Two partitions are launched at once with the collection pool set to one slot: their
``rollout_batch`` steps must not overlap (the pool works), while their lake steps write the
lake and rebuild ``legato.duckdb`` at the same time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import dagster as dg
import httpx
import pytest

from legato_pipelines import export_steps
from legato_pipelines.assets import COLLECTION_POOL
from legato_pipelines.store.lake import Lake
from tests.engine_support import fake_tasks

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
LOCATION = {"repositoryLocationName": "legato_pipelines", "repositoryName": "__repository__"}
CHROMIUM = shutil.which("chromium")

ADD_PARTITION = """
mutation($repo: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $repo, partitionsDefName: $name, partitionKey: $key) {
    __typename
    ... on AddDynamicPartitionSuccess { partitionKey }
    ... on PythonError { message }
    ... on UnauthorizedError { message }
  }
}"""
LAUNCH_RUN = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}"""
RUN_STATUS = """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } } }"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(command: list[str], env: dict, log: Path) -> subprocess.Popen:
    # Own session: a background webserver ignores SIGINT/SIGTERM otherwise; we stop its group.
    return subprocess.Popen(
        command,
        env=env,
        cwd=log.parent,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def _gql(url: str, query: str, variables: dict) -> dict:
    response = httpx.post(
        f"{url}/graphql", json={"query": query, "variables": variables}, timeout=60
    )
    response.raise_for_status()
    body = response.json()
    assert "errors" not in body, body
    return body["data"]


def _dump_dom(url: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--window-size=1400,2000", "--virtual-time-budget=15000",
                "--dump-dom", url,
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_ui_launches_partitioned_runs_and_shows_the_materialization(tmp_path, policy_server):
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    (home / ".nux").mkdir()
    (home / ".nux" / "nux.yaml").write_text("seen: 1\n")  # no first-visit dialog over the page
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.get_runs()  # create the SQLite schema once, before two processes race to
        instance.event_log_storage.set_concurrency_slots(COLLECTION_POOL, 1)
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps(fake_tasks(3)))
    lake_root = tmp_path / "lake"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LEGATO_")},
        "DAGSTER_HOME": str(home),
        "LEGATO_POLICY_URL": policy_server.url,
        "LEGATO_POLICY_MODEL": policy_server.model,
        "LEGATO_TASKS": str(tasks),
        "LEGATO_LAKE": str(lake_root),
    }
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    workspace = str(REPO / "workspace.yaml")
    web = _start(
        ["dagster-webserver", "-h", "127.0.0.1", "-p", str(port), "-w", workspace],
        env,
        tmp_path / "web.log",
    )
    daemon = None
    try:
        deadline = time.monotonic() + 120
        while True:
            assert web.poll() is None, (tmp_path / "web.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "webserver did not come up"
            time.sleep(0.5)
        daemon = _start(["dagster-daemon", "run", "-w", workspace], env, tmp_path / "daemon.log")

        versions = ["step-1", "step-2"]
        run_ids = {}
        for version in versions:
            added = _gql(
                url, ADD_PARTITION, {"repo": LOCATION, "name": "policy_version", "key": version}
            )
            assert added["addDynamicPartition"] == {
                "__typename": "AddDynamicPartitionSuccess",
                "partitionKey": version,
            }
        for version in versions:
            params = {
                "selector": {**LOCATION, "jobName": "collect_job"},
                "runConfigData": {
                    "ops": {"rollout_batch": {"config": {"group": 2, "max_steps": 3}}}
                },
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": version}]},
            }
            launched = _gql(url, LAUNCH_RUN, {"params": params})["launchRun"]
            assert launched["__typename"] == "LaunchRunSuccess", launched
            run_ids[version] = launched["run"]["runId"]

        deadline = time.monotonic() + 300
        status = {}
        while time.monotonic() < deadline:
            status = {
                v: _gql(url, RUN_STATUS, {"id": r})["runOrError"]["status"]
                for v, r in run_ids.items()
            }
            if all(s in ("SUCCESS", "FAILURE", "CANCELED") for s in status.values()):
                break
            time.sleep(1)
        assert status == dict.fromkeys(versions, "SUCCESS"), (tmp_path / "daemon.log").read_text()[
            -3000:
        ]

        with dg.DagsterInstance.from_config(str(home)) as instance:
            spans = []
            for run_id in run_ids.values():
                events = instance.all_logs(
                    run_id,
                    of_type={dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS},
                )
                times = [e.timestamp for e in events if e.step_key == "rollout_batch"]
                assert len(times) == 2
                spans.append(sorted(times))
        first, second = sorted(spans)
        assert second[0] >= first[1], f"collections overlapped despite a pool of 1: {spans}"

        lake = Lake(lake_root)
        for version in versions:
            n = (
                lake.query("SELECT count(*) AS n FROM samples WHERE policy_version = ?", [version])
                .column("n")[0]
                .as_py()
            )
            assert n == export_steps(lake.run_dir(version)).num_rows

        assert CHROMIUM is not None
        dom = _dump_dom(f"{url}/assets/profile_summary?view=events&partition=step-1")
        assert "materialized in run" in dom and run_ids["step-1"][:8] in dom
        for label in (
            "success_rate",
            "rollouts_per_hour",
            "time_share_chart",
            "success_by_task_chart",
            "dagster/row_count",
        ):
            assert label in dom, label
        assert str(lake.partition_file("profile", "step-1")) in dom
        dom = _dump_dom(f"{url}/assets/rollout_batch?view=events&partition=step-2")
        for label in ("run_dir", "task_set", "knobs", "success_rate", str(lake.run_dir("step-2"))):
            assert label in dom, label
    finally:
        if daemon is not None:
            _stop(daemon)
        _stop(web)
