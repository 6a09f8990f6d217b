"""preflight: the problems that make a task unrunnable on a backend, found before any desktop starts."""

from __future__ import annotations

import pytest

from legato_pipelines.osworld_format import preflight
from legato_pipelines.tasks import Task, load_tasks
from tests.osworld_data import LOCAL_SUITE, OSWORLD

GOOD_EVALUATOR = {
    "func": "check_include_exclude",
    "result": {"type": "vm_command_line", "command": "cat ~/a.txt"},
    "expected": {"type": "rule", "rules": {"include": ["hello"], "exclude": []}},
}


def task(task_id="t", setup=(), evaluator=GOOD_EVALUATOR, **extra) -> Task:
    config = {"instruction": "x", "config": list(setup), **extra}
    if evaluator is not None:
        config["evaluator"] = evaluator
    return Task(task_id=task_id, domain=None, config=config, source="inline")


def launch(**params):
    return {"type": "launch", "parameters": params}


def test_a_good_task_has_no_problems_anywhere():
    tasks = [task(setup=[launch(command=["xterm"])])]
    assert [preflight(tasks, b) for b in ("local", "osworld", "fake")] == [[], [], []]


def test_local_suite_is_clean_on_every_backend():
    tasks = load_tasks(LOCAL_SUITE)
    for backend in ("local", "osworld", "fake"):
        assert preflight(tasks, backend) == [], backend


def test_metric_typo_names_the_fix():
    bad = task("typo", evaluator={**GOOD_EVALUATOR, "func": "check_include_exclud"})
    (problem,) = preflight([task("ok"), bad], "local")
    assert problem.startswith("tasks[1] (task_id 'typo'): ")
    assert "config.evaluator.func" in problem and "did you mean check_include_exclude?" in problem
    # OSWorld has metrics this runtime lacks: the osworld backend is not blocked by a name
    assert preflight([bad], "osworld") == []


def test_getter_typo_and_missing_getter_key():
    evaluator = {
        **GOOD_EVALUATOR,
        "result": {"type": "vm_comand_line", "command": "true"},
        "expected": {"type": "rule", "rule": {"include": []}},
    }
    problems = preflight([task(evaluator=evaluator)], "local")
    assert any("did you mean vm_command_line?" in p for p in problems), problems
    assert any(
        "config.evaluator.expected.rules" in p and "'rule'" in p and "misspelling" in p
        for p in problems
    ), problems


def test_missing_result_blocks_local_and_osworld_not_fake():
    evaluator = {k: v for k, v in GOOD_EVALUATOR.items() if k != "result"}
    tasks = [task("nores", evaluator=evaluator)]
    for backend in ("local", "osworld"):
        (problem,) = preflight(tasks, backend)
        assert problem.startswith("tasks[0] (task_id 'nores'): field 'config.evaluator.result'")
        assert "fix:" in problem
    assert preflight(tasks, "fake") == []


def test_missing_expected_for_a_metric_that_needs_it():
    evaluator = {k: v for k, v in GOOD_EVALUATOR.items() if k != "expected"}
    (problem,) = preflight([task(evaluator=evaluator)], "local")
    assert "config.evaluator.expected" in problem and "'rules'" in problem
    # compare_table's expected is optional (OSWorld: metric(result, **options))
    table = {"func": "compare_table", "result": {"type": "vm_file", "path": "a", "dest": "a"},
             "options": {"rules": [{"type": "check_cell", "sheet_idx": 0, "coordinate": "A1",
                                    "props": {"value": {"method": "eq", "ref": 1}}}]}}  # fmt: skip
    assert preflight([task(evaluator=table)], "local") == []


def test_parallel_lists_of_different_lengths():
    evaluator = {
        "func": ["check_include_exclude", "exact_match"],
        "result": [GOOD_EVALUATOR["result"]],
        "expected": [GOOD_EVALUATOR["expected"], {"type": "rule", "rules": {"expected": "x"}}],
    }
    for backend in ("local", "osworld"):
        (problem,) = preflight([task(evaluator=evaluator)], backend)
        assert "config.evaluator" in problem and "2 metrics" in problem and "1/2/2" in problem


def test_no_evaluator_blocks_local_and_osworld():
    tasks = [task("fake-1", evaluator=None, fake={"success": 0.3})]
    assert preflight(tasks, "fake") == []
    for backend in ("local", "osworld"):
        (problem,) = preflight(tasks, backend)
        assert "config.evaluator' is missing" in problem and "fake backend" in problem


def test_misspelled_launch_parameter_is_named():
    (problem,) = preflight([task(setup=[launch(comand=["xterm"])])], "local")
    assert problem.startswith("tasks[0] (task_id 't'): field 'config.config[0].parameters.command'")
    assert "'comand'" in problem and "rename 'comand' to 'command'" in problem
    (bare,) = preflight([task(setup=[launch(shell=True)])], "local")
    assert "needs parameter 'command'" in bare and "add 'command'" in bare


