"""A closed RL loop on one machine, with real parts (examples/closed_loop/README.md, docs/trainer.md §6).

::

    PYTHONPATH=$PWD python3 examples/closed_loop/run.py --work /tmp/closed-loop [--versions 3]
        [--tasks 3] [--group 2] [--max-steps 2] [--json]

needs the vLLM CPU venv (``scripts/vllm_venv.sh``) and the local desktops' apps (Xvfb,
openbox, xterm, l3afpad: ``scripts/setup.sh``). Every version ``step-N`` goes round once:

1. **weights**: ``step-0`` is a seeded random LoRA adapter; ``step-N+1`` is written by
   ``trainer_step.py step`` (plain PyTorch, under the venv's python) from ``step-N``'s sample
   rows in the lake: one GRPO-style step (stored old logprobs, group advantages, response
   tokens only) on the adapter's A/B matrices. The adapter lands in the checkpoints directory
   (PEFT format, renamed into place); its merged full weights go to ``merged/step-N``;
2. **load + collect**: the project's ``checkpoint_sensor`` is evaluated once (one tick, as the
   daemon does), and its run request is materialized with Dagster (``dg.materialize`` of the
   collection assets, the request's partition and tags): ``rollout_batch`` loads the adapter
   into the real vLLM server (``load=lora``: ``/v1/load_lora_adapter``, the load proof, the
   fingerprint's ``cache_salt``) and collects on local Xvfb desktops; ``rollouts`` /
   ``training_samples`` / ``profile_summary`` write the lake;
3. **gap check**: ``training_samples``' ``train_inference_gap`` asset check recomputes the
   rows' logprobs with ``merged/step-N`` (transformers, float32) and must pass; the loop also
   measures ``step-N``'s rows against ``step-N-1``'s weights, which must differ.

The server runs in float32 (``--dtype float32``) so that the served adapter and the merged
weights agree to ~1e-5 and one trainer step's change stands out. The tiny model's weights are
random: rewards are ~all 0 and advantages 0; the loop proves the plumbing (version <->
weights <-> samples), not learning.

Prints a summary (``--json``: one JSON object, also written to ``WORK/report.json``) with the
wall time of every phase. Exits 1 when a check of the loop fails (the report says which).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# The gap asset check is declared when LEGATO_GAP_MODEL is set at import; each run names its
# own version's merged weights in run config (training_samples: gap_model).
os.environ.setdefault("LEGATO_GAP_MODEL", "per-version")
os.environ.pop("LEGATO_POLICY_KEY", None)
sys.path.insert(0, str(REPO))

import dagster as dg  # noqa: E402

from legato_pipelines.errors import LegatoError  # noqa: E402
from legato_pipelines.policy.loading import fingerprint  # noqa: E402
from legato_pipelines.resources import (  # noqa: E402
    CheckpointSourceResource,
    DesktopPoolResource,
    PolicyResource,
)
from legato_pipelines.store.lake import Lake, read_samples  # noqa: E402
from legato_pipelines.trainer.gap import DEFAULT_MAX_MEAN_ABS, version_gap  # noqa: E402
from tests.dagster_support import launch_request, sensor_tick  # noqa: E402
from tests.vllm_support import VllmServer, build_model, vllm_python  # noqa: E402

LOCAL_SUITE = REPO / "examples" / "tasks" / "local" / "tasks.json"
QUICK_TASKS = ("local-term-mkdir", "local-edit-append", "local-term-sort", "local-edit-replace")


class Clock:
    """Wall time per phase [s], in the order they ran."""

    def __init__(self):
        self.start = time.monotonic()
        self.phases: list[dict] = []

    def run(self, name: str, fn, *args, **kw):
        t0 = time.monotonic()
        try:
            return fn(*args, **kw)
        finally:
            self.phases.append({"phase": name, "s": round(time.monotonic() - t0, 1)})
            print(
                f"[{time.monotonic() - self.start:6.1f} s] {name}: {self.phases[-1]['s']} s",
                file=sys.stderr,
                flush=True,
            )

    def total(self) -> float:
        return round(time.monotonic() - self.start, 1)


def placeholder_bias(base: Path) -> dict[str, float]:
    """``logit_bias`` (vLLM's OpenAI field) of -100 on the model's vision placeholder ids
    (``image_token_id``, ``video_token_id``, ``vision_start_token_id``,
    ``vision_end_token_id`` of its ``config.json``): the random-weight model samples them now
    and then, and a response holding ``<|image_pad|>`` cannot be recomputed by transformers'
    Qwen-VL (it counts every such id in ``input_ids`` as an image slot: "Image features and
    image tokens do not match"). vLLM's default ``raw_logprobs`` are taken before the bias,
    so the stored logprobs stay the model's own. A trained Qwen-VL does not emit them."""
    config = json.loads((base / "config.json").read_text())
    keys = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return {str(config[k]): -100.0 for k in keys if config.get(k) is not None}


def trainer(*args: str) -> dict:
    """``trainer_step.py ARGS`` under the vLLM venv's python (torch); its JSON answer."""
    python = vllm_python()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(python), str(HERE / "trainer_step.py"), *args],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"trainer_step.py {args[0]} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def train(lake: Lake, version: str, base: Path, ckpts: Path, merged: Path, nxt: str) -> dict:
    """Version ``version``'s rows (valid logprobs) -> the adapter ``ckpts/nxt``."""
    import pyarrow.dataset as ds

    table = read_samples(lake, [version], ds.field("logprobs_valid") == True)  # noqa: E712
    rows = merged.parent / f"rows-{version}.jsonl"
    rows.write_text("".join(json.dumps(r, default=str) + "\n" for r in table.to_pylist()))
    return trainer(
        "step", "--base", str(base), "--prev", str(ckpts / version), "--rows", str(rows),
        "--images", str(lake.pull_run(version) / "images"),
        "--out", str(ckpts / nxt), "--merged", str(merged / nxt),
    )  # fmt: skip


def materialize(instance, request, policy, lake_root, tasks_file, args, gap_model):
    """The run a sensor's request asks for, as the daemon would launch it."""
    run_config = {
        "ops": {
            "rollout_batch": {
                "config": {
                    "tasks": str(tasks_file),
                    "group": args.group,
                    "max_steps": args.max_steps,
                    "image_max": 2,
                    "spares": 0,
                    "seed": 0,
                }
            },
            "training_samples": {
                "config": {
                    "gap_model": str(gap_model),
                    "gap_python": str(vllm_python()),
                    "gap_rows": args.gap_rows,
                }
            },
        }
    }
    desktops = DesktopPoolResource(backend="local", desktops=1)
    return launch_request(instance, request, policy, lake_root, desktops, run_config, False)


def gap_result(run) -> dict:
    """The ``train_inference_gap`` check's evaluation in a run: passed and its figures."""
    for event in run.get_asset_check_evaluations():
        if event.check_name == "train_inference_gap":
            meta = {k: getattr(v, "value", v) for k, v in event.metadata.items()}
            return {"passed": event.passed, **{k: meta[k] for k in meta if k != "per_row"}}
    return {"passed": False, "error": "no train_inference_gap evaluation in the run"}


def lineage(lake: Lake, version: str) -> list[dict]:
    return lake.query(
        "SELECT DISTINCT served_model, checkpoint_path, checkpoint_fingerprint FROM samples "
        f"WHERE policy_version = '{version}'"
    ).to_pylist()


def loop(args) -> dict:
    """The whole loop (module doc); the report."""
    clock = Clock()
    work = args.work.resolve()
    if work.exists():
        shutil.rmtree(work)
    base, ckpts, merged, lake_root = work / "base", work / "ckpts", work / "merged", work / "lake"
    ckpts.mkdir(parents=True)
    merged.mkdir()
    (work / "dagster").mkdir()
    tasks = [t for t in json.loads(LOCAL_SUITE.read_text()) if t["task_id"] in QUICK_TASKS]
    tasks = sorted(tasks, key=lambda t: QUICK_TASKS.index(t["task_id"]))[: args.tasks]
    tasks_file = work / "tasks.json"
    tasks_file.write_text(json.dumps(tasks))

    clock.run("build tiny model", build_model, base, "qwen3_vl", 0)
    server = VllmServer(base, work / "vllm.log", extra_args=("--dtype", "float32")).launch()
    report: dict = {"versions": [], "tasks": [t["task_id"] for t in tasks], "group": args.group}
    failures: list[str] = []
    try:
        report["init"] = clock.run(
            "trainer init (step-0)", trainer, "init", "--base", str(base),
            "--out", str(ckpts / "step-0"), "--merged", str(merged / "step-0"),
        )  # fmt: skip
        clock.run("vLLM start (float32)", server.wait_ready)
        lake = Lake(lake_root)
        policy = PolicyResource(
            base_url=server.url, model=server.model, load="lora", load_keep=2,
            max_tokens=args.max_tokens, sampling_seed=1234,
            extra_body={"logit_bias": placeholder_bias(base)},
        )  # fmt: skip
        source = CheckpointSourceResource(directory=str(ckpts), stable_s=0)
        cursor = None
        with dg.DagsterInstance.local_temp(str(work / "dagster")) as instance:
            for n in range(args.versions):
                version = f"step-{n}"
                if n > 0:
                    trained = clock.run(
                        f"trainer step {version}", train, lake, f"step-{n - 1}", base, ckpts,
                        merged, version,
                    )  # fmt: skip
                else:
                    trained = report["init"]
                result = sensor_tick(instance, cursor, source, policy)
                cursor = result.cursor
                requests = list(getattr(result, "run_requests", None) or [])
                if [r.partition_key for r in requests] != [version]:
                    failures.append(f"{version}: the sensor requested {requests!r}")
                    break
                run = clock.run(
                    f"sensor run {version} (load + collect + lake + gap check)", materialize,
                    instance, requests[0], policy, lake_root, tasks_file, args,
                    merged / version,
                )  # fmt: skip
                entry = {
                    "version": version,
                    "run_success": run.success,
                    "trainer": trained,
                    "fingerprint": fingerprint(ckpts / version)["digest"],
                    "load": instance.get_run_by_id(run.run_id).tags.get("legato/load"),
                }
                if not run.success:
                    failures.append(f"{version}: the Dagster run failed ({run.run_id})")
                    report["versions"].append(entry)
                    break
                entry["rows"] = lake.query(
                    f"SELECT count(*) AS n FROM samples WHERE policy_version = '{version}'"
                ).to_pylist()[0]["n"]
                entry["lineage"] = lineage(lake, version)
                want = {
                    "served_model": version,
                    "checkpoint_path": str((ckpts / version).resolve()),
                    "checkpoint_fingerprint": entry["fingerprint"],
                }
                if entry["lineage"] != [want]:
                    failures.append(f"{version}: rows name {entry['lineage']}, not {want}")
                entry["gap_check"] = gap_result(run)
                if not entry["gap_check"]["passed"]:
                    failures.append(f"{version}: the gap check against its own weights failed")
                if n > 0:
                    try:
                        other = clock.run(
                            f"gap {version} rows vs step-{n - 1} weights", version_gap, lake,
                            version, merged / f"step-{n - 1}", rows=args.gap_rows,
                            python=vllm_python(),
                        )  # fmt: skip
                    except LegatoError as exc:
                        failures.append(f"{version}: the gap against step-{n - 1}: {exc}")
                        report["versions"].append(entry)
                        break
                    entry["gap_vs_previous"] = {
                        k: other[k]
                        for k in ("rows", "tokens", "mean_abs_dlogp", "max_abs_dlogp", "k3_kl")
                        if k in other
                    }
                    own = entry["gap_check"].get("mean_abs_dlogp")
                    if not other["mean_abs_dlogp"] > max(DEFAULT_MAX_MEAN_ABS, 10 * (own or 0)):
                        failures.append(
                            f"{version}: its rows against step-{n - 1}'s weights differ by only "
                            f"{other['mean_abs_dlogp']:.3g} (own weights: {own})"
                        )
                report["versions"].append(entry)
    finally:
        clock.run("vLLM stop", server.stop)
    report.update(
        failures=failures, ok=not failures, phases=clock.phases, total_s=clock.total(),
        work=str(work),
    )  # fmt: skip
    (work / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work",
        type=Path,
        default=Path("/tmp/legato-closed-loop"),
        help="work folder (emptied first): model, checkpoints, lake, logs",
    )
    parser.add_argument("--versions", type=int, default=3, help="policy versions (>= 2)")
    parser.add_argument("--tasks", type=int, default=3, help=f"tasks of {QUICK_TASKS}")
    parser.add_argument("--group", type=int, default=2, help="attempts per task (GRPO group)")
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--gap-rows", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if vllm_python() is None:
        print("needs the vLLM CPU venv: run scripts/vllm_venv.sh", file=sys.stderr)
        return 2
    report = loop(args)
    if args.json:
        print(json.dumps(report, default=str))
    else:
        for v in report["versions"]:
            gap = v.get("gap_check", {})
            prev = v.get("gap_vs_previous", {})
            print(
                f"{v['version']}: run {'ok' if v['run_success'] else 'FAILED'}, "
                f"{v.get('rows')} rows, served {[r['served_model'] for r in v.get('lineage', [])]}, "
                f"gap own weights {gap.get('mean_abs_dlogp')} (passed {gap.get('passed')}), "
                f"vs previous {prev.get('mean_abs_dlogp')}"
            )
        print(
            f"total {report['total_s']} s; {'OK' if report['ok'] else 'FAILED: '}"
            + "; ".join(report["failures"])
        )
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
