"""``legato web record``: record the websites tasks open, one archive file per task, so that
``legato collect --web replay:ARCHIVE`` runs them again with no network (issue 34;
docs/local-desktop.md §15)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..desktops.option_flags import parse_desktop_options
from ..desktops.registry import get, names
from ..rollout.settings import CollectSettings
from .console import console, fail
from .options import DesktopOptionFlags, OsworldCheckout
from .root import app

web_app = typer.Typer(
    rich_markup_mode=None,
    help="Websites of local desktops: record them once, replay them offline (mitmproxy).",
    no_args_is_help=True,
)
app.add_typer(web_app, name="web")


@web_app.command("record")
def record_command(
    tasks: Annotated[Path, typer.Argument(help="Task list JSON (or an OSWorld index).")],
    archive: Annotated[
        Path, typer.Option("--archive", help="Folder of the archive: <task_id>.flows per task.")
    ],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Run directory of the recording (default: ARCHIVE/run)."),
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option(
            "--script",
            help="The scripted policy's JSON (policy/scripted.py); default: terminate at once.",
        ),
    ] = None,
    policy_url: Annotated[
        str | None, typer.Option("--policy-url", help="A model's server instead of a script.")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="With --policy-url.")] = None,
    osworld: OsworldCheckout = None,
    desktop_option: DesktopOptionFlags = None,
    max_steps: Annotated[
        int, typer.Option("--max-steps", help="Policy calls per task.")
    ] = CollectSettings.model_fields["max_steps"].default,
) -> None:
    """Run each task's setup, a policy and its grader on a local desktop, with every HTTP(S)
    exchange of its Chromium captured into ARCHIVE/<task_id>.flows (mitmproxy's flow file;
    a later recording of a task replaces it). Needs a route out (desktop option network
    own or host; proxy for OSWorld's proxy tasks) and scripts/web_venv.sh."""
    from ..desktops.base import DesktopConfig
    from ..errors import LegatoError
    from ..policy.config import PolicyConfig
    from ..policy.scripted import ScriptedPolicyServer
    from ..policy.synthetic import qwen_response
    from ..rollout.engine import collect
    from ..tasks import load_tasks

    if (policy_url is None) != (model is None):
        fail("--policy-url and --model go together")
    if policy_url is not None and script is not None:
        fail("--script or --policy-url, not both")
    try:
        options = parse_desktop_options(desktop_option or [])
    except ValueError as exc:
        fail(str(exc))
    archive = archive.expanduser().resolve()
    options["web"] = f"record:{archive}"
    run_dir = out or archive / "run"
    try:
        task_set = load_tasks(tasks, osworld=osworld)
        # the backend whose options take ``web`` (the registry's: the local desktops')
        backend = next(name for name in names() if "web" in get(name).options.model_fields)
        desktop = DesktopConfig(backend=backend, options=options)
        settings = {"desktops": 1, "group": 1, "max_steps": max_steps}
        if policy_url is not None:
            policy = PolicyConfig(base_url=policy_url, model=model, version="record")
            summary = collect(task_set, policy, run_dir, desktop=desktop, **settings)
        else:
            done = qwen_response("Done.", {"action": "terminate", "status": "success"})
            with ScriptedPolicyServer(script=script or {"default": [done]}) as server:
                policy = PolicyConfig(base_url=server.url, model=server.model, version="record")
                summary = collect(task_set, policy, run_dir, desktop=desktop, **settings)
    except LegatoError as exc:
        fail(str(exc))
    recorded = [t.task_id for t in task_set if (archive / f"{t.task_id}.flows").is_file()]
    console.print(
        f"recorded {len(recorded)} of {len(task_set)} task(s) into {archive}"
        f" (run {run_dir}: {summary.get('records', 0)} record(s))",
        highlight=False,
    )
    if len(recorded) < len(task_set):
        raise typer.Exit(1)