def test_unsupported_step_types_with_suggestion():
    steps = [{"type": "exectue", "parameters": {"command": "true"}},
             {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://example.org"]}}]  # fmt: skip
    problems = preflight([task(setup=steps)], "local")  # the own subset: no chrome_open_tabs
    assert "config.config[0].type" in problems[0] and "did you mean execute?" in problems[0]
    assert "chrome_open_tabs" in problems[1] and "OSWorld venv" in problems[1]
    # what the host lacks follows: the live website, and chrome (not in the default app set)
    assert "needs the internet (https://example.org)" in problems[2]
    assert "app 'chrome'" in problems[3] and len(problems) == 4
    # osworld: not a SetupController step type either (the check and the preflight agree)
    (osworld,) = preflight([task(setup=steps)], "osworld")
    assert "'exectue' is not one of OSWorld's SetupController step types" in osworld


def test_internet_download_and_cache(tmp_path):
    url = "https://huggingface.co/datasets/x/resolve/main/data.xlsx"
    step = {
        "type": "download",
        "parameters": {"files": [{"url": url, "path": "/home/user/d.xlsx"}]},
    }
    (problem,) = preflight([task(setup=[step])], "local")
    assert "config.config[0].parameters.files[0].url" in problem and "needs the internet" in problem
    assert "--cache-dir" in problem
    (tmp_path / "data.xlsx").write_bytes(b"cached")
    assert preflight([task(setup=[step])], "local", cache_dir=tmp_path) == []
    assert preflight([task(setup=[step])], "osworld") == []
    missing = {
        "type": "download",
        "parameters": {"files": [{"url": f"file://{tmp_path}/no.xlsx", "path": "d"}]},
    }
    (problem,) = preflight([task(setup=[missing])], "local")
    assert "does not exist" in problem


@pytest.mark.parametrize("success", [2, -0.1, "0.5", None, True, float("nan")])
def test_fake_success_must_be_a_probability(success):
    t = task(evaluator=None, fake={"success": success})
    (problem,) = preflight([t], "fake")
    assert problem.startswith("tasks[0] (task_id 't'): field 'config.fake.success'")
    assert "[0, 1]" in problem


def test_unknown_backend_raises():
    with pytest.raises(ValueError, match="local, osworld, fake"):
        preflight([task()], "docker")


def test_every_osworld_task_is_structurally_runnable_on_osworld():
    task_set = load_tasks(OSWORLD / "test_all.json", osworld=OSWORLD)
    assert preflight(task_set, "osworld") == []
    assert preflight(task_set, "fake") == []
    local = preflight(task_set, "local")
    # every task the local runtime cannot run is named, each problem with its task
    assert local and all(p.startswith("tasks[") and "fix:" in p for p in local)


def test_a_list_func_needs_parallel_lists_not_one_shared_object():
    from legato_pipelines import load_tasks
    from legato_pipelines.osworld_format import preflight

    tasks = load_tasks(
        [
            {
                "task_id": "a",
                "config": {
                    "instruction": "x",
                    "evaluator": {
                        "func": ["check_include_exclude", "exact_match"],
                        "result": {"type": "vm_command_line", "command": "echo"},
                        "expected": {"type": "rule", "rules": {"include": ["a"], "exclude": []}},
                    },
                },
            }
        ]
    )
    for backend in ("local", "osworld"):
        [problem] = preflight(tasks, backend)
        assert "result must be a list of 2 entries" in problem and "tasks[0]" in problem


def test_setup_step_parameters_against_desktop_envs_signatures(tmp_path, monkeypatch):
    """An ``execute`` step with ``comand`` fails at reset in OSWorld's SetupController
    ("unexpected keyword argument 'comand'"): osworld and local (both run SetupController)
    refuse it up front, against the installed desktop-env's ``_<type>_setup`` signatures."""
    from legato_pipelines.desktops.osworld_worker.grader import installed_grader
    from legato_pipelines.desktops.support import backend_support
    from tests.osworld_backend_support import osworld_python

    python = osworld_python()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    installed_grader.cache_clear()
    steps = [
        {"type": "execute", "parameters": {"comand": ["ls"]}},
        {"type": "launch", "parameters": {"command": ["xterm"], "shel": True}},
        {"type": "execute", "parameters": {"command": "true", "shell": True, "until": {}}},
    ]
    options = {"osworld_python": python}
    for backend in ("osworld", "local"):
        support = backend_support(backend, options)
        missing, unknown = preflight([task(setup=steps)], backend, support=support)
        assert "field 'config.config[0].parameters.command'" in missing
        assert "rename 'comand' to 'command'" in missing  # named once, as the misspelling
        assert "field 'config.config[1].parameters.shel'" in unknown
        assert "did you mean shell?" in unknown and "accepted: command, shell" in unknown
    # an answer cached by an older worker (no step_parameters) is asked again, not trusted
    (stored,) = (tmp_path / "legato" / "osworld-names").glob("*.json")
    stored.write_text(stored.read_text().split(', "step_parameters"')[0] + "}")
    installed_grader.cache_clear()
    assert installed_grader(python).step_parameters["launch"].accepted == ("command", "shell")
    installed_grader.cache_clear()
