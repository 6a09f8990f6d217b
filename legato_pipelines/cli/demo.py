"""``legato demo``: the main job on the embedded default, the way users run it.

Starts the scripted policy server on loopback (NOT a model), adds a new ``policy_version``
partition to the local Dagster instance, materializes ``rollout_batch``, ``rollouts``,
``training_samples`` and ``profile_summary`` for it with ``dagster asset materialize``, then
prints where the Parquet lake, the DuckDB file and the HTML report of the rollouts are, and a
first SQL answer. The run stays in the instance, so ``dagster dev`` shows it afterwards.

Desktops (``--backend auto``, the default): where Xvfb and the suite's apps are installed
(``scripts/setup.sh`` installs them) and a local desktop starts, the local task suite
(``examples/tasks/local``: xterm, l3afpad, LibreOffice Calc) runs on real local desktops with
the scripted answers of ``scripts/demo.json`` (mostly correct, some wrong, some right in one attempt of two, a click); otherwise
the fake backend and its task list, and the demo says why.

Instance (``DAGSTER_HOME``): ``--home``, else ``$DAGSTER_HOME``, else the repository root
(where ``dagster.yaml`` is), else ``./.dagster_home`` (created with a minimal
``dagster.yaml``). Lake: ``--lake``, else ``$LEGATO_LAKE``, else ``<instance dir>/lake``.
"""

from __future__ import annotations

import json
import os
import re
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
LOCAL_APPS = ("Xvfb", "openbox", "xterm", "l3afpad", "soffice")
"""What the local task suite needs on this host (``scripts/setup.sh`` installs it)."""
LOCAL_DEFAULTS = {"group": 2, "max_steps": 10, "desktops": 2}
"""Demo knobs on real desktops: the 15-task suite x 2 in well under a minute on 2 cores."""
FAKE_DEFAULTS = {"group": _DEFAULT("group"), "max_steps": 5, "desktops": _DEFAULT("desktops")}


def local_suite() -> Path | None:
    """The local task suite's directory (``examples/tasks/local`` of a source checkout), if
    there is one."""
    root = repo_root()
    suite = root / "examples" / "tasks" / "local" if root else None
    return suite if suite and (suite / "tasks.json").is_file() else None


_STEP_ERROR = re.compile(
    r"^legato_pipelines\.errors\.\w+: (.+?)(?:\n\n|\nStack Trace:|\Z)", re.M | re.S
)


def step_error(log: str) -> str | None:
    """The message of the first ``legato_pipelines.errors`` exception in a ``dagster asset
    materialize`` log (Dagster prints ``<module>.<class>: <message>`` before the stack trace),
    else ``None``. Those messages name the field and the fix, so the demo prints them
    instead of the traceback's tail (which ends at the ``raise`` line)."""
    found = _STEP_ERROR.search(log)
    return found.group(1).strip() if found else None


