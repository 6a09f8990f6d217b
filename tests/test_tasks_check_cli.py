"""``legato tasks check`` as a user runs it: a subprocess, real files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.osworld_data import LOCAL_SUITE, OSWORLD, REPO_ROOT

ROOT = REPO_ROOT


#: desktop-env 1.0.2 lacks these names test_all uses (metric, metric, getter)
LACKING = {
    "5ac2891a-eacd-4954-b339-98abba077adb": "check_play_and_exit",
    "e8172110-ec08-421b-a6f5-842e6451911f": "check_structure_sim_with_threshold",
    "93eabf48-6a27-4cb6-b963-7d5fe1e0d3a9": "chrome_appearance_mode_ui",
}


def legato(*args: str, cwd: Path = ROOT, venv: str | None = None) -> subprocess.CompletedProcess:
    """``legato tasks check ARGS``; ``venv``: ``$LEGATO_OSWORLD_VENV`` (a missing one: no
    OSWorld venv, so the own subset grades and the osworld names are not known)."""
    env = dict(os.environ, LEGATO_OSWORLD_VENV=venv) if venv else None
    return subprocess.run(
        [sys.executable, "-m", "legato_pipelines", "tasks", "check", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_json_over_the_local_suite():
    proc = legato(str(LOCAL_SUITE), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = orjson.loads(proc.stdout)
    ids = [entry["task_id"] for entry in orjson.loads(LOCAL_SUITE.read_bytes())]
    assert [t["task_id"] for t in doc["tasks"]] == ids
    totals = doc["totals"]
    assert totals["tasks"] == len(ids)
    assert totals["by_backend"]["local"] == len(ids)
    assert totals["needs_internet"] == 0 and totals["full_reset"] == 0
    assert len(doc["task_set"]) == 16


def test_osworld_dir_defaults_to_test_all(tmp_path):
    proc = legato("--osworld", str(OSWORLD), "--json", cwd=tmp_path)
    # the installed desktop-env lacks three names test_all uses: those tasks run nowhere
    assert proc.returncode == 1, proc.stderr
    doc = orjson.loads(proc.stdout)
    nowhere = {t["task_id"]: t for t in doc["tasks"] if t["backends"] == ["fake"]}
    assert set(nowhere) == set(LACKING)
    for task_id, name in LACKING.items():
        assert any(name in p for p in nowhere[task_id]["problems"]["osworld"])
    index = orjson.loads((OSWORLD / "test_all.json").read_bytes())
    assert doc["totals"]["tasks"] == sum(len(v) for v in index.values())
    assert doc["path"].endswith("test_all.json")
    # an index name relative to --osworld works too, and gives the same task set
    small = legato("test_small.json", "--osworld", str(OSWORLD), "--json", cwd=tmp_path)
    assert small.returncode in (0, 1), small.stderr
    small_index = orjson.loads((OSWORLD / "test_small.json").read_bytes())
    assert orjson.loads(small.stdout)["totals"]["tasks"] == sum(
        len(v) for v in small_index.values()
    )


def test_table_output_has_totals():
    proc = legato(str(LOCAL_SUITE))
    assert proc.returncode == 0, proc.stderr
    assert "totals" in proc.stdout and "runnable on local" in proc.stdout


def test_totals_report_only_the_checked_backend():
    """With --backend X the other backends were not judged (no support of theirs was looked
    up), so neither the table nor the JSON counts tasks runnable on them."""
    table = legato(str(LOCAL_SUITE), "--backend", "osworld")
    assert table.returncode == 0, table.stderr
    assert "runnable on osworld" in table.stdout
    for other in ("runnable on local", "runnable on fake", "evaluator supported locally"):
        assert other not in table.stdout
    assert "local desktops on this host" not in table.stdout
    doc = orjson.loads(legato(str(LOCAL_SUITE), "--backend", "fake", "--json").stdout)
    assert doc["backends_checked"] == ["fake"] and doc["local_desktops"] is None
    assert doc["totals"]["by_backend"] == {"fake": len(doc["tasks"])}
    assert "top_local_blockers" not in doc["totals"]
    assert {tuple(t["backends"]) for t in doc["tasks"]} == {("fake",)}
    assert {tuple(t["problems"]) for t in doc["tasks"]} <= {(), ("fake",)}
    local = orjson.loads(legato(str(LOCAL_SUITE), "--backend", "local", "--json").stdout)
    assert list(local["totals"]["by_backend"]) == ["local"]
    assert local["local_desktops"]["apps"] and "top_local_blockers" in local["totals"]


def test_bad_task_list_names_the_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(
        orjson.dumps(
            [{"task_id": "a", "config": {"instruction": "x", "config": [{"parameters": {}}]}}]
        )
    )
    proc = legato(str(bad), "--json")
    assert proc.returncode == 2
    assert "config.config[0].type" in proc.stderr and proc.stdout == ""
    missing = legato(str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert "--tasks" not in missing.stderr  # tasks check takes the path as its argument
    upper = legato(str(tmp_path / "nope.json"), "--backend", "LOCAL")  # any case, as collect
    assert upper.returncode == 2 and "does not exist" in upper.stderr


def write(tmp_path: Path, name: str, value) -> Path:
    path = tmp_path / name
    path.write_bytes(orjson.dumps(value))
    return path


GETTER = {"type": "vm_command_line", "command": "cat ~/a.txt"}
RULES = {"type": "rule", "rules": {"include": ["a"], "exclude": []}}
TYPO = {
    "task_id": "typo",
    "config": {
        "instruction": "x",
        "config": [{"type": "launch", "parameters": {"comand": ["xterm"]}}],
        "evaluator": {"func": "check_include_exclud", "result": GETTER, "expected": RULES},
    },
}
NO_RESULT = {
    "task_id": "nores",
    "config": {
        "instruction": "x",
        "evaluator": {"func": "check_include_exclude", "expected": RULES},
    },
}
FAKE_ONLY = {"task_id": "fake-only", "config": {"instruction": "x", "fake": {"success": 0.4}}}


def test_problems_are_listed_and_decide_the_exit_status(tmp_path):
    typo = write(tmp_path, "typo.json", [TYPO, FAKE_ONLY])
    # without an OSWorld venv the metric's name cannot be checked for osworld (desktop-env may
    # know it), but the misspelled step parameter blocks osworld too: SetupController's own
    # parameters are known without the venv
    proc = legato(str(typo), "--json", venv=str(tmp_path / "no-venv"))
    assert proc.returncode == 1, proc.stderr
    doc = orjson.loads(proc.stdout)
    by_id = {t["task_id"]: t for t in doc["tasks"]}
    assert by_id["typo"]["backends"] == ["fake"]
    osworld_without_venv = doc["problems"]["osworld"]
    assert any("'comand'" in p for p in osworld_without_venv)
    assert not any("check_include_exclud" in p for p in osworld_without_venv)
    assert by_id["typo"]["apps"] == []  # not "None": the launch step has no command
    assert by_id["fake-only"]["backends"] == ["fake"]  # no evaluator: not runnable on osworld
    local = doc["problems"]["local"]
    assert any(
        p.startswith("tasks[0] (task_id 'typo'): ") and "did you mean check_include_exclude?" in p
        for p in local
    )
    assert any("'comand'" in p and "parameters.command" in p for p in local)
    assert doc["not_runnable"]["osworld"] == ["typo", "fake-only"] and not doc["ok"]

    # with the venv, desktop-env's own list says the name does not exist: runnable nowhere
    known = legato(str(typo), "--json")
    assert known.returncode == 1
    osworld_problems = orjson.loads(known.stdout)["problems"]["osworld"]
    assert any("did you mean check_include_exclude?" in p for p in osworld_problems)

    strict = legato(str(typo), "--backend", "local")
    assert strict.returncode == 1
    assert "2 of 2 task(s) cannot run on the local backend" in strict.stderr
    assert "did you mean check_include_exclude?" in strict.stdout  # table view lists problems
    assert "app None" not in strict.stdout
    assert legato(str(typo), "--backend", "fake", "--totals-only").returncode == 0
    osworld = legato(str(typo), "--backend", "osworld", "--json")
    assert osworld.returncode == 1
    assert list(orjson.loads(osworld.stdout)["problems"]) == ["osworld"]


def test_an_evaluator_without_result_is_runnable_nowhere(tmp_path):
    proc = legato(str(write(tmp_path, "nores.json", [NO_RESULT])), "--json")
    assert proc.returncode == 1
    assert "can run on no backend" in proc.stderr and "nores" in proc.stderr
    (task,) = orjson.loads(proc.stdout)["tasks"]
    assert task["backends"] == ["fake"] and not task["evaluator_supported_locally"]
    assert any("config.evaluator.result" in p for p in task["problems"]["osworld"])


def test_bad_shapes_are_rejected_at_load(tmp_path):
    single = legato(str(write(tmp_path, "one.json", TYPO)))
    assert single.returncode == 2 and single.stdout == ""
    assert "must be a list of task entries, or an OSWorld index {domain: [ids]}" in single.stderr
    fake = {"task_id": "f", "config": {"instruction": "x", "fake": {"success": 2}}}
    proc = legato(str(write(tmp_path, "fake.json", [fake])))
    assert proc.returncode == 2
    assert "tasks[0] (task_id 'f'): field 'config.fake.success'" in proc.stderr
    assert "[0, 1]" in proc.stderr


def test_every_bad_entry_is_named_at_once(tmp_path):
    bad = [
        {"task_id": "ok", "config": {"instruction": "x"}},
        {"task_id": "no-instruction", "config": {"evaluator": {"func": "infeasible"}}},
        {"domain": "os"},
    ]
    proc = legato(str(write(tmp_path, "two_bad.json", bad)))
    assert proc.returncode == 2
    text = " ".join(proc.stderr.split())  # rich may wrap long lines
    assert "2 problems in the task list" in text
    assert "tasks[1] (task_id 'no-instruction'): field 'config.instruction' is missing" in text
    assert "tasks[2]: field 'task_id' is missing" in text
    assert "tasks[0] (task_id 'ok'):" in proc.stdout  # the valid entry's own (no evaluator)


def test_an_entry_without_instruction_hides_no_other_entrys_problems(tmp_path):
    """Issue 33: one run reports the list's structural error (an entry without
    ``instruction``) and every other entry's problems, not the latter after the first fix."""
    good = {
        "task_id": "good",
        "config": {"instruction": "x", "evaluator": {"func": "infeasible"}},
    }
    no_instruction = {"task_id": "no-instruction", "config": {"evaluator": {"func": "infeasible"}}}
    no_evaluator = {"task_id": "no-evaluator", "config": {"instruction": "x"}}
    unknown_step = {
        "task_id": "unknown-step",
        "config": {
            "instruction": "x",
            "config": [{"type": "lanuch", "parameters": {"command": ["xterm"]}}],
            "evaluator": {"func": "infeasible"},
        },
    }
    tasks = write(tmp_path, "tasks.json", [good, no_instruction, no_evaluator, unknown_step])
    proc = legato(str(tasks), "--json")
    assert proc.returncode == 2, proc.stderr
    errors = " ".join(proc.stderr.split())
    assert "tasks[1] (task_id 'no-instruction'): field 'config.instruction' is missing" in errors
    doc = orjson.loads(proc.stdout)
    assert not doc["ok"] and doc["task_set"] is None
    assert doc["list_problems"] == [
        "tasks[1] (task_id 'no-instruction'): field 'config.instruction' is missing"
    ]
    assert [t["task_id"] for t in doc["tasks"]] == ["good", "no-evaluator", "unknown-step"]
    for backend in ("local", "osworld"):
        found = doc["problems"][backend]
        # each named by its own index in the list, not its place among the valid ones
        assert any(p.startswith("tasks[2] (task_id 'no-evaluator'): ") for p in found), found
        assert any(
            p.startswith("tasks[3] (task_id 'unknown-step'): ") and "lanuch" in p for p in found
        ), found
        assert not any("'good'" in p for p in found)
    assert "evaluator" in " ".join(p for p in doc["problems"]["osworld"] if "tasks[2]" in p)
    assert "did you mean launch" in " ".join(doc["problems"]["local"])

    table = legato(str(tasks), "--backend", "local")
    assert table.returncode == 2
    out = " ".join(table.stdout.split())
    assert "tasks[2] (task_id 'no-evaluator')" in out and "tasks[3] (task_id 'unknown-step')" in out
    assert "field 'config.instruction' is missing" in " ".join(table.stderr.split())


