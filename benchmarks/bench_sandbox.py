"""Benchmark sandboxed local desktops against unsandboxed ones, in the same run.

    python benchmarks/bench_sandbox.py [--width 1280 --height 720] [--n 10] [--json out.json]
                                       [--network host|none|own]

Starts three real desktop servers (Xvfb + openbox; taking turns, so machine load hits all
alike) and measures:
  reset      reset -> ready of a terminal task (xterm), LocalDesktop.reset + wait_after_reset
             (and the server's own revert_s of the revert: switching to the spare sandbox, and
             with --network own starting its pasta):
             sandboxed revert (the previous attempt wrote /etc via sudo, so the server drops the
             sandbox's overlay and starts a new one; X stays), sandboxed fast reset, and the
             unsandboxed full restart (Xvfb + openbox restarted: the local revert before sandboxes)
  act        POST /legato/act round trip for a click and a 20-character type into l3afpad (ms),
             sandboxed vs unsandboxed (input goes through XTest on the host either way)
  ready      ready_s after that typing (s), sandboxed vs unsandboxed
  execute    POST /execute of `true` (ms): nsenter into the sandbox vs a plain spawn
--network: the sandboxed desktop's network (``own``: a namespace of its own connected by pasta,
which a revert starts anew). Numbers are medians with (min-max). Needs root (sandboxes), Xvfb, openbox, l3afpad, xterm.
"""

from __future__ import annotations

import asyncio
import json
import time

from bench_local_desktop import EDITOR, TERMINAL, fmt, results_table, screen_parser, summary
from rich.console import Console

from legato_pipelines.actions import Action
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.desktops.server import open_local_desktops


async def open_one(width: int, height: int, **options):
    fast = options.pop("fast_reset", True)
    config = DesktopConfig(
        backend="local", screen_width=width, screen_height=height, options=options, fast_reset=fast
    )
    (desktop,) = await open_local_desktops(config, 1)
    return desktop


async def reset_to_ready(desktop, task) -> tuple[float, str]:
    t0 = time.perf_counter()
    await desktop.reset(task)
    await desktop.wait_after_reset()
    return time.perf_counter() - t0, desktop.last_reset["kind"]


async def bench(width: int, height: int, n: int, network: str = "host") -> dict:
    sandboxed = await open_one(width, height, sandbox=True, network=network)
    plain = await open_one(width, height, sandbox=False)
    plain_full = await open_one(width, height, sandbox=False, fast_reset=False)
    results: dict = {"screen": [width, height], "n": n, "network": network}
    write_etc = "echo password | sudo -S sh -c 'echo x > /etc/legato-bench'"
    try:
        resets: dict[str, list[float]] = {"revert": [], "fast": [], "full_restart": []}
        kinds: dict[str, set[str]] = {k: set() for k in resets}
        server_revert: list[float] = []  # the server's own revert_s (sandbox switch + pasta)
        for _ in range(n):
            assert (await sandboxed.client.execute(write_etc, shell=True))["returncode"] == 0
            for name, desktop in (("revert", sandboxed), ("full_restart", plain_full)):
                seconds, kind = await reset_to_ready(desktop, TERMINAL)
                resets[name].append(seconds)
                kinds[name].add(kind)
            server_revert.append(sandboxed.last_reset.get("revert_s", float("nan")))
            seconds, kind = await reset_to_ready(sandboxed, TERMINAL)
            resets["fast"].append(seconds)
            kinds["fast"].add(kind)
        results["reset_terminal_s"] = {k: summary(v) for k, v in resets.items()}
        results["reset_kinds"] = {k: sorted(v) for k, v in kinds.items()}
        results["server_revert_ms"] = summary(server_revert, 1000)

        acts = {
            name: {"click": [], "type20": [], "ready": [], "execute": []}
            for name in ("sandboxed", "plain")
        }
        for desktop in (sandboxed, plain):
            await desktop.reset(EDITOR)
            await desktop.wait_after_reset()
        for i in range(n):
            for name, desktop in (("sandboxed", sandboxed), ("plain", plain)):
                for key, action in (
                    ("click", Action("left_click", x=width // 2, y=height // 2)),
                    ("type20", Action("type", text=f"line {i:02d} of the bench\n"[:20])),
                ):
                    t0 = time.perf_counter()
                    await desktop.act(action)
                    acts[name][key].append(time.perf_counter() - t0)
                    waited = await desktop.wait_after_action(action)
                    if key == "type20":
                        acts[name]["ready"].append(waited.ready_s)
                t0 = time.perf_counter()
                await desktop.client.execute(["true"])
                acts[name]["execute"].append(time.perf_counter() - t0)
        results["per_action"] = {
            name: {
                "act_click_ms": summary(r["click"], 1000),
                "act_type20_ms": summary(r["type20"], 1000),
                "ready_after_type_s": summary(r["ready"]),
                "execute_true_ms": summary(r["execute"], 1000),
            }
            for name, r in acts.items()
        }
    finally:
        for desktop in (sandboxed, plain, plain_full):
            await desktop.close()
    return results


def show(results: dict) -> None:
    width, height = results["screen"]
    table = results_table(
        f"sandboxed local desktops {width}x{height}, network {results.get('network', 'host')}"
    )
    for name, s in results["reset_terminal_s"].items():
        kinds = ",".join(results["reset_kinds"][name])
        table.add_row(f"reset -> ready, terminal, {name} (kind {kinds})", fmt(s, "s"))
    table.add_row(
        "server revert_s of the revert (sandbox switch)", fmt(results["server_revert_ms"], "ms")
    )
    for name, r in results["per_action"].items():
        table.add_row(f"act click ({name})", fmt(r["act_click_ms"], "ms"))
        table.add_row(f"act type 20 chars ({name})", fmt(r["act_type20_ms"], "ms"))
        table.add_row(f"ready_s after typing ({name})", fmt(r["ready_after_type_s"], "s"))
        table.add_row(f"execute `true` ({name})", fmt(r["execute_true_ms"], "ms"))
    Console().print(table)


def main() -> None:
    parser = screen_parser(__doc__)
    parser.add_argument("--network", choices=["host", "none", "own"], default="host")
    args = parser.parse_args()
    results = asyncio.run(bench(args.width, args.height, args.n, args.network))
    show(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