def real_desktops_unavailable() -> str | None:
    """Why real local desktops cannot run the demo here (``None``: they can): a missing app,
    no local suite, or a desktop that fails to start (one is started and closed, ~1 s)."""
    import asyncio
    import shutil

    missing = [app for app in LOCAL_APPS if shutil.which(app) is None]
    if missing:
        return f"{', '.join(missing)} not installed (scripts/setup.sh installs them)"
    if local_suite() is None:
        return "the local task suite (examples/tasks/local) is not here (not a source checkout)"

    async def probe() -> None:
        from ..desktops import open_desktops
        from ..desktops.base import DesktopConfig

        pool = await asyncio.wait_for(open_desktops(DesktopConfig(backend="local"), 1), 30)
        await asyncio.gather(*(d.close() for d in pool))

    try:
        asyncio.run(probe())
    except Exception as exc:  # any failure to start means: fall back, saying why
        return f"a local desktop did not start ({type(exc).__name__}: {str(exc)[:200]})"
    return None


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
            "--tasks",
            help="Task list JSON; default: the local suite on real desktops, else $LEGATO_TASKS or "
            "the shipped fake tasks. A list of your own runs on fake desktops unless --backend local.",
        ),
    ] = None,
    lake: Annotated[
        Path | None, typer.Option("--lake", help="Lake root; default $LEGATO_LAKE or <home>/lake.")
    ] = None,
    home: Annotated[
        Path | None, typer.Option("--home", help="DAGSTER_HOME (must hold dagster.yaml).")
    ] = None,
    group: Annotated[
        int | None, typer.Option("--group", help=_HELP["group"] + " [default: 2 real, 4 fake]")
    ] = None,
    max_steps: Annotated[
        int | None,
        typer.Option("--max-steps", help=_HELP["max_steps"] + " [default: 10 real, 5 fake]"),
    ] = None,
    desktops: Annotated[
        int | None, typer.Option("--desktops", help="Desktops at once [default: 2 real, 4 fake].")
    ] = None,
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            help="auto: real local desktops where they can start, else fake; local; fake.",
        ),
    ] = "auto",
) -> None:
    """Collect one policy version against the scripted policy server, through Dagster: on real
    local desktops where they can start, else on fake ones; ends with the report's path."""
    from ..assets.config import default_tasks
    from ..policy.scripted import ScriptedPolicyServer
    from ..store.lake import Lake

    backend = backend.strip().lower()  # any case, as LEGATO_BACKEND
    if backend not in ("auto", "local", "fake"):
        fail(f"--backend: {backend!r} is not one of auto, local, fake")
    script = None
    fallback = None
    if backend == "auto" and (tasks is not None or os.environ.get("LEGATO_TASKS")):
        backend = "fake"  # a task list of your own: the fake backend, unless --backend local
    elif backend != "fake":
        why = real_desktops_unavailable()
        if why is None:
            backend = "local"
        elif backend == "local":
            fail(f"--backend local: {why}")
        else:
            fallback = f"real desktops cannot start here: {why}; using fake desktops instead"
            backend = "fake"
    defaults = LOCAL_DEFAULTS if backend == "local" else FAKE_DEFAULTS
    group = defaults["group"] if group is None else group
    max_steps = defaults["max_steps"] if max_steps is None else max_steps
    desktops = defaults["desktops"] if desktops is None else desktops
    if backend == "local":
        suite = local_suite()
        assert suite is not None
        tasks = tasks or suite / "tasks.json"
        script = suite / "scripts" / "demo.json"
    tasks_path = Path(tasks or default_tasks()).expanduser().resolve()
    key = check_inputs(
        version or time.strftime("demo-%Y%m%d-%H%M%S-") + secrets.token_hex(2),
        tasks_path,
        group=group,
        max_steps=max_steps,
        desktops=desktops,
    )
    if fallback:
        err.print(f"[yellow]{fallback}[/]", highlight=False)
    home_dir = dagster_home(home)
    lake_root = lake.expanduser().resolve() if lake else default_lake(home_dir)
    os.environ["DAGSTER_HOME"] = str(home_dir)

    # cycle: every group of 2+ attempts at the demo's mixed tasks has a success and a failure
    with ScriptedPolicyServer(flavor="vllm", script=script, sample_order="cycle") as server:
        env = {
            **os.environ,
            "DAGSTER_HOME": str(home_dir),
            "LEGATO_POLICY_URL": server.url,
            "LEGATO_POLICY_MODEL": server.model,
            "LEGATO_BACKEND": backend,
            "LEGATO_DESKTOPS": str(desktops),
            "LEGATO_TASKS": str(tasks_path),
            "LEGATO_LAKE": str(lake_root),
        }
        env.pop("LEGATO_POLICY_KEY", None)  # the scripted server needs none
        console.print(f"scripted policy server (not a model) at {server.url}, model {server.model}")
        if backend == "local":
            console.print(
                f"real local desktops: {desktops} Xvfb desktops, task suite {tasks_path} "
                f"(group {group}), scripted answers {script}"
            )
        else:
            console.print(f"fake desktops: {desktops}, tasks {tasks_path}")
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
            text = log_path.read_text(errors="replace")
            message = step_error(text)
            if message is None:  # not one of ours: the log's end says what happened
                err.print("\n".join(text.splitlines()[-25:]), markup=False, highlight=False)
            else:
                err.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
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
    report = store.run_dir(key) / "report" / "index.html"
    if report.is_file():
        console.print(
            f"[bold]rollout report ({'real' if backend == 'local' else 'fake'} desktops):[/] "
            f"{report}  (open from disk: {report.as_uri()}; rebuild: legato view --lake {store.root} --version {key})",
            highlight=False,
        )


def check_inputs(
    version: str, tasks_path: Path, *, group: int, max_steps: int, desktops: int
) -> str:
    """Check the demo's inputs with the engine's own validators before anything starts (a bad
    input is one ``error:`` line and exit 2, not a Dagster stack trace): the partition key
    (:func:`~legato_pipelines.versions.check_version_key`), the task list
    (:func:`~legato_pipelines.tasks.load_tasks`) and the knobs, as ``legato collect`` checks
    them (:class:`~legato_pipelines.rollout.settings.CollectSettings`). Returns the partition
    key."""
    from ..errors import LegatoError
    from ..tasks import load_tasks
    from ..versions import check_version_key

    try:
        key = check_version_key(version)
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