def test_more_problems_than_a_message_shows_are_all_listed(tmp_path):
    bad = [{"task_id": f"t{i}", "config": {}} for i in range(25)]
    proc = legato(str(write(tmp_path, "many.json", bad)))
    assert proc.returncode == 2
    text = " ".join(proc.stderr.split())
    assert "25 problems" in text and "... and" not in text
    assert all(f"tasks[{i}] (task_id 't{i}')" in text for i in range(25))


def test_local_knows_the_apps_this_hosts_desktops_have(tmp_path):
    """OSWorld tasks of GIMP, VLC and the os domain (GNOME session, pyautogui commands) stop
    being refused for a missing app once the apps are installed (they are infeasible or
    gsettings tasks, so nothing else stops them)."""
    from legato_pipelines.desktops.server.apps import desktop_python_has_pyautogui, installed_apps

    apps = installed_apps()
    if not {"gimp", "vlc", "os"} <= apps or not desktop_python_has_pyautogui():
        pytest.skip("needs gimp, vlc, gnome-terminal, nautilus, dconf and pyautogui (setup.sh)")
    index = tmp_path / "index.json"
    index.write_bytes(
        orjson.dumps(
            {
                "gimp": ["e19bd559-633b-4b02-940f-d946248f088e"],
                "vlc": ["cb130f0d-d36f-4302-9838-b3baf46139b6"],
                "os": ["a4d98375-215b-4a4d-aee9-3d4370fccc41"],
            }
        )
    )
    proc = legato(str(index), "--osworld", str(OSWORLD), "--backend", "local", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    doc = orjson.loads(proc.stdout)
    assert doc["local_desktops"]["apps"] == sorted(apps) and doc["local_desktops"]["pyautogui"]
    assert doc["local_desktops"]["grader"] == "osworld"  # the venv is installed (CI too)
    # collect's --desktop-option grader=own: the verdict for the own subset, as its preflight
    own = legato(str(index), "--osworld", str(OSWORLD), "--backend", "local", "--json",
                 "--desktop-option", "grader=own")  # fmt: skip
    assert orjson.loads(own.stdout)["local_desktops"]["grader"] == "own"
    assert [t["local_blockers"] for t in doc["tasks"]] == [[], [], []]
    assert doc["totals"]["by_backend"]["local"] == 3


def test_osworld_provider_local_accepts_the_os_task_collect_runs(tmp_path):
    """OSWorld's e0df059f (sudo in setup, pyautogui): `check --backend osworld
    --osworld-provider local` says what collect's preflight says: runnable."""
    from legato_pipelines.osworld_format import preflight
    from legato_pipelines.tasks import load_tasks

    source = next(OSWORLD.glob("os/e0df059f*.json"))
    config = orjson.loads(source.read_bytes())
    path = tmp_path / "e0df059f.json"
    path.write_bytes(orjson.dumps([{"task_id": config["id"], "domain": "os", "config": config}]))
    assert preflight(load_tasks(path), "osworld") == []  # what collect checks
    proc = legato(str(path), "--backend", "osworld", "--osworld-provider", "local", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = orjson.loads(proc.stdout)
    assert doc["osworld_provider"] == "local" and doc["ok"]
    assert "osworld" in doc["tasks"][0]["backends"]
    bad = legato(str(path), "--backend", "osworld", "--osworld-provider", "nope")
    assert bad.returncode != 0 and "--osworld-provider" in bad.stdout + bad.stderr


#: Chrome started as OSWorld's chrome tasks do, tabs opened over its DevTools port by the
#: setup, graded over that port (getter open_tabs_info): its grader reaches port 9222.
TABS = {
    "task_id": "tabs",
    "domain": "chrome",
    "config": {
        "instruction": "Look at the open tab.",
        "config": [
            {"type": "launch", "parameters": {"command": ["google-chrome", "--remote-debugging-port=1337"]}},
            {"type": "launch", "parameters": {"command": ["socat", "tcp-listen:9222,fork", "tcp:localhost:1337"]}},
            {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["http://127.0.0.1:1/"]}},
        ],
        "related_apps": ["chrome"],
        "evaluator": {
            "func": "is_expected_tabs",
            "result": {"type": "open_tabs_info"},
            "expected": {"type": "rule", "rules": {"type": "url", "urls": ["http://127.0.0.1:1/"]}},
        },
    },
}  # fmt: skip


def test_the_local_network_option_is_checked_and_changes_the_verdict(tmp_path):
    """Desktop option network: a bad value is an error naming the option and its values; the
    verdict for a task whose setup and grader reach Chrome's DevTools port follows it, as
    collect's preflight does: none cuts the port off, host shares it among all desktops
    (refused with 2+ at once), own gives each desktop its own, and so does auto (the
    default) for a batch with such a task."""
    from legato_pipelines.desktops.osworld_worker import osworld_python
    from legato_pipelines.desktops.server.apps import installed_apps

    if "chrome" not in installed_apps() or osworld_python({}) is None:
        pytest.skip("needs chromium for the local desktops and the OSWorld venv (setup.sh)")
    path = write(tmp_path, "tabs.json", [TABS])
    check = [str(path), "--backend", "local", "--json"]

    bogus = legato(*check, "--desktop-option", "network=bogus")
    assert bogus.returncode == 2
    assert "desktop option 'network' must be one of auto, host, none, own, got 'bogus'" in (
        bogus.stdout + bogus.stderr
    )

    def verdict(*args: str) -> tuple[int, dict]:
        proc = legato(*check, *args)
        assert proc.returncode in (0, 1), proc.stderr
        return proc.returncode, orjson.loads(proc.stdout)

    code, doc = verdict("--desktops", "2")  # auto: a network of its own for such a task
    assert code == 0 and doc["local_desktops"]["network"] == "auto", doc["problems"]
    (task,) = doc["tasks"]
    assert task["desktop_ports"] == [9222]
    assert task["port_parts"] == ["setup step chrome_open_tabs", "getter open_tabs_info"]
    code, doc = verdict("--desktop-option", "network=host")  # one desktop: the port is its own
    assert code == 0 and doc["local_desktops"]["network"] == "host", doc["problems"]
    code, doc = verdict("--desktop-option", "network=host", "--desktops", "2")
    assert code == 1
    (problem,) = doc["problems"]["local"]
    assert "network=host all 2 desktops share" in problem
    assert "fix: --desktop-option network=own" in problem
    code, doc = verdict("--desktop-option", "network=none")
    assert code == 1 and "network=none cuts off" in doc["problems"]["local"][0]
    code, doc = verdict("--desktop-option", "network=own", "--desktops", "4")
    assert code == 0 and doc["local_desktops"] == doc["local_desktops"] | {"network": "own"}
    # attached by URL: the servers chose their network, nothing is held against the task
    code, doc = verdict("--desktop-option", 'urls=["http://127.0.0.1:1"]', "--desktops", "2")
    assert code == 0 and doc["local_desktops"]["network"] is None


def test_collect_refuses_a_bad_network_and_a_shared_port_before_anything_runs(
    policy_server, tmp_path
):
    """collect's preflight: the same verdict as `tasks check --desktops N` (runners + spares),
    before the policy or any desktop is touched and nothing written."""
    from legato_pipelines import DesktopConfig, PolicyConfig, collect, load_tasks
    from legato_pipelines.desktops.osworld_worker import osworld_python
    from legato_pipelines.desktops.server.apps import installed_apps
    from legato_pipelines.errors import ConfigError, TaskListError

    if "chrome" not in installed_apps() or osworld_python({}) is None:
        pytest.skip("needs chromium for the local desktops and the OSWorld venv (setup.sh)")
    tasks = load_tasks(write(tmp_path, "tabs.json", [TABS]))
    policy = PolicyConfig(base_url=policy_server.url, model=policy_server.model, version="v1")
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="must be one of auto, host, none, own, got 'bogus'"):
        collect(
            tasks, policy, out, desktop=DesktopConfig(backend="local", options={"network": "bogus"})
        )
    host = DesktopConfig(backend="local", options={"network": "host"})
    with pytest.raises(TaskListError, match="all 2 desktops share"):
        collect(tasks, policy, out, desktops=1, spares=1, desktop=host)
    assert not out.exists()


