"""``legato collect``, ``legato export``, ``legato profile``: the engine from the shell."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from ..desktops.option_flags import parse_desktop_options
from ..desktops.registry import BUILTIN, DEFAULT_BACKEND
from ..policy.config import PolicyConfig
from ..policy.load_spec import LoadSpec
from ..rollout.settings import CollectSettings
from ..setting_fields import from_user
from .console import console, err, fail
from .options import DesktopOptionFlags, OsworldCheckout, settings_options
from .root import app


@app.command("collect")
@settings_options(LoadSpec, after="logprobs_mode")
@settings_options(PolicyConfig, after="osworld_provider")
@settings_options(CollectSettings, after="backend")
def collect_command(
    tasks: Annotated[
        Path,
        typer.Option("--tasks", help="Task list JSON (or an OSWorld index such as test_all.json)."),
    ],
    policy_url: Annotated[
        str,
        typer.Option(
            "--policy-url", help="OpenAI-compatible server root, e.g. http://127.0.0.1:8000."
        ),
    ],
    model: Annotated[str, typer.Option("--model", help="Served model name.")],
    out: Annotated[Path, typer.Option("--out", help="Run directory (re-running resumes it).")],
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            help=f"Desktops: a registered backend ({' | '.join(BUILTIN)}; docs/backends.md).",
        ),
    ] = DEFAULT_BACKEND,
    osworld: OsworldCheckout = None,
    desktop_option: DesktopOptionFlags = None,
    web: Annotated[
        str | None,
        typer.Option(
            "--web",
            help="Local desktops' websites: live (default), replay:ARCHIVE (served from an"
            " archive of `legato web record`, no network) or record:ARCHIVE.",
        ),
    ] = None,
    screen: Annotated[
        str | None,
        typer.Option(
            "--screen",
            help="Screen size WIDTHxHEIGHT in pixels (fake and local desktops, VMs); default"
            " 1920x1080 for tasks of an OSWorld checkout or index, else 1280x720.",
        ),
    ] = None,
    osworld_python: Annotated[
        Path | None,
        typer.Option(
            "--osworld-python",
            help="Backend osworld: interpreter with desktop-env (default: `legato osworld install`'s).",
        ),
    ] = None,
    osworld_provider: Annotated[
        str | None,
        typer.Option(
            "--osworld-provider",
            help="Backend osworld: DesktopEnv provider (docker | local | vmware | aws | ...; default docker).",
        ),
    ] = None,
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", help="The version's checkpoint folder (fingerprinted)."),
    ] = None,
    adapter: Annotated[
        str | None,
        typer.Option("--adapter", help="Served name of the version (default: --version)."),
    ] = None,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress bar.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    **settings: Any,
) -> None:
    """Collect one batch of graded attempts for one policy version.

    The policy API key is read from the LEGATO_POLICY_KEY environment variable only.
    """
    from ..desktops.base import DesktopConfig
    from ..desktops.registry import names
    from ..errors import LegatoError
    from ..rollout.engine import collect
    from ..rollout.profile import incomplete_message
    from ..tasks import load_tasks
    from ..versions import check_version_key
    from .progress import CollectProgress

    version = settings["version"]
    try:
        check_version_key(version)
    except LegatoError as exc:
        fail(f"--version: {exc}")
    # fields set through a flag of another name: errors name the flag
    flags = {f"screen_{w}": f"--screen {screen!r} ({w})" for w in ("width", "height")}
    try:
        knobs = CollectSettings.checked(
            {k: v for k, v in settings.items() if k in CollectSettings.model_fields}
        )
        try:
            options = parse_desktop_options(desktop_option or [])
        except ValueError as exc:
            fail(str(exc))
        if web is not None:
            options["web"] = web
        if osworld_python is not None:
            options["osworld_python"] = str(osworld_python)
        if osworld_provider is not None:
            options["provider"] = osworld_provider
        policy = PolicyConfig(
            base_url=policy_url,
            model=model,
            step_timeout=knobs.step_timeout,
            retries=knobs.retries,
            **from_user(PolicyConfig, settings, "cli"),
        )
        size: dict[str, int] = {}  # unset: the default of the task set (desktops/task_defaults.py)
        if screen is not None:
            width, sep, height = screen.lower().partition("x")
            if not (sep and width.isdigit() and height.isdigit()):
                fail(f"--screen {screen!r}: use WIDTHxHEIGHT in pixels, e.g. 1920x1080")
            size = {"screen_width": int(width), "screen_height": int(height)}
        backend = backend.strip().lower()  # as LEGATO_BACKEND: any case
        if backend not in names():
            fail(f"--backend {backend!r}: use one of {', '.join(names())}")
        desktop = DesktopConfig(
            backend=backend,
            **size,
            ready_signal=knobs.ready_signal,
            fixed_wait=knobs.fixed_wait,
            fast_reset=knobs.fast_reset,
            options=options,
        )
        task_set = load_tasks(tasks, osworld=osworld)
        load_spec = LoadSpec.checked(
            **from_user(LoadSpec, settings, "cli"),
            checkpoint=str(checkpoint) if checkpoint else None,
            adapter=adapter,
        )
    except ValidationError as exc:
        fail(_pydantic_message(exc, flags))
    except LegatoError as exc:
        fail(str(exc))
    progress = (
        None if no_progress or json_out else CollectProgress(len(task_set), group_size=knobs.group)
    )
    terminated: list[int] = []
    try:
        with progress or contextlib.nullcontext(), _sigterm_as_ctrl_c() as terminated:
            summary = collect(
                task_set,
                policy,
                out,
                settings=knobs,
                desktop=desktop,
                on_record=progress.on_record if progress else None,
                load=load_spec,
            )
    except LegatoError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(_os_error_message(exc, out))
    except KeyboardInterrupt:
        by = f" by {signal.Signals(terminated[0]).name}" if terminated else ""
        fail(
            f"interrupted{by}: finished records are kept in {out}; "
            "run the same command again to resume",
            code=128 + terminated[0] if terminated else 130,
        )
    if json_out:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        print_profile(summary)
        console.print(f"run directory: [bold]{out}[/]")
    warn_unusable(summary)
    problem = incomplete_message(summary)  # groups left open: exit 1, the same command resumes
    if problem:
        fail(problem, code=1)


def _os_error_message(exc: OSError, out: Path) -> str:
    """The message of an ``OSError`` that ended a collect: about ``--out`` when it names a path
    in the run directory, about the path it names otherwise (a cache, a task file), and as
    itself when it names none (e.g. a connection error)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    where = exc.filename
    if where is None:
        return (
            reason
            if isinstance(exc, ConnectionError | TimeoutError)
            else (f"--out {out}: {reason} (fix: a writable directory)")
        )
    path = os.fsdecode(where)
    try:
        inside = Path(path).resolve().is_relative_to(Path(out).resolve())
    except (OSError, RuntimeError):  # a link loop: say it as it is
        inside = False
    if inside:
        return f"--out {out}: {reason} (fix: a writable directory)"
    also = f" -> {os.fsdecode(exc.filename2)}" if exc.filename2 is not None else ""
    return f"{path}{also}: {reason} (fix: make it writable, or move it)"


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[list[int]]:
    """While inside, SIGTERM (``kill``, a scheduler stopping the job) and SIGHUP (its terminal
    closed; left alone when ignored, as under ``nohup``) stop the collection as Ctrl-C does:
    they raise SIGINT, so the engine's ``asyncio.run`` cancels the batch, closes the desktops
    and keeps the finished records. Yields a list that gets the signal number when one came
    (the caller exits 128 + it: 143 for SIGTERM, 129 for SIGHUP, not Ctrl-C's 130).

    A collector started in the background (``nohup legato collect ... &`` from a script)
    inherits SIGINT ignored, and the raised SIGINT would then do nothing (a newcomer's
    ``kill`` went unheard for minutes): while inside, SIGINT gets Python's default handler
    back (``asyncio.run`` turns it into the batch's cancellation only then), and is ignored
    again after."""
    got: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        got.append(signum)
        signal.raise_signal(signal.SIGINT)

    previous: dict[int, Any] = {}
    try:
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                previous[signum] = signal.signal(signum, on_signal)
    except ValueError:  # not the main thread: leave the signals alone
        yield got
        return
    try:
        yield got
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def warn_unusable(summary: dict) -> None:
    """Say plainly when a batch is not usable for RL training: no logprobs came back (the
    trainer's importance ratios need them), or graders failed (rewards of 0 that mean
    nothing). Printed on stderr; the exit status stays 0 (the batch itself completed)."""
    if summary.get("steps") and not summary.get("logprobs_share"):
        err.print(
            "[yellow]warning:[/] the server returned no logprobs: these samples are not usable for RL "
            "(check the server with `legato probe`)"
        )
    if summary.get("eval_errors"):
        err.print(
            f"[yellow]warning:[/] {summary['eval_errors']} attempt(s) scored 0 because their evaluator failed "
            "(see eval_error in rollouts.jsonl; `legato tasks check` finds evaluator typos)"
        )


