"""run_setup: OSWorld setup-step semantics through a real directory-backed controller."""

from __future__ import annotations

import uuid

import pytest

from legato_pipelines.errors import DesktopError
from legato_pipelines.osworld_format import UnsupportedStep, run_setup
from legato_pipelines.osworld_format.placeholders import (
    placeholder_values,
    placeholders_in,
    substitute,
)
from legato_pipelines.tasks import Task
from tests.osworld_format_home import HomeController


def make_task(steps, task_id="t-setup"):
    return Task(
        task_id=task_id, domain=None, config={"instruction": "x", "config": steps}, source="inline"
    )


@pytest.fixture
def desktop(tmp_path):
    controller = HomeController(tmp_path / "home")
    yield controller
    controller.close()


def sh(command, **extra):
    return {"type": "execute", "parameters": {"command": command, "shell": True, **extra}}


def test_placeholders_replace_only_known_tokens():
    values = placeholder_values("s3cret", (1920, 1080))
    command = ["python", "-c", "f'{x}' ; click({SCREEN_WIDTH_HALF}, {SCREEN_HEIGHT_HALF}); {}"]
    assert substitute(command, values) == ["python", "-c", "f'{x}' ; click(960, 540); {}"]
    assert (
        substitute("echo {CLIENT_PASSWORD} | sudo -S true", values) == "echo s3cret | sudo -S true"
    )
    assert substitute(7, values) == 7
    assert placeholders_in(command) == ["{SCREEN_WIDTH_HALF}", "{SCREEN_HEIGHT_HALF}"]
    assert placeholders_in("{SCREEN_WIDTH}x{SCREEN_HEIGHT}") == [
        "{SCREEN_WIDTH}",
        "{SCREEN_HEIGHT}",
    ]


async def test_placeholders_substituted_in_commands_run_on_the_desktop(desktop):
    task = make_task(
        [sh("echo {CLIENT_PASSWORD} {SCREEN_WIDTH}x{SCREEN_HEIGHT} {SCREEN_WIDTH_HALF} > out.txt")]
    )
    await run_setup(task, desktop, screen_size=(1280, 720), client_password="pw-1")
    assert (desktop.home / "out.txt").read_text() == "pw-1 1280x720 640\n"


async def test_steps_run_in_order_through_the_controller(desktop):
    steps = [
        sh("echo one > order.txt"),
        {"type": "command", "parameters": {"command": ["sh", "-c", "echo two >> order.txt"]}},
        {"type": "sleep", "parameters": {"seconds": 0.01}},
        {"type": "open", "parameters": {"path": "~/order.txt"}},
        {"type": "activate_window", "parameters": {"window_name": "order.txt", "strict": True}},
        {"type": "launch", "parameters": {"command": ["sleep", "30"]}},
        {"type": "close_window", "parameters": {"window_name": "order.txt"}},
    ]
    await run_setup(make_task(steps), desktop)
    assert [name for name, _ in desktop.calls] == [
        "execute", "execute", "open_file", "activate_window", "launch", "close_window",
    ]  # fmt: skip
    assert (desktop.home / "order.txt").read_text() == "one\ntwo\n"
    assert desktop.launched and desktop.launched[0].poll() is None  # launch did not wait


async def test_download_from_file_url(desktop, tmp_path):
    source = tmp_path / "src" / "report.xlsx"
    source.parent.mkdir()
    source.write_bytes(b"PK\x03\x04 fake workbook")
    step = {
        "type": "download",
        "parameters": {"files": [{"url": source.as_uri(), "path": "~/Desktop/report.xlsx"}]},
    }
    await run_setup(make_task([step]), desktop)
    assert (desktop.home / "Desktop" / "report.xlsx").read_bytes() == source.read_bytes()