def test_a_bad_prebuild_option_is_refused_before_anything_runs():
    """Desktop option prebuild is checked with the other local options (collect's preflight
    uses the same check, before its run directory is written)."""
    bad = legato("examples/tasks/local/tasks.json", "--backend", "local",
                 "--desktop-option", 'prebuild="gimp"')  # fmt: skip
    assert bad.returncode == 2
    assert "desktop option 'prebuild' must be a list of libreoffice" in bad.stdout + bad.stderr
    assert "or [] for none" in bad.stdout + bad.stderr


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("start_timeout=abc", "desktop option 'start_timeout' must be seconds > 0, got 'abc'"),
        ("base_port=abc", "desktop option 'base_port' must be a port number 1-65535, got 'abc'"),
        ("base_port=70000", "desktop option 'base_port' must be a port number 1-65535, got 70000"),
    ],
)
def test_a_bad_number_option_is_refused_before_a_run_directory_exists(tmp_path, option, message):
    """A newcomer's ``--desktop-option start_timeout=abc`` printed an 83-line traceback (exit
    1) after the run directory was written; now collect's preflight refuses it, exit 2, one
    line naming the option and the fix, and nothing is written."""
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "legato_pipelines", "collect", "--tasks", str(LOCAL_SUITE),
            "--backend", "local", "--desktop-option", option,
            "--policy-url", "http://127.0.0.1:9", "--model", "m", "--out", str(out)]  # fmt: skip
    bad = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    said = bad.stdout + bad.stderr
    assert bad.returncode == 2, said
    assert message in said and "fix: --desktop-option" in said
    assert "Traceback" not in said
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("bogus=1", "desktop options ['bogus'] are not local-backend options"),
        ("urls=notalist", "desktop option 'urls' of the local backend"),
    ],
)
def test_tasks_check_refuses_the_options_collect_refuses(option, message):
    """``tasks check --backend local --desktop-option bogus=1`` exited 0 while collect refused
    the option; both now take the registry's one check (exit 2, the option and the fix). With
    no ``--backend``, an option no checked backend has is refused too."""
    bad = legato("examples/tasks/local/tasks.json", "--backend", "local",
                 "--desktop-option", option, "--totals-only")  # fmt: skip
    said = bad.stdout + bad.stderr
    assert bad.returncode == 2, said
    assert message in said and "fix: --desktop-option" in said
    if option == "bogus=1":
        every = legato("examples/tasks/local/tasks.json", "--desktop-option", option,
                       "--totals-only")  # fmt: skip
        assert every.returncode == 2 and message in every.stdout + every.stderr