def _pydantic_message(exc: ValidationError, flags: dict[str, str] | None = None) -> str:
    """``flag: msg, got VALUE (fix: flag)`` per error: a field is named by the flag that sets
    it (``flags``: field -> flag text, e.g. ``screen_width`` -> ``--screen '10x10' (width)``;
    else ``--`` and the field's last name dashed: ``top_p`` -> ``--top-p``, ``load.mode`` ->
    ``--mode``... where no flag has that name the text still names the field); an error of the
    whole model is ``config: msg``."""
    parts = []
    for e in exc.errors():
        loc = ".".join(str(x) for x in e["loc"])
        if not loc:
            parts.append(f"config: {e['msg']}")
            continue
        flag = (flags or {}).get(loc) or "--" + str(e["loc"][-1]).replace("_", "-")
        value = e.get("input")  # numbers only: a string may be a URL holding the key
        got = f", got {value!r}" if isinstance(value, (int, float, bool)) else ""
        parts.append(f"{flag}: {e['msg']}{got} (fix: {flag.split()[0]})")
    return "; ".join(parts)


@app.command("export")
def export_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by collect.")],
    out: Annotated[Path, typer.Option("--out", help="Output file: .parquet or .jsonl.")],
    inline_images: Annotated[
        bool, typer.Option("--inline-images", help="Images as data URLs instead of refs.")
    ] = False,
) -> None:
    """Write one row per step of every ok/truncated rollout, with rewards and advantages.

    Groups with fewer graded attempts than the run collected them for are written with
    group_complete false and no advantage; the count is printed."""
    from ..errors import LegatoError
    from ..store.export import export_steps, incomplete_groups, write_table

    try:
        table = export_steps(run_dir, inline_images=inline_images)
        path = write_table(table, out, run_dir=run_dir)
    except LegatoError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(
            f"--out {out}: {exc.strerror or exc} (fix: a writable file path ending in .parquet or .jsonl)"
        )
    console.print(f"wrote {table.num_rows} steps to [bold]{path}[/]")
    incomplete = incomplete_groups(table)
    if incomplete:
        groups = len(set(table.column("group_id").to_pylist()))
        console.print(
            f"[yellow]warning:[/] {incomplete} of {groups} groups are incomplete (fewer graded "
            "attempts than the run's group size): their rows have group_complete false and no "
            "advantage (keep `WHERE group_complete`, or resume the run to complete them)"
        )


