"""evaluate_task: OSWorld's evaluate() semantics through a real directory-backed controller."""

from __future__ import annotations

import pytest

from legato_pipelines.errors import DesktopError
from legato_pipelines.osworld_format import evaluate_task, evaluator_unsupported
from legato_pipelines.tasks import Task
from tests.osworld_format_home import HomeController


def make_task(evaluator, setup=(), task_id="t-eval"):
    config = {"instruction": "x", "config": list(setup), "evaluator": evaluator}
    return Task(task_id=task_id, domain=None, config=config, source="inline")


@pytest.fixture
def desktop(tmp_path):
    controller = HomeController(tmp_path / "home")
    yield controller
    controller.close()


def cmd(command):
    return {"type": "vm_command_line", "command": command, "shell": True}


def rule(rules):
    return {"type": "rule", "rules": rules}


def executed(desktop):
    return [c for name, c in desktop.calls if name == "execute"]


async def test_single_metric_pass_and_fail(desktop):
    (desktop.home / "answer.txt").write_text("42")
    task = make_task(
        {
            "func": "exact_match",
            "result": cmd("cat answer.txt"),
            "expected": rule({"expected": "42"}),
        }
    )
    assert (await evaluate_task(task, desktop)).reward == 1.0
    (desktop.home / "answer.txt").write_text("41")
    ev = await evaluate_task(task, desktop)
    assert ev.reward == 0.0 and ev.error is None


async def test_infeasible_scores_by_last_action(desktop):
    task = make_task({"func": "infeasible"})
    assert (await evaluate_task(task, desktop, last_action_fail=True)).reward == 1.0
    assert (await evaluate_task(task, desktop, last_action_fail=False)).reward == 0.0


async def test_last_action_fail_gives_zero_on_a_feasible_task(desktop):
    (desktop.home / "a.txt").write_text("ok")
    task = make_task(
        {"func": "exact_match", "result": cmd("cat a.txt"), "expected": rule({"expected": "ok"})}
    )
    assert (await evaluate_task(task, desktop)).reward == 1.0
    assert (await evaluate_task(task, desktop, last_action_fail=True)).reward == 0.0


def three_metrics(conj, outputs):
    """Three exact_match metrics over ``echo`` outputs; expected is always "yes"."""
    return {
        "func": ["exact_match"] * 3,
        "conj": conj,
        "result": [cmd(f"printf {o}") for o in outputs],
        "expected": [rule({"expected": "yes"})] * 3,
    }


async def test_conj_and_stops_at_first_zero(desktop):
    ev = await evaluate_task(make_task(three_metrics("and", ["yes", "no", "yes"])), desktop)
    assert ev.reward == 0.0
    assert executed(desktop) == ["printf yes", "printf no"]  # the third getter never ran


async def test_conj_and_default_is_mean_of_partial_scores(desktop, tmp_path):
    (desktop.home / "got.txt").write_text("a\nb\nc\nX\n")
    (desktop.home / "want.txt").write_text("a\nb\nc\nd\n")
    evaluator = {
        "func": ["exact_match", "diff_text_file"],  # conj omitted: "and"
        "result": [cmd("printf yes"), {"type": "vm_file", "path": "~/got.txt", "dest": "got.txt"}],
        "expected": [
            rule({"expected": "yes"}),
            {"type": "vm_file", "path": "~/want.txt", "dest": "want.txt"},
        ],
    }
    ev = await evaluate_task(make_task(evaluator), desktop)
    assert ev.reward == pytest.approx((1.0 + 0.75) / 2)


async def test_conj_or_stops_at_first_one_else_max(desktop):
    ev = await evaluate_task(make_task(three_metrics("or", ["no", "yes", "no"])), desktop)
    assert ev.reward == 1.0
    assert executed(desktop) == ["printf no", "printf yes"]
    desktop.calls.clear()
    ev = await evaluate_task(make_task(three_metrics("or", ["no", "no", "no"])), desktop)
    assert ev.reward == 0.0 and len(executed(desktop)) == 3


async def test_list_funcs_use_their_own_options(desktop):
    (desktop.home / "a.txt").write_text("Hello World\n")
    (desktop.home / "b.txt").write_text("hello   world")
    file_a = {"type": "vm_file", "path": "~/a.txt", "dest": "a.txt"}
    file_b = {"type": "vm_file", "path": "~/b.txt", "dest": "b.txt"}
    evaluator = {
        "func": ["compare_text_file", "check_include_exclude"],
        "result": [file_a, cmd("cat a.txt")],
        "expected": [file_b, rule({"include": ["Hello"], "exclude": ["Bye"]})],
        "options": [{"ignore_blanks": True, "ignore_case": True}, {}],
    }
    assert (await evaluate_task(make_task(evaluator), desktop)).reward == 1.0
    evaluator["options"] = [{"ignore_blanks": True}, {}]  # case now matters
    assert (await evaluate_task(make_task(evaluator), desktop)).reward == 0.0


