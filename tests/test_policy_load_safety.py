"""Loading stays honest when runs share a server (``policy/loading.py``, ``policy/servers.py``),
against the real scripted server on loopback: two ``weights`` runs at once take turns (the
server's weights lock), weights that change under a run fail it, an adapter a live run calls is
never unloaded by another run's keep limit (and a vanished adapter says so), a folder rewritten
in place is loaded again, the fingerprint sees content, a resume under another load mode or
folder is refused, ``external`` refuses a listed adapter of another folder, bad routes and keys
are named where they enter.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import shutil
import threading
import time

import httpx
import pytest

from legato_pipelines import PolicyConfig, collect, read_records
from legato_pipelines.desktops.base import DesktopConfig
from legato_pipelines.errors import ConfigError, LoadError, ResumeError
from legato_pipelines.policy.loading import LoadSpec, fingerprint, same_fingerprint
from legato_pipelines.policy.scripted import ScriptedPolicyServer
from legato_pipelines.policy.servers import ServerState
from tests.engine_support import SECRET
from tests.test_policy_loading import adapter, weights


def tasks(label: str, n: int = 2) -> list[dict]:
    """Fake tasks whose instruction names ``label`` (to tell two runs' requests apart)."""
    return [
        {
            "task_id": f"{label}-{i}",
            "config": {"instruction": f"Task of run {label} number {i}.", "fake": {"success": 0.5}},
        }
        for i in range(n)
    ]


def run(server, out, version, load, *, label="r", act=0.0, on_record=None, group=2, steps=3):
    policy = PolicyConfig(base_url=server.url, model=server.model, version=version)
    return collect(
        tasks(label),
        policy,
        out,
        desktop=DesktopConfig(backend="fake", options={"latency": {"act": act}}),
        desktops=1,
        group=group,
        max_steps=steps,
        load=load,
        on_record=on_record,
    )


def served_by_run(server) -> dict[str, set[str]]:
    """``{run label: weights that answered its requests}`` from the recorded bodies."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    for r in server.chat_requests:
        label = r.body.split(b"Task of run ")[1].split(b" ")[0].decode()
        out[label].add(r.served)
    return dict(out)


def in_threads(*jobs) -> dict[str, object]:
    """Run ``(name, delay, fn)`` jobs at once; ``{name: result or exception}``."""
    results: dict[str, object] = {}

    def go(name, delay, fn):
        time.sleep(delay)
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            results[name] = exc

    threads = [threading.Thread(target=go, args=job) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


# -- 1. full weights: one version at a time per server -----------------------------------------


@pytest.mark.parametrize(("flavor", "route"), [("sglang", None), ("vllm", "/update_weights")])
def test_two_weights_runs_at_once_take_turns_and_each_is_served_its_own_weights(
    tmp_path, flavor, route, no_policy_key
):
    ckpts = tmp_path / "ckpts"
    one, two = weights(ckpts, "step-1"), weights(ckpts, "step-2")
    with ScriptedPolicyServer(flavor=flavor, weights_route=route, record_bodies=True) as server:
        spec = {"weights_route": route} if route else {}
        results = in_threads(
            (
                "a",
                0,
                lambda: run(
                    server,
                    tmp_path / "a",
                    "step-1",
                    LoadSpec(mode="weights", checkpoint=str(one), **spec),
                    label="a",
                    act=0.2,
                ),
            ),
            (
                "b",
                0.5,  # starts while run a collects
                lambda: run(
                    server,
                    tmp_path / "b",
                    "step-2",
                    LoadSpec(mode="weights", checkpoint=str(two), **spec),
                    label="b",
                ),
            ),
        )
        assert not any(isinstance(v, Exception) for v in results.values()), results
        assert served_by_run(server) == {"a": {"step-1"}, "b": {"step-2"}}
        # run b loaded its weights only after run a's last request
        last_a = max(r.at for r in server.chat_requests if b"run a " in r.body)
        load_b = [r.at for r in server.requests if r.path in ("/update_weights_from_disk", route)]
        assert load_b[-1] >= last_a
    after = json.loads((tmp_path / "a" / "run.json").read_text())["checkpoint"]["after"]
    assert after["checked"] is True  # the scripted vLLM route answers GET with its path


def test_a_weights_run_waits_at_most_load_wait_and_names_the_holder(tmp_path, no_policy_key):
    path = weights(tmp_path / "ckpts", "step-2")
    with ScriptedPolicyServer(flavor="sglang") as server:

        async def hold():
            state = ServerState(server.url)
            return await state.lock_weights({"version": "step-1", "pid": os.getpid()}, 0)

        held = asyncio.run(hold())
        try:
            with pytest.raises(LoadError, match=r"version 'step-1'.*--load-wait") as info:
                run(
                    server,
                    tmp_path / "run",
                    "step-2",
                    LoadSpec(mode="weights", checkpoint=str(path), wait=0.5),
                )
            assert "one version at a time per server" in str(info.value)
            assert not [r for r in server.requests if r.path == "/update_weights_from_disk"]
        finally:
            held.release()
        run(server, tmp_path / "run", "step-2", LoadSpec(mode="weights", checkpoint=str(path)))


def test_weights_changed_under_a_run_fail_it_and_run_json_says_so(tmp_path, no_policy_key):
    ckpts = tmp_path / "ckpts"
    mine, other = weights(ckpts, "step-1"), weights(ckpts, "step-9")
    with ScriptedPolicyServer(flavor="sglang") as server:

        def intruder(_line):  # a trainer outside legato swaps the weights mid-run
            if server.weights == "step-1":
                httpx.post(
                    f"{server.url}/update_weights_from_disk", json={"model_path": str(other)}
                )

        with pytest.raises(LoadError, match="weights changed during the run.*step-9"):
            run(
                server,
                tmp_path / "run",
                "step-1",
                LoadSpec(mode="weights", checkpoint=str(mine)),
                on_record=intruder,
            )
    entry = json.loads((tmp_path / "run" / "run.json").read_text())["checkpoint"]
    assert "step-9" in entry["after"]["changed"]


# -- 2. and 3. a folder rewritten in place; content in the fingerprint -------------------------


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_folder_rewritten_in_place_with_the_same_sizes_is_loaded_again(
    tmp_path, flavor, no_policy_key
):
    path = adapter(tmp_path / "ckpts", "step-3")
    spec = LoadSpec(mode="lora", checkpoint=str(path))
    with ScriptedPolicyServer(flavor=flavor, runtime_lora=True) as server:
        run(server, tmp_path / "r1", "step-3", spec)
        first = json.loads((tmp_path / "r1" / "run.json").read_text())["checkpoint"]
        assert len(server.loads) == 1
        run(server, tmp_path / "r2", "step-3", spec)  # unchanged: kept, not loaded again
        assert len(server.loads) == 1
        assert (
            "kept" in json.loads((tmp_path / "r2" / "run.json").read_text())["checkpoint"]["proof"]
        )
        weights_file = path / "adapter_model.safetensors"
        size = weights_file.stat().st_size
        weights_file.write_bytes(b"N" * size)  # the next step: same size, same config
        run(server, tmp_path / "r3", "step-3", spec)
        third = json.loads((tmp_path / "r3" / "run.json").read_text())["checkpoint"]
        assert third["fingerprint"] != first["fingerprint"]
        assert len(server.loads) == 2 and "kept" not in third["proof"]  # unloaded + loaded


def test_fingerprint_samples_content_and_survives_a_copy(tmp_path):
    path = weights(tmp_path, "step-1")
    big = path / "model-00001-of-00002.safetensors"
    big.write_bytes(b"h" * (200 << 10))  # larger than two samples: head and tail read
    first = fingerprint(path)
    assert "sample" in first["files"]["model-00001-of-00002.safetensors"]
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)  # new modification times, same content
    os.utime(copy / big.name, (1, 1))
    assert fingerprint(copy)["digest"] == first["digest"]
    with open(big, "r+b") as fh:  # a same-size rewrite near the end
        fh.seek((200 << 10) - 10)
        fh.write(b"0123456789")
    assert fingerprint(path)["digest"] != first["digest"]
    # a run.json written before samples existed still matches the unchanged folder
    now = {"fingerprint": first["digest"], "files": first["files"]}
    legacy_files = {
        n: {k: v for k, v in e.items() if k != "sample"} for n, e in first["files"].items()
    }
    from legato_pipelines.policy.loading import _digest

    legacy = {"fingerprint": _digest(legacy_files), "files": legacy_files}
    assert same_fingerprint(legacy, now)
    # (what it recorded: sizes and configs; a same-size rewrite is what it could not see)
    big.write_bytes(b"h" * 10)
    grown = fingerprint(path)
    assert not same_fingerprint(legacy, {"fingerprint": grown["digest"], "files": grown["files"]})


# -- 4. a resume under another load mode or folder ----------------------------------------------


class _Stop(Exception):
    pass


def _partial(server, out, version, spec):
    def stop(_line):
        raise _Stop

    with pytest.raises(_Stop):
        run(server, out, version, spec, on_record=stop)
    assert len(read_records(out)) == 1


def test_resume_with_another_load_mode_or_folder_is_refused_naming_the_flag(
    tmp_path, no_policy_key
):
    ckpts = tmp_path / "ckpts"
    one = weights(ckpts, "step-1")
    with ScriptedPolicyServer(flavor="sglang") as server:
        out = tmp_path / "run"
        _partial(server, out, "step-1", LoadSpec(mode="weights", checkpoint=str(one)))
        for spec, flag in [
            (LoadSpec(), "--load weights"),
            (None, "--load weights"),
            (LoadSpec(mode="none", checkpoint=str(one)), "--load weights"),
            (LoadSpec(mode="external", checkpoint=str(one)), "--load weights"),
        ]:
            with pytest.raises(ResumeError, match=flag):
                run(server, out, "step-1", spec)
        elsewhere = tmp_path / "copy" / "step-1"
        shutil.copytree(one, elsewhere)
        with pytest.raises(ResumeError, match=f"--checkpoint {one}"):
            run(server, out, "step-1", LoadSpec(mode="weights", checkpoint=str(elsewhere)))
        out2 = tmp_path / "run2"
        _partial(server, out2, "step-1", LoadSpec())  # none, no checkpoint
        with pytest.raises(ResumeError, match=r"checkpoint \(none\)"):
            run(server, out2, "step-1", LoadSpec(mode="none", checkpoint=str(one)))
        run(server, out, "step-1", LoadSpec(mode="weights", checkpoint=str(one)))  # same: resumes


# -- 5. adapters live runs call ------------------------------------------------------------------


def test_keep_never_unloads_an_adapter_a_live_run_calls(tmp_path, no_policy_key):
    ckpts = tmp_path / "ckpts"
    paths = {v: adapter(ckpts, v) for v in ("step-1", "step-2", "step-3")}
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True, record_bodies=True) as server:

        def job(version, act):
            spec = LoadSpec(mode="lora", checkpoint=str(paths[version]), keep=2)
            return lambda: run(server, tmp_path / version, version, spec, label=version, act=act)

        results = in_threads(
            ("step-1", 0, job("step-1", 0.3)),  # slow: still collecting when step-3 loads
            ("step-2", 0.2, job("step-2", 0.0)),
            ("step-3", 1.0, job("step-3", 0.0)),
        )
        assert not any(isinstance(v, Exception) for v in results.values()), results
        assert served_by_run(server) == {v: {v} for v in paths}
        proof = json.loads((tmp_path / "step-3" / "run.json").read_text())["checkpoint"]["proof"]
        assert proof.get("kept_in_use") == ["step-1"]
        assert "step-1" not in proof.get("unloaded", [])


def test_an_adapter_unloaded_mid_run_names_the_keep_setting(tmp_path, no_policy_key):
    path = adapter(tmp_path / "ckpts", "step-1")
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:

        def other_run(_line):  # someone unloads it under this run
            if "step-1" in server.adapters:
                httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "step-1"})

        with pytest.raises(LoadError) as info:
            run(
                server,
                tmp_path / "run",
                "step-1",
                LoadSpec(mode="lora", checkpoint=str(path)),
                on_record=other_run,
                group=3,
            )
    message = str(info.value)
    assert "was unloaded from the policy server" in message
    assert "LEGATO_POLICY_LOAD_KEEP" in message and "--load-keep" in message
    assert "--model" not in message


# -- 8. external checks the folder -----------------------------------------------------------


def test_external_refuses_a_listed_adapter_from_another_folder(tmp_path, no_policy_key):
    mine = adapter(tmp_path / "ckpts", "step-5")
    other = adapter(tmp_path / "other", "step-5")
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        httpx.post(
            f"{server.url}/v1/load_lora_adapter",
            json={"lora_name": "step-5", "lora_path": str(other)},
        )
        with pytest.raises(LoadError, match=f"root '{other}', not the checkpoint {mine}"):
            run(server, tmp_path / "run", "step-5", LoadSpec(mode="external", checkpoint=str(mine)))
        assert server.chat_requests == []
        link = tmp_path / "link"
        link.symlink_to(other)  # the same folder by another path: accepted
        run(server, tmp_path / "ok", "step-5", LoadSpec(mode="external", checkpoint=str(link)))


# -- 9. and 10. a bad route, a wrong key -------------------------------------------------------


@pytest.mark.parametrize("route", ["update_weights", "http://127.0.0.1:8000/update_weights"])
def test_weights_route_is_checked_where_it_enters(route):
    with pytest.raises(ConfigError, match=r"load\.weights_route: .*\(fix: --weights-route\)"):
        LoadSpec.checked(mode="weights", weights_route=route)


@pytest.mark.parametrize(
    ("flavor", "mode", "make"),
    [
        ("vllm", "lora", adapter),
        ("sglang", "lora", adapter),
        ("sglang", "weights", weights),
        ("vllm", "external", adapter),
        ("vllm", "weights", weights),
    ],
)
@pytest.mark.parametrize("key", [None, "sk-wrong-key-0000"])
def test_a_refused_key_while_loading_says_set_the_key(
    tmp_path, monkeypatch, flavor, mode, make, key
):
    if key is None:
        monkeypatch.delenv("LEGATO_POLICY_KEY", raising=False)
    else:
        monkeypatch.setenv("LEGATO_POLICY_KEY", key)
    path = make(tmp_path / "ckpts", "step-1")
    with ScriptedPolicyServer(
        flavor=flavor, runtime_lora=True, weights_route="/update_weights", api_key=SECRET
    ) as server:
        with pytest.raises(LoadError) as info:
            run(server, tmp_path / "run", "step-1", LoadSpec(mode=mode, checkpoint=str(path)))
    message = str(info.value)
    assert "fix: set LEGATO_POLICY_KEY" in message, message
    assert "--max-lora-rank" not in message and "lists nothing" not in message
    assert SECRET not in message and (key is None or key not in message)


@pytest.mark.slow
def test_cli_refuses_a_bad_weights_route_and_takes_the_new_load_flags(tmp_path, no_policy_key):
    from tests.test_engine_cli import collect_args, legato, write_tasks

    tasks_file = write_tasks(tmp_path / "tasks.json", 1)
    path = weights(tmp_path / "ckpts", "step-3")
    with ScriptedPolicyServer(flavor="vllm", weights_route="/update_weights") as server:
        for route in ("update_weights", f"{server.url}/update_weights"):
            out = legato(
                *collect_args(
                    server,
                    tasks_file,
                    tmp_path / "a",
                    "--load",
                    "weights",
                    "--checkpoint",
                    path,
                    "--weights-route",
                    route,
                )
            )
            assert out.returncode == 2, out.stderr
            assert "--weights-route" in out.stderr and "Traceback" not in out.stderr
        ok = legato(
            *collect_args(
                server,
                tasks_file,
                tmp_path / "b",
                "--load",
                "weights",
                "--checkpoint",
                path,
                "--group",
                "1",
                "--load-timeout",
                "30",
                "--load-wait",
                "5",
            )
        )
        assert ok.returncode == 0, ok.stderr
        bad = legato(*collect_args(server, tasks_file, tmp_path / "c", "--load-timeout", "0"))
        assert bad.returncode == 2 and "--load-timeout" in bad.stderr


def test_scripted_policy_refuses_a_weights_route_its_flavor_ignores():
    from tests.test_engine_cli import legato

    out = legato("scripted-policy", "--port", "0", "--flavor", "sglang", "--weights-route", "/w")
    assert out.returncode == 2
    assert "--weights-route is a vLLM flavor's route" in out.stderr
    assert "/update_weights_from_disk" in out.stderr


def test_a_404_route_names_the_server_kind_it_was_taken_for(tmp_path, no_policy_key):
    path = adapter(tmp_path / "ckpts", "step-1")
    with ScriptedPolicyServer(flavor="sglang") as server:  # told it is vLLM
        with pytest.raises(LoadError, match=r"--load-server sglang if this is a sglang server"):
            run(
                server,
                tmp_path / "run",
                "step-1",
                LoadSpec(mode="lora", checkpoint=str(path), server="vllm"),
            )


def test_each_step_keeps_the_servers_word_on_which_weights_answered(tmp_path, no_policy_key):
    """The response's system_fingerprint goes into the step's model stats when the server
    sends one (the scripted server names the weights that answered)."""
    path = adapter(tmp_path / "ckpts", "step-1")
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        run(server, tmp_path / "run", "step-1", LoadSpec(mode="lora", checkpoint=str(path)))
    prints = {
        step["model"]["system_fingerprint"]
        for record in read_records(tmp_path / "run")
        for step in record["steps"]
    }
    assert prints == {"legato-scripted-not-a-model:served=step-1"}


# -- one server, however its URL is spelled -------------------------------------------------------


def test_server_identity_is_one_for_every_spelling_of_a_loopback_server():
    from legato_pipelines.policy.servers import server_identity

    spellings = [
        "http://127.0.0.1:8000",
        "http://localhost:8000/v1/",
        "HTTP://LOCALHOST:8000/",
        "http://[::1]:8000/v1",
        "http://127.0.0.2:8000/v1",
    ]
    assert {server_identity(u) for u in spellings} == {"http://loopback:8000"}
    assert server_identity("http://127.0.0.1") == server_identity("http://localhost:80/")
    assert server_identity("http://127.0.0.1:8001") != server_identity("http://127.0.0.1:8000")
    assert server_identity("https://127.0.0.1:8000") != server_identity("http://127.0.0.1:8000")
    assert server_identity("http://127.0.0.1:8000/a/v1") == "http://loopback:8000/a"
    assert ServerState("http://localhost:8000/v1/").dir == ServerState("http://127.0.0.1:8000").dir


def test_the_weights_lock_holds_for_the_same_server_by_another_url(tmp_path, no_policy_key):
    path = weights(tmp_path / "ckpts", "step-2")
    with ScriptedPolicyServer(flavor="sglang") as server:
        other_spelling = server.url.replace("127.0.0.1", "LocalHost") + "/v1/"

        async def hold():
            state = ServerState(other_spelling)
            return await state.lock_weights({"version": "step-1", "pid": os.getpid()}, 0)

        held = asyncio.run(hold())
        try:
            with pytest.raises(LoadError, match=r"version 'step-1'.*--load-wait"):
                run(
                    server,
                    tmp_path / "run",
                    "step-2",
                    LoadSpec(mode="weights", checkpoint=str(path), wait=0.3),
                )
            assert not [r for r in server.requests if r.path == "/update_weights_from_disk"]
        finally:
            held.release()


def test_a_vllm_weights_route_that_reports_its_path_is_rechecked_after_the_run(
    tmp_path, no_policy_key
):
    ckpts = tmp_path / "ckpts"
    mine, other = weights(ckpts, "step-1"), weights(ckpts, "step-9")
    with ScriptedPolicyServer(flavor="vllm", weights_route="/update_weights") as server:

        def other_host(_line):  # another host (no shared lock) loads other weights mid-run
            if server.weights == "step-1":
                httpx.post(f"{server.url}/update_weights", json={"model_path": str(other)})

        with pytest.raises(LoadError, match=r"weights changed during the run.*GET /update_weights"):
            run(
                server,
                tmp_path / "run",
                "step-1",
                LoadSpec(mode="weights", checkpoint=str(mine)),
                on_record=other_host,
            )
    entry = json.loads((tmp_path / "run" / "run.json").read_text())["checkpoint"]
    assert "step-9" in entry["after"]["changed"]


# -- a key as Kubernetes mounts it; a key no header can carry -----------------------------------


def _everything_written(root) -> str:
    out = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                out.append(fh.read().decode("utf-8", "replace"))
    return "\n".join(out)


def test_a_key_with_a_trailing_newline_is_stripped_and_never_shown(tmp_path):
    from tests.test_engine_cli import collect_args, legato, write_tasks

    tasks_file = write_tasks(tmp_path / "tasks.json", 1)
    path = weights(tmp_path / "ckpts", "step-3")
    env = {**os.environ, "LEGATO_POLICY_KEY": SECRET + "\n"}
    with ScriptedPolicyServer(flavor="sglang", api_key=SECRET) as server:
        out = legato(
            *collect_args(
                server, tasks_file, tmp_path / "run", "--load", "weights", "--checkpoint", path
            ),
            env=env,
        )
    assert out.returncode == 0, out.stderr
    written = out.stdout + out.stderr + _everything_written(tmp_path / "run")
    assert SECRET not in written and repr(SECRET + "\n")[1:-1] not in written


def test_redact_catches_the_key_quoted_escaped(monkeypatch):
    from legato_pipelines.policy.wire import redact

    monkeypatch.setenv("LEGATO_POLICY_KEY", SECRET + "\n")
    quoted = f"Illegal header value b'Bearer {SECRET}\\n'"
    assert SECRET not in redact(quoted)
    assert SECRET not in redact(f"got {SECRET!r}")


@pytest.mark.parametrize("key", ["sk-clé-0000", "sk-two words", "sk-a\x01b"])
def test_a_key_no_header_can_carry_is_refused_naming_the_variable(tmp_path, key):
    from tests.test_engine_cli import collect_args, legato, write_tasks

    tasks_file = write_tasks(tmp_path / "tasks.json", 1)
    with ScriptedPolicyServer(flavor="vllm") as server:
        out = legato(
            *collect_args(server, tasks_file, tmp_path / "run"),
            env={**os.environ, "LEGATO_POLICY_KEY": key},
        )
        assert server.chat_requests == []
    assert out.returncode == 2, out.stderr
    assert "LEGATO_POLICY_KEY" in out.stderr and "Traceback" not in out.stderr
    assert key not in out.stderr and "clé" not in out.stderr and "words" not in out.stderr
    assert len(out.stderr.splitlines()) < 10, out.stderr


def test_a_run_whose_weights_changed_is_not_resumed_and_exports_as_changed(tmp_path, no_policy_key):
    from legato_pipelines.store.export import export_steps

    ckpts = tmp_path / "ckpts"
    mine, other = weights(ckpts, "step-1"), weights(ckpts, "step-9")
    spec = LoadSpec(mode="weights", checkpoint=str(mine))
    with ScriptedPolicyServer(flavor="sglang") as server:

        def intruder(_line):
            if server.weights == "step-1":
                httpx.post(
                    f"{server.url}/update_weights_from_disk", json={"model_path": str(other)}
                )

        with pytest.raises(LoadError, match="weights changed during the run"):
            run(server, tmp_path / "run", "step-1", spec, on_record=intruder)
        with pytest.raises(ResumeError, match=r"weights changed under it.*fresh --out"):
            run(server, tmp_path / "run", "step-1", spec)
    table = export_steps(tmp_path / "run")
    assert table.num_rows and set(table.column("load_proof").to_pylist()) == {"changed"}


@pytest.mark.parametrize("flavor", ["vllm", "sglang"])
def test_an_adapter_a_live_run_leases_is_not_replaced_under_it(tmp_path, flavor, no_policy_key):
    from legato_pipelines.policy.servers import release_path

    first = adapter(tmp_path / "old", "step-1")
    second = adapter(tmp_path / "new", "step-1")  # the same name from another folder
    with ScriptedPolicyServer(flavor=flavor, runtime_lora=True) as server:
        run(server, tmp_path / "r1", "step-1", LoadSpec(mode="lora", checkpoint=str(first)))
        lease = ServerState(server.url).lease("step-1", {"version": "step-1"})  # a live run
        try:
            with pytest.raises(LoadError, match=rf"a live run still calls it .*pid {os.getpid()}"):
                run(
                    server,
                    tmp_path / "r2",
                    "step-1",
                    LoadSpec(mode="lora", checkpoint=str(second), wait=0.3),
                )
            assert len(server.loads) == 1  # nothing unloaded or loaded
            assert server.adapters["step-1"] == str(first)
        finally:
            release_path(lease)
        run(server, tmp_path / "r2", "step-1", LoadSpec(mode="lora", checkpoint=str(second)))
        assert len(server.loads) == 2


def test_external_refuses_an_adapter_the_server_loaded_through_a_symlink(tmp_path, no_policy_key):
    real = adapter(tmp_path / "ckpts", "step-5")
    current = tmp_path / "ckpts" / "current"
    current.symlink_to(real)  # the trainer loaded ckpt/current, which may be repointed since
    with ScriptedPolicyServer(flavor="vllm", runtime_lora=True) as server:
        httpx.post(
            f"{server.url}/v1/load_lora_adapter",
            json={"lora_name": "step-5", "lora_path": str(current)},
        )
        with pytest.raises(LoadError, match=r"through a symlink.*by their real folder"):
            run(server, tmp_path / "run", "step-5", LoadSpec(mode="external", checkpoint=str(real)))
        assert server.chat_requests == []


def test_a_load_state_dir_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    from tests.test_engine_cli import collect_args, legato, write_tasks

    tasks_file = write_tasks(tmp_path / "tasks.json", 1)
    path = weights(tmp_path / "ckpts", "step-3")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    env = {**os.environ, "LEGATO_LOAD_STATE": str(blocker / "state")}
    env.pop("LEGATO_POLICY_KEY", None)
    with ScriptedPolicyServer(flavor="sglang") as server:
        out = legato(
            *collect_args(
                server, tasks_file, tmp_path / "run", "--load", "weights", "--checkpoint", path
            ),
            env=env,
        )
    assert out.returncode == 2, out.stderr
    assert "LEGATO_LOAD_STATE" in out.stderr and "--out" not in out.stderr, out.stderr
