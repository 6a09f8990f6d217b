"""The `legato collect/export/profile` commands as users run them: real subprocesses, a real
kill -9 mid-batch and resume, the secret key never written anywhere, hung model calls cut.
Calls that end at the argument and input checks (exit status 2, nothing started) run the same
command in this process (:func:`legato_checks`): a subprocess there only adds an interpreter's
start-up."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from legato_pipelines import read_records
from legato_pipelines.cli import app
from tests.engine_support import SECRET, fake_tasks


def legato(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "legato_pipelines", *map(str, args)],
        capture_output=True,
        text=True,
        env=env or os.environ.copy(),
        timeout=120,
        **kw,
    )


def legato_checks(*args, env=None) -> subprocess.CompletedProcess:
    """``legato ARGS`` in this process (typer's CliRunner), as a ``CompletedProcess`` like
    :func:`legato`'s, for a call that ends at its argument and input checks. An exception the
    command lets escape (what a user would see as a traceback) fails the test."""
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, result.stderr)


def write_tasks(path: Path, n: int, success: float = 0.5) -> Path:
    path.write_text(json.dumps(fake_tasks(n, success)))
    return path


def collect_args(server, tasks, out, *extra):
    return [
        "collect",
        "--backend",
        "fake",
        "--tasks",
        tasks,
        "--policy-url",
        server.url,
        "--model",
        server.model,
        "--version",
        "step-3",
        "--out",
        out,
        "--no-progress",
        *extra,
    ]


@pytest.mark.slow
def test_kill_9_mid_batch_then_resume(policy_server, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.json", 8)
    out = tmp_path / "run"
    args = collect_args(
        policy_server,
        tasks,
        out,
        "--desktops",
        "2",
        "--group",
        "3",
        "--max-steps",
        "4",
        "--desktop-option",
        'latency={"act": 0.05, "reset": 0.05}',
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "legato_pipelines", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(read_records(out)) < 6:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = read_records(out)
    assert 6 <= len(before) < 24, "the kill must land mid-batch"
    done = legato(*args, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    records = read_records(out)
    assert records[: len(before)] == before  # nothing already collected is lost or rewritten
    assert summary["missing"] == 0 and summary["groups"]["closed"] == 8
    oks = Counter((r["task_id"], r["attempt"]) for r in records if r["status"] == "ok")
    assert set(oks.values()) == {1} and len(oks) == 24  # no logical attempt has two ok records


@pytest.mark.slow
def test_export_and_profile_commands(policy_server, tmp_path):
    tasks = write_tasks(tmp_path / "tasks.json", 2)
    out = tmp_path / "run"
    assert (
        legato(
            *collect_args(policy_server, tasks, out, "--group", "2", "--max-steps", "3")
        ).returncode
        == 0
    )
    for ext in ("parquet", "jsonl"):
        res = legato("export", out, "--out", tmp_path / f"samples.{ext}")
        assert res.returncode == 0, res.stderr
    table = pq.read_table(tmp_path / "samples.parquet")
    lines = (tmp_path / "samples.jsonl").read_text().splitlines()
    assert table.num_rows == len(lines) == sum(r["n_steps"] for r in read_records(out))
    assert {
        "response_token_ids",
        "response_logprobs",
        "advantage",
        "policy_version",
        "messages",
    } <= set(table.column_names)
    inline = legato("export", out, "--out", tmp_path / "inline.jsonl", "--inline-images")
    assert (
        inline.returncode == 0
        and "data:image/png;base64," in (tmp_path / "inline.jsonl").read_text()
    )
    prof = legato("profile", out, "--json")
    assert prof.returncode == 0
    recomputed = json.loads(prof.stdout)
    assert recomputed["counts"]["ok"] == 4
    # the records' span, said so: collect's own summary has the session's wall (longer)
    session = json.loads((out / "summary.json").read_text())
    assert (recomputed["wall_of"], session["wall_of"]) == ("records", "session")
    assert recomputed["wall_s"] <= session["wall_s"]
    table_out = legato("profile", out)
    assert (
        "success rate" in table_out.stdout
        and "model call" in table_out.stdout
        and "desktops" in table_out.stdout
        and "(records: first start to last end)" in table_out.stdout
    )
    bad = legato("export", out, "--out", tmp_path / "samples.csv")
    assert bad.returncode != 0 and ".parquet or .jsonl" in bad.stderr


def test_bad_input_names_the_field(policy_server, tmp_path):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(
        json.dumps(
            [{"task_id": "a", "config": {"instruction": "x"}}, {"task_id": "b", "config": {}}]
        )
    )
    res = legato_checks(*collect_args(policy_server, tasks, tmp_path / "run"))
    assert res.returncode == 2
    assert "tasks[1]" in res.stderr and "'b'" in res.stderr and "instruction" in res.stderr
    assert not (tmp_path / "run").exists()
    tasks.write_text(
        json.dumps(
            [
                {"task_id": "a", "config": {"instruction": "x"}},
                {"task_id": "b", "config": {"evaluator": {"func": "infeasible"}}},
                {"domain": "os"},
            ]
        )
    )
    res = legato_checks(*collect_args(policy_server, tasks, tmp_path / "run"))
    assert res.returncode == 2 and not (tmp_path / "run").exists()
    text = " ".join(res.stderr.split())
    assert "2 problems in the task list" in text
    assert "tasks[1] (task_id 'b'): field 'config.instruction' is missing" in text
    assert "tasks[2]: field 'task_id' is missing" in text
    res = legato_checks(
        *collect_args(
            policy_server, write_tasks(tmp_path / "ok.json", 1), tmp_path / "run", "--group", "0"
        )
    )
    assert res.returncode == 2 and "group" in res.stderr
    res = legato_checks(
        *collect_args(policy_server, tmp_path / "ok.json", tmp_path / "run", "--fixed-wait", "2")
    )
    assert res.returncode == 2 and "ready" in res.stderr.lower()
    res = legato_checks(
        "collect",
        "--backend",
        "fake",
        "--tasks",
        tmp_path / "ok.json",
        "--policy-url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--out",
        tmp_path / "run2",
        "--no-progress",
    )
    assert res.returncode == 2 and "127.0.0.1:9" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_secret_key_never_written(tmp_path):
    from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer

    env = os.environ | {"LEGATO_POLICY_KEY": SECRET}
    tasks = write_tasks(tmp_path / "tasks.json", 2)
    with ScriptedPolicyServer(
        flavor="vllm", faults=Faults(error_every=3), api_key=SECRET
    ) as server:
        res = legato(
            *collect_args(
                server,
                tasks,
                tmp_path / "run",
                "--group",
                "2",
                "--retries",
                "0",
                "--desktop-option",
                'faults={"reset_failure": 0.3}',
            ),
            env=env,
        )
        assert res.returncode in (0, 1), res.stderr  # 1 when every attempt met a failing call
        assert all(
            r.authorized for r in server.requests
        )  # the key did go to the server, as a Bearer header
        assert (
            legato("export", tmp_path / "run", "--out", tmp_path / "s.jsonl", env=env).returncode
            == 0
        )
        prof = legato("profile", tmp_path / "run", env=env)
    outputs = [res.stdout, res.stderr, prof.stdout, prof.stderr]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            outputs.append(path.read_bytes().decode("latin-1"))
    assert not any(SECRET in text for text in outputs)
    assert any(
        r["status"] == "error" for r in read_records(tmp_path / "run")
    )  # failing calls were exercised


def test_a_key_in_the_policy_url_query_is_refused_and_never_echoed(policy_server, tmp_path):
    """``--policy-url 'http://host/?key=sk-...'`` is refused with exit status 2 before any
    request (it used to call ``.../?key=sk-.../v1/models`` and quote that URL), by ``collect``
    and ``probe`` alike, the key nowhere in their output."""
    tasks = write_tasks(tmp_path / "tasks.json", 1)
    url = f"{policy_server.url}/?key={SECRET}"
    args = collect_args(policy_server, tasks, tmp_path / "run")
    args[args.index(policy_server.url)] = url
    res = legato_checks(*args)
    probe = legato_checks("probe", "--policy-url", url, "--model", policy_server.model)
    for done in (res, probe):
        said = " ".join(done.stderr.split())
        assert done.returncode == 2 and "query string" in said and "LEGATO_POLICY_KEY" in said
        assert SECRET not in done.stdout + done.stderr and "Traceback" not in said
    assert not policy_server.requests and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_hung_calls_are_cut_and_profiled(tmp_path):
    from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer

    tasks = write_tasks(tmp_path / "tasks.json", 3)
    step_timeout, retries = 0.5, 3  # a hung call is retried: an attempt never ends in error
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(hang_every=7)) as server:
        res = legato(
            *collect_args(
                server,
                tasks,
                tmp_path / "run",
                "--group",
                "3",
                "--max-steps",
                "6",
                "--step-timeout",
                step_timeout,
                "--retries",
                retries,
                "--json",
            )
        )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["missing"] == 0 and summary["hung_calls"] > 0
    bound = step_timeout * (retries + 1) + 2.0  # plus backoff
    for r in read_records(tmp_path / "run"):
        for s in r["steps"]:
            assert s["model"]["seconds"] <= bound


def test_output_paths_and_unusable_batches_are_clear(tmp_path):
    from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer

    tasks = write_tasks(tmp_path / "tasks.json", 1)
    (tmp_path / "a-file").write_text("x")
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(no_logprobs=True)) as server:
        res = legato_checks(*collect_args(server, tasks, tmp_path / "a-file"))
        assert res.returncode == 2 and "is a file" in res.stderr and "Traceback" not in res.stderr
        (tmp_path / "mine").mkdir()
        (tmp_path / "mine" / "summary.json").write_text("{}")
        res = legato_checks(*collect_args(server, tasks, tmp_path / "mine"))
        said = " ".join(res.stderr.split())
        assert res.returncode == 2 and "not a run directory" in said and "--out" in said
        assert (tmp_path / "mine" / "summary.json").read_text() == "{}"
        res = legato(*collect_args(server, tasks, tmp_path / "run", "--group", "1"))
    assert res.returncode == 0
    assert "no logprobs" in res.stderr and "legato probe" in res.stderr
    (tmp_path / "dir.parquet").mkdir()
    res = legato_checks("export", tmp_path / "run", "--out", tmp_path / "dir.parquet")
    assert res.returncode == 2 and "--out" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_export_never_overwrites_its_run_and_failed_batches_exit_nonzero(policy_server, tmp_path):
    from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer

    tasks = write_tasks(tmp_path / "tasks.json", 2)
    assert (
        legato(*collect_args(policy_server, tasks, tmp_path / "run", "--group", "1")).returncode
        == 0
    )
    before = (tmp_path / "run" / "rollouts.jsonl").read_bytes()
    res = legato_checks("export", tmp_path / "run", "--out", tmp_path / "run" / "rollouts.jsonl")
    assert res.returncode == 2 and "inside the run directory" in res.stderr
    assert (tmp_path / "run" / "rollouts.jsonl").read_bytes() == before
    with ScriptedPolicyServer(flavor="vllm", faults=Faults(error_every=1)) as server:
        res = legato(
            *collect_args(server, tasks, tmp_path / "failed", "--group", "1", "--retries", "0")
        )
    assert res.returncode == 1 and "no attempt was graded" in res.stderr


@pytest.mark.slow
def test_a_policy_outage_exits_1_saying_how_to_resume_and_the_resume_completes(
    policy_server, tmp_path
):
    """The server fails every call once the first record is written: the batch ends with
    groups left open, exit status 1 and a line saying how many, the errors by kind and how to
    resume; the same command then re-runs those attempts and exits 0."""
    tasks = write_tasks(tmp_path / "tasks.json", 4)
    out = tmp_path / "run"
    args = collect_args(
        policy_server, tasks, out, "--desktops", "1", "--group", "1", "--retries", "0"
    )
    policy_server.latency.median = 0.2  # time to cut the server off after the first record
    proc = subprocess.Popen(
        [sys.executable, "-m", "legato_pipelines", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while time.time() < deadline and not read_records(out):
        time.sleep(0.01)
    policy_server.faults.error_every = 1  # the outage
    _, stderr = proc.communicate(timeout=120)
    records = read_records(out)
    errors = sum(1 for r in records if r["status"] == "error")
    assert proc.returncode == 1, stderr
    assert any(r["status"] == "ok" for r in records) and errors
    stderr = " ".join(stderr.split())  # rich wraps long lines
    assert "no attempt was graded" not in stderr
    assert f"{errors} of 4 groups incomplete" in stderr and f"policy {errors}" in stderr
    assert "run the same command again to resume" in stderr

    policy_server.faults.error_every = 0  # the server is back
    done = legato(*args, "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["groups"] == {"total": 4, "closed": 4} and summary["retries"] == errors
    assert "incomplete" not in done.stderr


@pytest.mark.slow
def test_calls_that_time_out_count_as_hung(tmp_path):
    from legato_pipelines.policy.scripted import Faults, ScriptedPolicyServer

    tasks = write_tasks(tmp_path / "tasks.json", 2)
    with ScriptedPolicyServer(
        flavor="vllm", faults=Faults(hang_every=1, hang_mode="trickle")
    ) as server:
        res = legato(
            *collect_args(
                server,
                tasks,
                tmp_path / "run",
                "--group",
                "1",
                "--step-timeout",
                "0.5",
                "--retries",
                "1",
                "--json",
            )
        )
    assert res.returncode == 1  # nothing graded
    summary = json.loads(legato("profile", tmp_path / "run", "--json").stdout)
    assert summary["policy_errors"] == 2 and summary["hung_calls"] == 4  # 2 calls x (1 + 1 retry)


def test_screen_flag_sets_the_desktops_screen_size(policy_server, tmp_path):
    """``--screen WxH`` is the fake desktops' screen: a 1920x1080 screen reaches the model as
    qwen3vl's 1920x1088 (docs/osworld.md §4); a malformed size is bad input naming the flag."""
    tasks = write_tasks(tmp_path / "tasks.json", 1)
    out = tmp_path / "run"
    extra = ("--group", "1", "--max-steps", "1", "--screen", "1920x1080")
    res = legato(*collect_args(policy_server, tasks, out, *extra))
    assert res.returncode == 0, res.stderr
    from legato_pipelines.images import png_size

    assert {png_size(p.read_bytes()) for p in (out / "images").glob("*.png")} == {(1920, 1088)}
    bad = legato_checks(
        *collect_args(policy_server, tasks, tmp_path / "bad", "--screen", "1920*1080")
    )
    assert bad.returncode == 2 and "--screen" in bad.stderr and "Traceback" not in bad.stderr


def test_backend_any_case_and_screen_bounds_name_the_flag(policy_server, tmp_path):
    """``--backend`` takes any case, as LEGATO_BACKEND does; a screen outside the desktops'
    bounds is an error naming ``--screen``, not the internal field ``screen_width``."""
    tasks = write_tasks(tmp_path / "tasks.json", 1)
    args = collect_args(policy_server, tasks, tmp_path / "run", "--group", "1", "--max-steps", "1")
    args[args.index("fake")] = "FAKE"
    res = legato(*args)
    assert res.returncode == 0, res.stderr
    bad = legato_checks(*collect_args(policy_server, tasks, tmp_path / "bad", "--screen", "10x10"))
    text = " ".join(bad.stderr.split())
    assert bad.returncode == 2 and "--screen '10x10' (width): Input should be greater" in text
    assert "screen_width" not in text and "--screen '10x10' (height)" in text
    # sampling fields are named by their flags too (a newcomer read "top_p: Input should...")
    bad = legato_checks(*collect_args(policy_server, tasks, tmp_path / "bad", "--top-p", "0"))
    text = " ".join(bad.stderr.split())
    assert bad.returncode == 2 and "--top-p: Input should be greater than 0, got 0.0" in text
    assert "(fix: --top-p)" in text and "top_p" not in text
    wrong = legato_checks(*[a if a != "FAKE" else "vm" for a in args])
    assert (
        wrong.returncode == 2 and "--backend 'vm': use one of fake, local, osworld" in wrong.stderr
    )


def _as_background_job() -> None:
    """What ``nohup legato collect ... &`` in a script starts with: SIGHUP (nohup), SIGINT
    and SIGQUIT (an asynchronous command without job control) ignored."""
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "background"),
    [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGTERM, True)],
    ids=["SIGTERM", "SIGHUP", "SIGTERM-nohup-background"],
)
def test_sigterm_mid_batch_says_how_to_resume(policy_server, tmp_path, signum, background):
    """SIGTERM (``kill``, a scheduler stopping the job) and SIGHUP (its terminal closed) stop
    a collection as Ctrl-C does: the finished records are kept, the same line says how to
    resume, exit status 128 + the signal (143, 129). Also for a collector started in the
    background with SIGINT ignored (``nohup ... &``), which went on collecting before."""
    tasks = write_tasks(tmp_path / "tasks.json", 8)
    out = tmp_path / "run"
    args = collect_args(
        policy_server, tasks, out, "--desktops", "2", "--group", "3", "--max-steps", "4",
        "--desktop-option", 'latency={"act": 0.05, "reset": 0.05}',
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "legato_pipelines", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_background_job if background else None,
    )
    deadline = time.time() + 60
    while time.time() < deadline and len(read_records(out)) < 4:
        time.sleep(0.05)
    proc.send_signal(signum)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 128 + signum
    said = f"interrupted by {signal.Signals(signum).name}: finished records are kept in"
    assert said in stderr and "to resume" in stderr
    assert "Traceback" not in stderr
    assert 4 <= len(read_records(out)) < 24, "the signal must land mid-batch"
    done = legato(*args, "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["groups"]["closed"] == 8


def test_view_of_an_unknown_version_lists_the_lakes_versions(policy_server, tmp_path):
    lake = tmp_path / "lake"
    tasks = write_tasks(tmp_path / "tasks.json", 1)
    out = lake / "runs" / "policy_version=step-3"
    res = legato(*collect_args(policy_server, tasks, out, "--group", "1", "--max-steps", "1"))
    assert res.returncode == 0, res.stderr
    res = legato_checks("view", "--lake", lake, "--version", "nope", "--out", tmp_path / "report")
    text = " ".join(res.stderr.split())
    assert res.returncode == 2 and "--version 'nope': no such version in the lake" in text
    assert "(versions: step-3;" in text and "not a legato run directory" not in text


def test_a_file_error_names_the_path_it_is_about(tmp_path):
    """An OSError that ends a collect is blamed on --out only when it is about the run
    directory (or names no path); a read-only cache elsewhere is named as itself."""
    from legato_pipelines.cli.collect import _os_error_message

    out = tmp_path / "run"
    inside = PermissionError(13, "Permission denied", str(out / "rollouts.jsonl"))
    assert _os_error_message(inside, out) == (
        f"--out {out}: Permission denied (fix: a writable directory)"
    )
    assert _os_error_message(OSError("disk gone"), out).startswith(f"--out {out}: ")
    elsewhere = OSError(30, "Read-only file system", "/ro/cache/legato")
    assert _os_error_message(elsewhere, out) == (
        "/ro/cache/legato: Read-only file system (fix: make it writable, or move it)"
    )
    assert _os_error_message(ConnectionResetError(104, "Connection reset by peer"), out) == (
        "Connection reset by peer"
    )
    assert _os_error_message(TimeoutError(), out) == "TimeoutError"