async def test_missing_files_score_zero(desktop):
    # vm_file of a missing file -> None -> 0; cache_file missing -> FileNotFoundError -> 0.
    missing_vm = {"func": "compare_text_file", "result": {"type": "vm_file", "path": "~/nope.txt", "dest": "n.txt"},
                  "expected": {"type": "vm_file", "path": "~/nope2.txt", "dest": "n2.txt"}}  # fmt: skip
    ev = await evaluate_task(make_task(missing_vm), desktop)
    assert ev.reward == 0.0 and ev.error is None
    missing_cache = {
        "func": "check_list",
        "result": {"type": "cache_file", "path": "grep.out"},
        "expected": rule({"expect": ["x"]}),
    }
    ev = await evaluate_task(make_task(missing_cache), desktop)
    assert ev.reward == 0.0 and ev.error is None


async def test_throwing_evaluator_scores_zero_with_the_reason(desktop):
    (desktop.home / "c.json").write_text("{not json")
    evaluator = {
        "func": "check_direct_json_object",
        "result": cmd("cat c.json"),
        "expected": rule({"expected": {"a": 1}}),
    }
    ev = await evaluate_task(make_task(evaluator), desktop)
    assert ev.reward == 0.0
    assert ev.error and "JSONDecodeError" in ev.error


async def test_unknown_metric_or_getter_is_reported_not_run(desktop):
    evaluator = {"func": "compare_pptx_files", "result": {"type": "vm_file", "path": "~/a.pptx", "dest": "a.pptx"},
                 "expected": {"type": "accessibility_tree"}}  # fmt: skip
    assert evaluator_unsupported(evaluator) == [
        "metric compare_pptx_files",
        "getter accessibility_tree",
    ]
    ev = await evaluate_task(make_task(evaluator), desktop)
    assert ev.reward == 0.0 and "metric compare_pptx_files not supported locally" in ev.error
    assert desktop.calls == []


async def test_postconfig_runs_first_and_its_captures_feed_cache_file(desktop):
    evaluator = {
        "postconfig": [
            {
                "type": "execute",
                "parameters": {"command": "printf 'saved\\n' > doc.txt", "shell": True},
            },
            {
                "type": "execute",
                "parameters": {"command": ["printf", "saved\\n"], "stdout": "want.txt"},
            },
        ],
        "func": "compare_text_file",
        "result": {"type": "vm_file", "path": "~/doc.txt", "dest": "doc.txt"},
        "expected": {"type": "cache_file", "path": "want.txt"},
    }
    assert (await evaluate_task(make_task(evaluator), desktop)).reward == 1.0


async def test_postconfig_needing_the_internet_scores_zero_with_reason(desktop, tmp_path):
    url = "https://huggingface.co/x/gold.xlsx"
    evaluator = {
        "postconfig": [
            {"type": "download", "parameters": {"files": [{"url": url, "path": "~/gold.xlsx"}]}}
        ],
        "func": "exact_match",
        "result": cmd("printf a"),
        "expected": rule({"expected": "a"}),
    }
    ev = await evaluate_task(make_task(evaluator), desktop, cache_dir=tmp_path / "cache")
    assert ev.reward == 0.0 and url in ev.error


async def test_cloud_file_from_file_url(desktop, tmp_path):
    gold = tmp_path / "gold.csv"
    gold.write_text("a,b\n1,2\n")
    (desktop.home / "out.csv").write_text("a,b\n1,2\n")
    evaluator = {
        "func": "compare_csv",
        "result": {"type": "vm_file", "path": "~/out.csv", "dest": "out.csv"},
        "expected": {"type": "cloud_file", "path": gold.as_uri(), "dest": "gold.csv"},
    }
    assert (await evaluate_task(make_task(evaluator), desktop)).reward == 1.0


async def test_vm_file_multi_gives_a_list(desktop, tmp_path):
    for name in ("x.txt", "y.txt", "z.txt"):
        (desktop.home / name).write_text(name)
    work = tmp_path / "work"
    evaluator = {
        "func": "compare_csv",  # compare_csv accepts a list of expected files: any match scores 1
        "result": {"type": "vm_file", "path": "~/y.txt", "dest": "r.txt"},
        "expected": {
            "type": "vm_file",
            "multi": True,
            "path": ["~/x.txt", "~/y.txt", "~/z.txt"],
            "dest": ["x.txt", "y.txt", "z.txt"],
            "gives": [0, 1],
        },  # fmt: skip
    }
    assert (await evaluate_task(make_task(evaluator), desktop, work_dir=work)).reward == 1.0
    assert sorted(p.name for p in work.iterdir()) == ["r.txt", "x.txt", "y.txt", "z.txt"]
    evaluator["expected"]["gives"] = [0, 2]  # y is no longer offered
    assert (await evaluate_task(make_task(evaluator), desktop, work_dir=work)).reward == 0.0


class DeadDesktop(HomeController):
    async def execute(self, command, shell=False, timeout=120.0):
        raise DesktopError("connection refused", kind="transport")


async def test_dead_desktop_propagates(tmp_path):
    task = make_task(
        {"func": "exact_match", "result": cmd("true"), "expected": rule({"expected": ""})}
    )
    with pytest.raises(DesktopError) as info:
        await evaluate_task(task, DeadDesktop(tmp_path / "home"))
    assert info.value.kind == "transport"


async def test_evaluator_missing(desktop):
    task = Task(task_id="t", domain=None, config={"instruction": "x"}, source="inline")
    ev = await evaluate_task(task, desktop)
    assert ev.reward == 0.0 and "evaluator missing" in ev.error
