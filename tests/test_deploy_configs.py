"""Every deployment under deploy/ loads: its Dagster instance against a real Postgres on
loopback (storage, queue, run launcher built), its workspace and worker config validate, the
code location loads under it, and a typo in any of them fails.

Docker and Kubernetes cannot run here (no engine, no cluster): their instances are built (the
launchers are constructed, docs/deployment.md §3) and the compose file and Helm values
are checked against the instance they must agree with.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.workspace.config_schema import ensure_workspace_config

from tests.scale_out_support import Postgres, needs_postgres

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
DEPLOYMENTS = ("celery", "k8s", "docker")
LAUNCHERS = {
    "celery": "CeleryRunLauncher",
    "k8s": "K8sRunLauncher",
    "docker": "DockerRunLauncher",
}
CODE_MODULE = "legato_pipelines.definitions"
BROKER_ENV = {
    "LEGATO_CELERY_BROKER": "redis://127.0.0.1:6379/0",
    "LEGATO_CELERY_BACKEND": "redis://127.0.0.1:6379/1",
}
# Top-level keys of the official chart's values (helm/dagster/schema/.../values.py, 1.13).
CHART_KEYS = {
    "dagsterWebserver", "dagster-user-deployments", "postgresql",
    "generatePostgresqlPasswordSecret", "generateCeleryConfigSecret", "rabbitmq", "redis",
    "flower", "ingress", "imagePullSecrets", "computeLogManager", "scheduler", "runLauncher",
    "pythonLogs", "dagsterDaemon", "busybox", "migrate", "telemetry", "serviceAccount",
    "global", "retention", "concurrency", "additionalInstanceConfig",
}  # fmt: skip
DUMMY_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: dummy}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def postgres():
    if os.environ.get("LEGATO_SKIP_POSTGRES"):
        pytest.skip("LEGATO_SKIP_POSTGRES set")
    pg = Postgres().start()
    for name in DEPLOYMENTS:
        pg.create_db(f"legato_{name}")
    yield pg
    pg.stop()


def instance_home(tmp_path: Path, name: str, config: dict | None = None) -> Path:
    """A DAGSTER_HOME holding deploy/<name>/dagster.yaml (or ``config``). Kubernetes: outside a
    cluster the launcher must read a kubeconfig instead (the only change,
    docs/deployment.md §3)."""
    home = tmp_path / f"home-{name}"
    home.mkdir()
    config = copy.deepcopy(config if config is not None else load(DEPLOY / name / "dagster.yaml"))
    if name == "k8s":
        launcher = config["run_launcher"]["config"]
        assert launcher["load_incluster_config"] is True  # the shipped value, for the cluster
        (home / "kubeconfig").write_text(DUMMY_KUBECONFIG)
        launcher.update(load_incluster_config=False, kubeconfig_file=str(home / "kubeconfig"))
    (home / "dagster.yaml").write_text(yaml.safe_dump(config))
    return home


@pytest.fixture
def deploy_env(monkeypatch, postgres):
    def apply(name: str) -> dict[str, str]:
        env = {**postgres.env(f"legato_{name}"), **BROKER_ENV}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        return env

    return apply


@pytest.mark.slow
@needs_postgres
@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_each_instance_loads_with_postgres_queue_and_its_launcher(tmp_path, deploy_env, name):
    deploy_env(name)
    instance = DagsterInstance.from_config(str(instance_home(tmp_path, name)))
    try:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        assert type(instance.run_launcher).__name__ == LAUNCHERS[name]
        assert instance.get_run_records() == []  # the schema was created and answers
        limits = load(DEPLOY / name / "dagster.yaml")["concurrency"]
        assert limits["runs"]["max_concurrent_runs"] >= 2  # several versions collect at once
    finally:
        instance.dispose()


@needs_postgres
@pytest.mark.parametrize(
    "name, path",
    [
        ("celery", ("run_launcher", "config", "broker")),
        ("k8s", ("run_launcher", "config", "job_namespace")),
        ("docker", ("run_launcher", "config", "network")),
        ("celery", ("storage", "postgres", "postgres_db", "db_name")),
        ("docker", ("concurrency", "runs", "max_concurrent_runs")),
    ],
)
def test_a_typo_in_a_deployment_fails(tmp_path, deploy_env, name, path):
    deploy_env(name)
    config = load(DEPLOY / name / "dagster.yaml")
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1][:-2] + path[-1][-1] + path[-1][-2]] = node.pop(path[-1])  # swap last 2 letters
    with pytest.raises(DagsterInvalidConfigError):
        instance = DagsterInstance.from_config(str(instance_home(tmp_path, name, config)))
        try:
            _ = instance.run_launcher  # built lazily: its class config is checked here
        finally:
            instance.dispose()


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *argv], env=env, capture_output=True, text=True, timeout=180
    )


@pytest.mark.slow
@needs_postgres
def test_dagster_instance_info_under_the_celery_instance(tmp_path, postgres):
    home = instance_home(tmp_path, "celery")
    env = {**os.environ, **postgres.env("legato_celery"), **BROKER_ENV, "DAGSTER_HOME": str(home)}
    info = _run(["dagster", "instance", "info"], env)
    assert info.returncode == 0, info.stderr[-2000:]
    assert "PostgresRunStorage" in info.stdout and "CeleryRunLauncher" in info.stdout


@pytest.mark.slow
@needs_postgres
@pytest.mark.parametrize("name", DEPLOYMENTS)
def test_definitions_load_under_each_deployment(tmp_path, postgres, name):
    """The code location loads with each instance and a multi-host environment: desktops
    by URL only, the lake on an object store (nothing is contacted at load time)."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("LEGATO_")},
        **postgres.env(f"legato_{name}"),
        **BROKER_ENV,
        "DAGSTER_HOME": str(instance_home(tmp_path, name)),
        "LEGATO_BACKEND": "local",
        "LEGATO_DESKTOPS": "0",
        "LEGATO_DESKTOP_URLS": "http://127.0.0.1:5000 http://127.0.0.1:5001",
        "LEGATO_LAKE": "s3://legato-ci/lake",
    }
    validate = _run(["dagster", "definitions", "validate", "-m", CODE_MODULE], env)
    assert validate.returncode == 0, validate.stderr[-2000:]
    if name == "celery":  # a typo in the deployment's environment fails the same check
        typo = _run(
            ["dagster", "definitions", "validate", "-m", CODE_MODULE],
            {**env, "LEGATO_BACKEND": "locl"},
        )
        assert typo.returncode != 0 and "locl" in typo.stdout + typo.stderr


