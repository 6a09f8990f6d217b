"""``legato probe`` (what a policy server supports) and ``legato scripted-policy`` (a scripted
OpenAI-compatible server that is NOT a model)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from .console import console, fail
from .root import app


def _why_not(report) -> str:
    """The first reason a server is not usable for RL, in the order a user fixes them."""
    if not report.reachable:
        return "server not reachable"
    if report.model_listed is False:
        return "model not listed"
    return "no logprobs"


def _verdict_table(report) -> Table:
    def yes(value) -> str:
        if value is None:
            return "[dim]unknown[/]"
        return "[green]yes[/]" if value else "[red]no[/]"

    table = Table(title="policy server probe", show_header=True, header_style="bold")
    table.add_column("check")
    table.add_column("result")
    table.add_row("reachable", yes(report.reachable))
    table.add_row("model listed", yes(report.model_listed))
    table.add_row("logprobs", yes(report.logprobs))
    ids = yes(report.token_ids)
    if report.token_ids_source:
        ids += f" ({report.token_ids_source})"
    table.add_row("token ids", ids)
    cached = yes(report.cached_tokens_reported)
    if report.cached_tokens is not None:
        cached += f" ({report.cached_tokens} on the repeated prompt)"
    table.add_row("cached tokens reported", cached)
    table.add_row(
        "cache block",
        "[dim]not reported[/]"
        if report.cache_block_size is None
        else f"{report.cache_block_size} tokens",
    )
    table.add_row(
        "images per prompt",
        "[dim]unknown[/]" if report.max_images_ok is None else str(report.max_images_ok),
    )
    table.add_row("reasoning field", report.reasoning_field or "[dim]none[/]")
    table.add_row("answer arrives in", report.answer_field or "[dim]nothing[/]")
    table.add_row(
        "latency",
        "[dim]unknown[/]" if report.latency_s is None else f"{report.latency_s * 1000:.0f} ms",
    )
    table.add_row(
        "usable for RL",
        "[bold green]yes[/]" if report.usable_for_rl else f"[bold red]no[/] ({_why_not(report)})",
    )
    return table


@app.command("probe")
def probe_command(
    policy_url: Annotated[
        str,
        typer.Option(
            "--policy-url", help="OpenAI-compatible server root, e.g. http://127.0.0.1:8000."
        ),
    ],
    model: Annotated[str, typer.Option("--model", help="Served model name (as in /v1/models).")],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of a table.")
    ] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds per request (step_timeout).", min=0.01)
    ] = 60.0,
) -> None:
    """Check what a policy server supports: reachable, model listed, logprobs, token ids (and
    from where), cached-token reporting, images per prompt, reasoning field, latency.

    Exit status 0 when usable for RL (logprobs come back), 1 otherwise, 2 on bad input.
    The API key is read from LEGATO_POLICY_KEY only.
    """
    from ..policy import PolicyConfig, probe

    try:
        config = PolicyConfig(base_url=policy_url, model=model, step_timeout=timeout, retries=0)
    except ValidationError as exc:
        flags = {"base_url": "--policy-url", "model": "--model", "step_timeout": "--timeout"}
        fail(
            "; ".join(
                f"{flags.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}" for e in exc.errors()
            )
        )
    report = asyncio.run(probe(config))
    if as_json:
        typer.echo(json.dumps(report.model_dump()))
    else:
        console.print(_verdict_table(report))
        for note in report.notes:
            console.print(f"- {note}", highlight=False, markup=False)
    raise typer.Exit(0 if report.usable_for_rl else 1)


@app.command("scripted-policy")
def scripted_policy_command(
    port: Annotated[
        int, typer.Option("--port", help="Port to listen on (0: any free port).", min=0, max=65535)
    ],
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    flavor: Annotated[
        str, typer.Option("--flavor", help="Wire format: vllm | vllm-old | sglang | openai.")
    ] = "vllm",
    script: Annotated[
        Path | None,
        typer.Option("--script", help="JSON script: {tasks: {instruction: [responses]}, default}."),
    ] = None,
    model: Annotated[str, typer.Option("--model", help="Model name served.")] = "scripted-qwen",
    latency: Annotated[
        float, typer.Option("--latency-median", help="Added latency per call [s].", min=0)
    ] = 0.0,
    sigma: Annotated[
        float,
        typer.Option("--latency-sigma", help="Lognormal sigma of the latency (0: fixed).", min=0),
    ] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of latency and fault draws.")] = 0,
    hang_every: Annotated[
        int, typer.Option("--hang-every", help="Every Nth call hangs (0: never).", min=0)
    ] = 0,
    hang_mode: Annotated[str, typer.Option("--hang-mode", help="sleep | trickle")] = "sleep",
    error_every: Annotated[
        int, typer.Option("--error-every", help="Every Nth call answers --error-status.", min=0)
    ] = 0,
    error_rate: Annotated[
        float,
        typer.Option(
            "--error-rate", help="Fraction of calls answering --error-status.", min=0, max=1
        ),
    ] = 0.0,
    error_status: Annotated[
        int, typer.Option("--error-status", help="HTTP status of injected errors.")
    ] = 500,
    image_limit: Annotated[
        int | None,
        typer.Option("--image-limit", help="Refuse prompts with more images (vLLM's 400).", min=0),
    ] = None,
    reject_unknown: Annotated[
        bool,
        typer.Option(
            "--reject-unknown-fields", help="400 for request fields OpenAI does not know."
        ),
    ] = False,
    no_logprobs: Annotated[
        bool, typer.Option("--no-logprobs", help="Never return logprobs.")
    ] = False,
    no_cache_report: Annotated[
        bool, typer.Option("--no-cache-report", help="Never report cached tokens.")
    ] = False,
    require_key: Annotated[
        bool,
        typer.Option("--require-key", help="Require Bearer $LEGATO_POLICY_KEY (401 otherwise)."),
    ] = False,
    image_tokens: Annotated[
        int,
        typer.Option(
            "--image-tokens",
            help="Prompt tokens per image (<|image_pad|> ids; Qwen3-VL at 1280x704: 880).",
            min=1,
        ),
    ] = 64,
    max_model_len: Annotated[
        int | None,
        typer.Option(
            "--max-model-len",
            help="Context [tokens]: longer prompt + max_tokens is vLLM's 400 (default: none).",
            min=1,
        ),
    ] = None,
    shorten_to_context: Annotated[
        bool,
        typer.Option(
            "--shorten-to-context",
            help="With --max-model-len: cut the output at the context (HTTP 200, finish_reason "
            "length) instead of the 400, as vLLM 0.32 does when the prompt itself fits.",
        ),
    ] = False,
    reasoning_parser: Annotated[
        bool,
        typer.Option(
            "--reasoning-parser",
            help="As vLLM's --reasoning-parser: text before </think> goes to the reasoning "
            "field; without </think> all of it does and content is null.",
        ),
    ] = False,
    tool_call_parser: Annotated[
        bool,
        typer.Option(
            "--tool-call-parser",
            help="As vLLM's --tool-call-parser hermes: <tool_call> blocks go to tool_calls.",
        ),
    ] = False,
    block_size: Annotated[
        int,
        typer.Option(
            "--block-size",
            help="Prefix-cache block [tokens] (vLLM: 16 on GPUs, 128 on CPUs), reported on "
            "/metrics (vLLM flavors) and /get_server_info (sglang).",
            min=1,
        ),
    ] = 16,
    weights_route: Annotated[
        str | None,
        typer.Option(
            "--weights-route",
            help="vLLM flavors: a full-weights route taking {model_path} (e.g. /update_weights, "
            "as prime-rl adds); runtime LoRA routes follow VLLM_ALLOW_RUNTIME_LORA_UPDATING.",
        ),
    ] = None,
) -> None:
    """Run a scripted OpenAI-compatible policy server in the foreground (Ctrl-C to stop).

    It is NOT a model: it answers in the Qwen computer-use format from a script or from
    deterministic defaults, with synthetic token ids and logprobs, for tests, demos and wiring
    up a trainer before a model exists.
    """
    from ..policy.key import policy_api_key
    from ..policy.scripted import FLAVORS, Faults, Latency, ScriptedPolicyServer

    if flavor not in FLAVORS:
        fail(f"--flavor must be one of {', '.join(FLAVORS)}, got {flavor!r}")
    if hang_mode not in ("sleep", "trickle"):
        fail(f"--hang-mode must be sleep or trickle, got {hang_mode!r}")
    if weights_route is not None and not flavor.startswith("vllm"):
        fail(
            f"--weights-route is a vLLM flavor's route; --flavor {flavor} "
            + (
                "has its own (/update_weights_from_disk)"
                if flavor == "sglang"
                else "loads no weights"
            )
            + " (fix: drop --weights-route, or --flavor vllm)"
        )
    key = policy_api_key()
    if require_key and not key:
        fail("--require-key needs LEGATO_POLICY_KEY set in the environment")
    faults = Faults(
        hang_every=hang_every,
        hang_mode=hang_mode,  # type: ignore[arg-type]
        error_every=error_every,
        error_rate=error_rate,
        error_status=error_status,
        image_limit=image_limit,
        reject_unknown_fields=reject_unknown,
        no_logprobs=no_logprobs,
        cache_report=not no_cache_report,
        max_model_len=max_model_len,
        shorten_to_context=shorten_to_context,
        seed=seed,
    )
    try:
        server = ScriptedPolicyServer(
            flavor=flavor,
            script=script,
            model=model,
            host=host,
            port=port,
            faults=faults,
            latency=Latency(latency, sigma, seed),
            api_key=key if require_key else None,
            image_tokens=image_tokens,
            weights_route=weights_route,
            reasoning_parser=reasoning_parser,
            tool_call_parser=tool_call_parser,
            block_size=block_size,
        )
    except (ValueError, OSError) as exc:
        fail(f"--script {script}: {exc}" if script else str(exc))
    try:
        server.serve_forever()
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc} (fix: --port)")