@app.command("profile")
def profile_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory written by collect.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON for machines.")] = False,
) -> None:
    """Where the time went and what came back: statuses, success, phases, model calls, cache."""
    from ..errors import LegatoError
    from ..rollout.profile import profile

    try:
        summary = profile(run_dir)
    except LegatoError as exc:
        fail(str(exc))
    if json_out:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        print_profile(summary)


def _fmt(value, pct: bool = False) -> str:
    if value is None:
        return "-"
    if pct:
        return f"{value:.1%}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def print_profile(summary: dict) -> None:
    """The profile as a readable table."""
    table = Table(
        title=f"policy {summary['policy']['model']} @ {summary['policy']['version']}  task set {summary['task_set']}",
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()
    counts = summary["counts"]
    table.add_row("statuses", "  ".join(f"{k} {v}" for k, v in counts.items() if v) or "-")
    table.add_row(
        "records",
        f"{summary['records']} = scheduled {summary['scheduled']} - missing {summary['missing']} + retries {summary['retries']}",
    )
    table.add_row("groups closed", f"{summary['groups']['closed']}/{summary['groups']['total']}")
    graded = summary.get("graded")
    table.add_row(
        "success rate",
        _fmt(summary["success_rate"], pct=True)
        + (f" of {graded} graded attempts" if graded is not None else ""),
    )
    sampling = summary.get("sampling")
    if sampling:
        table.add_row(
            "sampling",
            "  ".join(f"{k} {'-' if v is None else v}" for k, v in sampling.items()),
        )
    table.add_row("rollouts / hour", _fmt(summary["rollouts_per_hour"]))
    of = {"records": " (records: first start to last end)"}.get(summary.get("wall_of"), "")
    table.add_row("wall time", f"{summary['wall_s']:.1f} s{of}, {summary['steps']} steps")
    table.add_row("time share", "  ".join(f"{k} {v:.0%}" for k, v in summary["time_share"].items()))
    m = summary["model_call_s"]
    table.add_row(
        "model call s", f"p50 {_fmt(m['p50'])}  p95 {_fmt(m['p95'])}  p99 {_fmt(m['p99'])}"
    )
    table.add_row("retried / hung calls", f"{summary['retried_calls']} / {summary['hung_calls']}")
    table.add_row(
        "errors",
        f"policy {summary['policy_errors']}  request {summary.get('request_errors', 0)}  "
        f"config {summary.get('config_errors', 0)}  env {summary['env_errors']}  "
        f"(desktop failures {summary['env_failures']})",
    )
    kinds = summary.get("env_failure_kinds") or {}
    if kinds:
        table.add_row("desktop failures by kind", "  ".join(f"{k} {n}" for k, n in kinds.items()))
    if "desktops" in summary:
        d = summary["desktops"]
        table.add_row(
            "desktops",
            f"used {d['used']}  lost {len(d['lost'])}{' ' + ', '.join(d['lost']) if d['lost'] else ''}"
            f"  recovered {len(d['recovered'])}",
        )
    critical = summary.get("reset_critical")
    if critical and critical["overall"]["n"]:
        apps = critical["by_domain"] if len(critical["by_domain"]) > 1 else {}
        table.add_row(
            "reset on critical path s",
            "  ".join(
                f"{name} p50 {_fmt(c['p50'])} p90 {_fmt(c['p90'])} (ahead {c['ahead']:.0%})"
                for name, c in {"all": critical["overall"], **apps}.items()
            ),
        )
    table.add_row("prefix cache hit", _fmt(summary["prefix_cache_hit_rate"], pct=True))
    table.add_row(
        "steps with logprobs / ids",
        f"{_fmt(summary['logprobs_share'], pct=True)} / {_fmt(summary['token_ids_share'], pct=True)}",
    )
    table.add_row("parse errors", str(summary.get("parse_errors", 0)))
    table.add_row("type actions not fully typed", str(summary.get("not_typed_actions", 0)))
    table.add_row(
        "ready waits at their cap",
        "  ".join(
            f"{what} {t['count']}" + (f" ({t['share']:.0%})" if t.get("share") is not None else "")
            for what, t in (
                ("actions", summary.get("ready_timeouts") or {"count": 0}),
                ("resets", summary.get("reset_timeouts") or {"count": 0}),
            )
        ),
    )
    undrawn = summary.get("undrawn_observations") or {"count": 0, "resets": 0, "actions": 0}
    table.add_row(
        "observations of an undrawn app",
        f"{undrawn['count']} (after resets {undrawn['resets']}, after actions {undrawn['actions']})",
    )
    table.add_row("evaluator errors", str(summary.get("eval_errors", 0)))
    notes = summary.get("eval_notes") or {"attempts": 0, "by_kind": {}}
    table.add_row(
        "evaluator notes",
        f"{notes['attempts']} attempts"
        + "".join(f"  {kind} {n}" for kind, n in notes["by_kind"].items()),
    )
    missing = summary.get("web_replay_missing") or {"attempts": 0}
    if missing["attempts"]:
        table.add_row(
            "web requests not in the archive",
            f"{missing['requests']} in {missing['attempts']} replayed attempts",
        )
    quality = summary.get("quality")
    if quality:
        table.add_row(
            "numbers",
            f"invalid rewards {quality['invalid_rewards']}  length mismatches "
            f"{quality['length_mismatches']}  sentinel-logprob steps "
            f"{quality['logprob_sentinel_steps']}  valid logprobs "
            f"{_fmt(quality['logprobs_valid_share'], pct=True)}  server aborts "
            f"{quality['server_aborts']}  prompt ids {_fmt(quality['prompt_token_ids_share'], pct=True)}",
        )
        table.add_row(
            "context-length truncations",
            str(quality["context_length_truncations"])
            + (f" ({quality['advice']})" if quality.get("advice") else ""),
        )
    setup = summary.get("setup_failures") or {"attempts": 0, "by_step": {}}
    table.add_row(
        "setup failures",
        f"{setup['attempts']} attempts"
        + "".join(f"\n  {where}: {n}" for where, n in list(setup["by_step"].items())[:5]),
    )
    post = summary.get("postconfig_failures") or {"attempts": 0, "by_step": {}}
    table.add_row(
        "postconfig failures",
        f"{post['attempts']} attempts"
        + "".join(f"\n  {where}: {n}" for where, n in list(post["by_step"].items())[:5]),
    )
    windows = summary.get("unexpected_windows") or {"attempts": 0, "by_window": {}}
    table.add_row(
        "unexpected windows closed",
        f"{windows['attempts']} attempts"
        + "".join(f"\n  {what}: {n}" for what, n in list(windows["by_window"].items())[:5]),
    )
    keyboard = summary.get("keyboard_restores") or {"attempts": 0}
    table.add_row("keyboard layouts restored", f"{keyboard['attempts']} resets")
    console.print(table)