@pytest.mark.parametrize("name", ["celery", "docker"])
def test_workspaces_validate_and_name_the_code_location(monkeypatch, name):
    monkeypatch.setenv("LEGATO_CODE_SERVER_HOST", "127.0.0.1")
    monkeypatch.setenv("LEGATO_CODE_SERVER_PORT", "4266")
    ws = load(DEPLOY / name / "workspace.yaml")
    ensure_workspace_config(ws, str(DEPLOY / name / "workspace.yaml"))
    (entry,) = ws["load_from"]
    assert entry["grpc_server"]["location_name"] == "legato_pipelines"
    broken = copy.deepcopy(ws)
    broken["load_from"][0]["grpc_server"]["prot"] = broken["load_from"][0]["grpc_server"].pop(
        "port"
    )
    with pytest.raises(DagsterInvalidConfigError):
        ensure_workspace_config(broken, "broken.yaml")


def test_celery_worker_config_validates_and_matches_the_launcher(monkeypatch, tmp_path):
    from dagster_celery.cli import get_validated_config

    for k, v in BROKER_ENV.items():
        monkeypatch.setenv(k, v)
    worker = get_validated_config(str(DEPLOY / "celery" / "celery.yaml"))
    assert worker["broker"] == BROKER_ENV["LEGATO_CELERY_BROKER"]
    assert worker["backend"] == BROKER_ENV["LEGATO_CELERY_BACKEND"]
    launcher = load(DEPLOY / "celery" / "dagster.yaml")["run_launcher"]["config"]
    # late ack on both sides, or a busy worker reserves a run another worker could start
    assert worker["config_source"]["task_acks_late"] is True
    assert launcher["config_source"]["task_acks_late"] is True
    broken = load(DEPLOY / "celery" / "celery.yaml")
    broken["execution"]["config"]["brokr"] = broken["execution"]["config"].pop("broker")
    (tmp_path / "celery.yaml").write_text(yaml.safe_dump(broken))
    with pytest.raises(DagsterInvalidConfigError):
        get_validated_config(str(tmp_path / "celery.yaml"))


def test_helm_values_agree_with_the_instance_they_render():
    values = load(DEPLOY / "k8s" / "values.yaml")
    instance = load(DEPLOY / "k8s" / "dagster.yaml")
    assert set(values) <= CHART_KEYS, f"not chart keys: {set(values) - CHART_KEYS}"
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    assert instance["run_launcher"]["class"] == "K8sRunLauncher"
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    assert deployment["dagsterApiGrpcArgs"] == ["-m", CODE_MODULE]  # a module, never -f
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    assert [m["name"] for m in launcher["envConfigMaps"]] == instance["run_launcher"]["config"][
        "env_config_maps"
    ]
    assert [s["name"] for s in launcher["envSecrets"]] == instance["run_launcher"]["config"][
        "env_secrets"
    ]
    concurrency = values["concurrency"]
    assert concurrency["enabled"] is True
    assert (
        concurrency["runs"]["maxConcurrentRuns"]
        == instance["concurrency"]["runs"]["max_concurrent_runs"]
    )
    assert concurrency["pools"]["defaultLimit"] == instance["concurrency"]["pools"]["default_limit"]
    assert values["dagsterDaemon"]["runCoordinator"]["type"] == "QueuedRunCoordinator"
    assert (
        values["serviceAccount"]["name"]
        == instance["run_launcher"]["config"]["service_account_name"]
    )
    if shutil.which("helm"):  # with helm and the chart at hand, let the chart's schema judge
        pytest.skip("helm present: run `helm lint` with the dagster chart (not vendored)")


@pytest.mark.slow
def test_compose_file_wires_the_code_server_the_workspace_and_the_run_env():
    compose = load(DEPLOY / "docker" / "docker-compose.yaml")
    ws = load(DEPLOY / "docker" / "workspace.yaml")["load_from"][0]["grpc_server"]
    instance = load(DEPLOY / "docker" / "dagster.yaml")
    services = compose["services"]
    code = services[ws["host"]]["command"]
    assert code[:3] == ["dagster", "code-server", "start"]
    assert code[code.index("-p") + 1] == str(ws["port"])
    assert code[code.index("-m") + 1] == CODE_MODULE
    assert instance["run_launcher"]["config"]["network"] in compose["networks"]
    env = compose["x-legato-env"]
    passed = instance["run_launcher"]["config"]["env_vars"]
    missing = [
        v
        for v in passed
        if v not in env and not v.startswith("AWS_")  # object-store credentials: optional
    ]
    assert not missing, f"run containers expect variables the services do not set: {missing}"
    assert "/var/run/docker.sock:/var/run/docker.sock" in services["legato_daemon"]["volumes"]
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert "'.[scale]'" in dockerfile
    for copied in ("legato_pipelines", "examples", "deploy/docker/dagster.yaml"):
        assert copied in dockerfile and (REPO / copied.split()[0]).exists()
