"""``legato demo``: the main job on the embedded default, the way users run it.

Starts the scripted policy server on loopback (NOT a model), adds a new ``policy_version``
partition to the local Dagster instance, materializes ``rollout_batch``, ``rollouts``,
``training_samples`` and ``profile_summary`` for it with ``dagster asset materialize`` on fake
desktops, then prints where the Parquet lake and the DuckDB file are and a first SQL answer.
The run stays in the instance, so ``dagster dev`` shows it afterwards.

Instance (``DAGSTER_HOME``): ``--home``, else ``$DAGSTER_HOME``, else the repository root
(where ``dagster.yaml`` is), else ``./.dagster_home`` (created with a minimal
``dagster.yaml``). Lake: ``--lake``, else ``$LEGATO_LAKE``, else ``<instance dir>/lake``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..rollout.settings import CollectSettings
from .console import console, err, fail
from .root import app

_HELP = {name: field.description for name, field in CollectSettings.model_fields.items()}
_DEFAULT = CollectSettings.default

ASSETS = ("rollout_batch", "rollouts", "training_samples", "profile_summary")
FIRST_QUERY = (
    "SELECT p.policy_version, p.records, round(p.success_rate, 3) AS success_rate, "
    "round(p.rollouts_per_hour) AS rollouts_per_hour, count(s.step) AS samples "
    "FROM profile p JOIN samples s USING (policy_version) "
    "WHERE p.policy_version = ? GROUP BY ALL"
)
MINIMAL_DAGSTER_YAML = "telemetry:\n  enabled: false\n"


def repo_root() -> Path | None:
    """The source checkout holding ``dagster.yaml`` and ``workspace.yaml``, if installed from one."""
    root = Path(__file__).resolve().parents[2]
    return (
        root if (root / "dagster.yaml").is_file() and (root / "workspace.yaml").is_file() else None
    )


def instance_dir(home: Path | None = None) -> Path:
    """Where the Dagster instance is (see the module doc for the order), absolute; nothing is
    created."""
    if home is not None:
        chosen = home
    elif os.environ.get("DAGSTER_HOME"):
        chosen = Path(os.environ["DAGSTER_HOME"])
    elif (root := repo_root()) is not None:
        chosen = root
    else:
        chosen = Path.cwd() / ".dagster_home"
    return chosen.expanduser().resolve()


def default_lake(home: Path | None = None) -> Path:
    """The demo's lake root: ``$LEGATO_LAKE``, else ``<instance dir>/lake`` (also where
    ``legato lake`` looks by default)."""
    return Path(os.environ.get("LEGATO_LAKE") or instance_dir(home) / "lake").expanduser().resolve()


def dagster_home(home: Path | None) -> Path:
    """Where the Dagster instance lives (:func:`instance_dir`), created with a minimal
    ``dagster.yaml`` if it has none."""
    chosen = instance_dir(home)
    chosen.mkdir(parents=True, exist_ok=True)
    if not (chosen / "dagster.yaml").exists():
        (chosen / "dagster.yaml").write_text(MINIMAL_DAGSTER_YAML)
    return chosen


@app.command("demo")
def demo_command(
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="Partition key (policy version); default demo-<timestamp>-<4 hex digits>.",
        ),
    ] = None,
    tasks: Annotated[
        Path | None,
        typer.Option(
            "--tasks", help="Task list JSON; default $LEGATO_TASKS or the shipped fake tasks."
        ),
    ] = None,
    lake: Annotated[
        Path | None, typer.Option("--lake", help="Lake root; default $LEGATO_LAKE or <home>/lake.")
    ] = None,
    home: Annotated[
        Path | None, typer.Option("--home", help="DAGSTER_HOME (must hold dagster.yaml).")
    ] = None,
    group: Annotated[int, typer.Option("--group", help=_HELP["group"])] = _DEFAULT("group"),
    max_steps: Annotated[int, typer.Option("--max-steps", help=_HELP["max_steps"])] = 5,
    desktops: Annotated[int, typer.Option("--desktops", help="Fake desktops at once.")] = (
        _DEFAULT("desktops")
    ),
) -> None:
    """Collect one policy version on fake desktops against the scripted policy server, through Dagster."""
    from ..assets.config import default_tasks
    from ..policy.scripted import ScriptedPolicyServer
    from ..store.lake import Lake

    tasks_path = Path(tasks or default_tasks()).expanduser().resolve()
    key = check_inputs(
        version or time.strftime("demo-%Y%m%d-%H%M%S-") + secrets.token_hex(2),
        tasks_path,
        group=group,
        max_steps=max_steps,
        desktops=desktops,
    )
    home_dir = dagster_home(home)
    lake_root = lake.expanduser().resolve() if lake else default_lake(home_dir)
    os.environ["DAGSTER_HOME"] = str(home_dir)

    with ScriptedPolicyServer(flavor="vllm") as server:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home_dir),
            "LEGATO_POLICY_URL": server.url,
            "LEGATO_POLICY_MODEL": server.model,
            "LEGATO_BACKEND": "fake",
            "LEGATO_DESKTOPS": str(desktops),
            "LEGATO_TASKS": str(tasks_path),
            "LEGATO_LAKE": str(lake_root),
        }
        env.pop("LEGATO_POLICY_KEY", None)  # the scripted server needs none
        console.print(f"scripted policy server (not a model) at {server.url}, model {server.model}")
        console.print(f"Dagster instance: DAGSTER_HOME={home_dir}")
        _add_partition(key)
        console.print(f"added partition policy_version={key}")
        run_config = {
            "ops": {"rollout_batch": {"config": {"group": group, "max_steps": max_steps}}}
        }
        command = [
            sys.executable, "-m", "dagster", "asset", "materialize",
            "-m", "legato_pipelines.definitions",
            "--select", ",".join(ASSETS),
            "--partition", key,
            "--config-json", json.dumps(run_config),
        ]  # fmt: skip
        log_path = home_dir / "logs" / f"{key}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        console.print(f"$ dagster asset materialize --select {','.join(ASSETS)} --partition {key}")
        started = time.monotonic()
        with (
            console.status(f"materializing {len(ASSETS)} assets (log: {log_path})"),
            open(log_path, "wb") as log,
        ):
            code = subprocess.run(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=home_dir
            ).returncode
        if code != 0:
            tail = log_path.read_text(errors="replace").splitlines()[-25:]
            err.print("\n".join(tail), markup=False, highlight=False)
            err.print(
                f"[bold red]error:[/] dagster asset materialize failed (exit {code}); full log: {log_path}"
            )
            raise typer.Exit(1)
        console.print(f"materialized in {time.monotonic() - started:.1f} s")

    store = Lake(lake_root)
    result = store.query(FIRST_QUERY, [key])
    table = Table(title=f"first SQL answer, policy_version={key}")
    for name in result.column_names:
        table.add_column(name)
    for row in result.to_pylist():
        table.add_row(*[str(v) for v in row.values()])
    console.print(
        f"Parquet lake:  {store.root}  (tables rollouts, steps, samples, profile; policy_version=<key>/)"
    )
    console.print(f"DuckDB views:  {store.duckdb_path}  (open read-only)")
    console.print(f"run directory: {store.run_dir(key)}")
    console.print(f"[dim]{FIRST_QUERY.replace('?', repr(key))}[/]", highlight=False)
    console.print(table)
    console.print(
        f"see it in the UI: DAGSTER_HOME={home_dir} LEGATO_LAKE={store.root} dagster dev -w workspace.yaml",
        highlight=False,
    )


def check_inputs(
    version: str, tasks_path: Path, *, group: int, max_steps: int, desktops: int
) -> str:
    """Check the demo's inputs with the engine's own validators before anything starts (a bad
    input is one ``error:`` line and exit 2, not a Dagster stack trace): the partition key
    (:func:`~legato_pipelines.store.lake.check_partition_key`), the task list
    (:func:`~legato_pipelines.tasks.load_tasks`) and the knobs, as ``legato collect`` checks
    them (:class:`~legato_pipelines.rollout.settings.CollectSettings`). Returns the partition
    key."""
    from ..errors import LegatoError
    from ..store.lake import check_partition_key
    from ..tasks import load_tasks

    try:
        key = check_partition_key(version)
    except LegatoError as exc:
        fail(f"--version: {exc}")
    if not tasks_path.is_file():
        fail(f"--tasks: {tasks_path} does not exist (fix: pass --tasks PATH or set LEGATO_TASKS)")
    try:
        load_tasks(tasks_path, osworld=os.environ.get("LEGATO_OSWORLD") or None)
        CollectSettings.checked(group=group, max_steps=max_steps, desktops=desktops)
    except LegatoError as exc:
        fail(str(exc))
    return key


def _add_partition(key: str) -> None:
    import dagster as dg

    from ..assets.partitions import policy_versions

    with dg.DagsterInstance.get() as instance:
        if not instance.has_dynamic_partition(policy_versions.name, key):
            instance.add_dynamic_partitions(policy_versions.name, [key])