async def test_download_from_the_cache_by_osworld_name_and_by_file_name(desktop, tmp_path):
    cache = tmp_path / "cache"
    url_a = "https://huggingface.co/datasets/x/resolve/main/calc/a.xlsx"
    url_b = "https://huggingface.co/datasets/x/resolve/main/calc/b.csv"
    (cache / "t-cache").mkdir(parents=True)
    # OSWorld's own cache name, in the per-task folder: uuid5(url)_<basename(dest)>
    (cache / "t-cache" / f"{uuid.uuid5(uuid.NAMESPACE_URL, url_a)}_a.xlsx").write_bytes(b"AAA")
    (cache / "b.csv").write_bytes(b"x,y\n")  # plain file name at the cache root
    files = [{"url": url_a, "path": "~/a.xlsx"}, {"url": url_b, "path": "~/b.csv"}]
    step = {"type": "download", "parameters": {"files": files}}
    await run_setup(make_task([step], task_id="t-cache"), desktop, cache_dir=cache)
    assert (desktop.home / "a.xlsx").read_bytes() == b"AAA"
    assert (desktop.home / "b.csv").read_bytes() == b"x,y\n"


async def test_internet_url_is_unsupported_and_nothing_runs(desktop, tmp_path):
    url = "https://huggingface.co/datasets/x/resolve/main/missing.docx"
    steps = [
        sh("echo ran > ran.txt"),
        {"type": "download", "parameters": {"files": [{"url": url, "path": "~/m.docx"}]}},
    ]
    with pytest.raises(UnsupportedStep) as info:
        await run_setup(make_task(steps), desktop, cache_dir=tmp_path / "empty-cache")
    assert url in str(info.value) and info.value.urls == [url]
    assert info.value.kind == "unsupported" and info.value.step_type == "download"
    assert desktop.calls == [] and not (desktop.home / "ran.txt").exists()


async def test_unknown_step_type_is_unsupported_before_anything_runs(desktop):
    steps = [
        sh("echo ran > ran.txt"),
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": ["https://a.b"]}},
    ]
    with pytest.raises(UnsupportedStep, match="chrome_open_tabs"):
        await run_setup(make_task(steps), desktop)
    assert desktop.calls == []


async def test_missing_file_is_a_fact_and_setup_carries_on_as_in_osworld(desktop):
    steps = [
        sh("true"),
        {"type": "open", "parameters": {"path": "~/nope.txt"}},
        sh("echo never > never.txt"),
    ]
    failures = await run_setup(make_task(steps, task_id="t-fail"), desktop)
    assert (desktop.home / "never.txt").exists()  # OSWorld logs the failure and carries on
    assert [(f["step"], f["type"]) for f in failures] == [(1, "open")]
    assert "nope.txt" in failures[0]["error"]


async def test_nonzero_exits_are_facts_with_status_and_stderr_tail(desktop):
    failures = await run_setup(
        make_task([sh("true"), sh("echo boom >&2; exit 127"), sh("echo ok > ok.txt")]), desktop
    )
    assert (desktop.home / "ok.txt").exists()
    assert failures == [{"step": 1, "type": "execute", "exit_status": 127, "error": "boom\n"}]
    assert await run_setup(make_task([sh("true")]), desktop) == []


async def test_missing_program_fails_but_nonzero_exit_does_not(desktop):
    await run_setup(
        make_task([sh("exit 3"), {"type": "execute", "parameters": {"command": ["false"]}}]),
        desktop,
    )
    with pytest.raises(DesktopError) as info:
        await run_setup(
            make_task([{"type": "execute", "parameters": {"command": ["no-such-program-xyz"]}}]),
            desktop,
        )
    assert info.value.kind == "setup"


async def test_missing_parameter_is_named(desktop):
    with pytest.raises(DesktopError, match="'command'"):
        await run_setup(make_task([{"type": "launch", "parameters": {}}]), desktop)


async def test_execute_until_polls_and_captures_stdout(desktop, tmp_path):
    # Each run appends a line; the step repeats until the third run prints "3".
    step = sh("echo x >> n.txt; wc -l < n.txt", until={"stdout": "3"}, stdout="count.out")
    work = tmp_path / "work"
    await run_setup(make_task([step]), desktop, work_dir=work)
    assert (desktop.home / "n.txt").read_text() == "x\nx\nx\n"
    assert (work / "count.out").read_text().strip() == "3"


async def test_upload_step_with_content(desktop):
    step = {
        "type": "upload",
        "parameters": {"files": [{"path": "~/docs/a.txt", "content": "hello\n"}]},
    }
    await run_setup(make_task([step]), desktop)
    assert (desktop.home / "docs" / "a.txt").read_text() == "hello\n"
