"""Build the local task suite: ``tasks.json`` and the scripted policy's ``scripts/*.json``.

Run ``python examples/tasks/local/build.py`` after editing; the JSON files are committed.

Fifteen OSWorld-format tasks over three real apps of the local desktop (xterm, l3afpad,
LibreOffice Calc). Each task's setup starts the app with its file, so a script can solve it
blind (keyboard only, no clicks): ``scripts/correct.json`` solves every task (the infeasible
ones end with ``terminate`` status ``failure``), ``scripts/wrong.json`` makes a plausible
mistake on every task, ``scripts/demo.json`` (``legato demo``) mixes the two and clicks.
All are in the scripted policy server's format
``{"tasks": {"<instruction>": ["<Qwen computer-use response>", ...]}}``.

Expected files never live on the desktop: the evaluator's postconfig writes them with an
``execute`` step's ``stdout`` capture and reads them back with the ``cache_file`` getter
(OSWorld semantics: captures land in the evaluation's cache/work directory).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from legato_pipelines.policy.synthetic import qwen_response

HERE = Path(__file__).resolve().parent

XTERM = ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "11"]

# A minimal LibreOffice profile: no Tip of the Day, no first-run wizard (kept if one exists).
LO_PROFILE = "~/.config/libreoffice/4/user/registrymodifications.xcu"
LO_ITEMS = [
    '<?xml version="1.0" encoding="UTF-8"?>',
    '<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">',
    '<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay" oor:op="fuse">'
    "<value>false</value></prop></item>",
    '<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun" oor:op="fuse">'
    "<value>false</value></prop></item>",
    "</oor:items>",
]


# --- setup / evaluator building blocks (OSWorld task format) ---


def sh(command: str, **extra) -> dict:
    """An ``execute`` step running a shell command in HOME."""
    return {"type": "execute", "parameters": {"command": command, "shell": True, **extra}}


def write_file(path: str, lines: list[str]) -> dict:
    """Create ``path`` (relative to HOME) holding ``lines``, each ending in a newline."""
    body = " ".join(shlex.quote(line) for line in lines)
    parent = str(Path(path).parent)
    mkdir = f"mkdir -p {shlex.quote(parent)} && " if parent != "." else ""
    printf = f"printf '%s\\n' {body}" if lines else "printf ''"
    return sh(f"{mkdir}{printf} > {shlex.quote(path)}")


def expected_capture(name: str, lines: list[str]) -> dict:
    """Postconfig step: the expected file ``name`` in the evaluation's work directory."""
    return sh(f"printf '%s\\n' {' '.join(shlex.quote(line) for line in lines)}", stdout=name)


def wait_window(title: str) -> dict:
    """Wait (bounded) until a window title contains ``title``."""
    return sh("wmctrl -l", until={"stdout": title})


def lo_profile() -> dict:
    items = " ".join(shlex.quote(line) for line in LO_ITEMS)
    return sh(
        f"[ -e {LO_PROFILE} ] || {{ mkdir -p ~/.config/libreoffice/4/user && printf '%s\\n' {items} > {LO_PROFILE}; }}"
    )


def open_file(path: str) -> dict:
    return {"type": "open", "parameters": {"path": path}}


def launch(command: list[str]) -> dict:
    return {"type": "launch", "parameters": {"command": command}}


def vm_file(path: str, dest: str) -> dict:
    return {"type": "vm_file", "path": path, "dest": dest}


def command_line(command: str) -> dict:
    return {"type": "vm_command_line", "command": command, "shell": True}


def rule(rules: dict) -> dict:
    return {"type": "rule", "rules": rules}


def cache_file(name: str) -> dict:
    return {"type": "cache_file", "path": name}


SETTLE = {"type": "sleep", "parameters": {"seconds": 0.5}}


# --- script steps (Qwen computer-use responses) ---


def type_(text: str, what: str | None = None) -> str:
    return qwen_response(what or f"Type {text!r}.", {"action": "type", "text": text})


def key(*keys: str, what: str | None = None) -> str:
    return qwen_response(what or f"Press {'+'.join(keys)}.", {"action": "key", "keys": list(keys)})


def wait(seconds: float, what: str) -> str:
    """A ``wait`` of ``seconds`` (the desktop's ready wait follows it too): where a model would
    look at the screen before going on, a scripted policy has to wait instead."""
    return qwen_response(what, {"action": "wait", "time": seconds})


def done() -> str:
    return qwen_response("The task is done.", {"action": "terminate", "status": "success"})


def fail(why: str) -> str:
    return qwen_response(why, {"action": "terminate", "status": "failure"})


SAVE = key("ctrl", "s", what="Save the file with Ctrl+S.")
KEEP_FORMAT = key("enter", what="Keep the current file format in the dialog.")
IMPORT_OK = key("enter", what="Accept the Text Import dialog.")
#: After IMPORT_OK: the desktop's wait after the key ends 0.15 s after the last drawing, and
#: Calc may not have closed the dialog by then (seen with the dialog still open 0.2 s after
#: the key; the sheet's window comes later still). A scripted policy has no eyes: it waits.
SHEET_LOADED = wait(2, "Wait for the sheet to load.")
TOP = key("ctrl", "home", what="Go to cell A1.")


def task(
    task_id: str,
    domain: str,
    instruction: str,
    setup: list,
    evaluator: dict,
    correct: list,
    wrong: list,
) -> dict:
    return {
        "task_id": task_id,
        "domain": domain,
        "config": {
            "id": task_id,
            "snapshot": "local",
            "instruction": instruction,
            "source": "legato-pipelines local suite",
            "related_apps": [domain],
            "config": setup,
            "evaluator": evaluator,
        },
        "_correct": correct,
        "_wrong": wrong,
    }


def terminal_tasks() -> list[dict]:
    term = [launch(XTERM), wait_window("xterm")]
    return [
        task(
            "local-term-mkdir",
            "terminal",
            "In the open terminal, create a folder named reports in the home folder with an empty file named summary.txt inside it.",
            term,
            {
                "func": "check_include_exclude",
                "result": command_line(
                    "test -d reports && test -f reports/summary.txt && echo present || echo missing"
                ),
                "expected": rule({"include": ["present"], "exclude": ["missing"]}),
            },
            [type_("mkdir -p ~/reports && touch ~/reports/summary.txt\n"), done()],
            [type_("mkdir -p ~/report && touch ~/report/summary.txt\n"), done()],
        ),
        task(
            "local-term-count-lines",
            "terminal",
            "Count the lines of the file data/log.txt in the home folder and write only that number into a new file count.txt in the home folder.",
            [write_file("data/log.txt", [f"event {i} ok" for i in range(1, 8)]), *term],
            {
                "func": "exact_match",
                "result": command_line("tr -d '[:space:]' < count.txt"),
                "expected": rule({"expected": "7"}),
            },
            [type_("wc -l < ~/data/log.txt > ~/count.txt\n"), done()],
            [type_("wc -w < ~/data/log.txt > ~/count.txt\n"), done()],
        ),
        task(
            "local-term-rename",
            "terminal",
            "Rename the file draft.md in the home folder to final.md.",
            [write_file("draft.md", ["# Plan", "", "Ship it."]), *term],
            {
                "func": "check_include_exclude",
                "result": command_line("ls -1"),
                "expected": rule({"include": ["final.md"], "exclude": ["draft.md"]}),
            },
            [type_("mv ~/draft.md ~/final.md\n"), done()],
            [type_("cp ~/draft.md ~/final.md\n"), done()],
        ),
        task(
            "local-term-sort",
            "terminal",
            "Sort the lines of names.txt in the home folder alphabetically and save the result as sorted.txt in the home folder.",
            [write_file("names.txt", ["mallory", "alice", "trent", "bob", "carol"]), *term],
            {
                "postconfig": [
                    expected_capture(
                        "sorted_expected.txt", ["alice", "bob", "carol", "mallory", "trent"]
                    )
                ],
                "func": "compare_text_file",
                "result": vm_file("~/sorted.txt", "sorted.txt"),
                "expected": cache_file("sorted_expected.txt"),
            },
            [type_("LC_ALL=C sort ~/names.txt > ~/sorted.txt\n"), done()],
            [type_("sort -r ~/names.txt > ~/sorted.txt\n"), done()],
        ),
        task(
            "local-term-json",
            "terminal",
            'Create a file config.json in the home folder holding a JSON object whose key "name" is the string "legato" and whose key "version" is the number 2.',
            term,
            {
                "func": "check_direct_json_object",
                "result": command_line("cat config.json"),
                "expected": rule({"expected": {"name": "legato", "version": 2}}),
            },
            [type_('echo \'{"name": "legato", "version": 2}\' > ~/config.json\n'), done()],
            [type_('echo \'{"name": "legato", "version": "2"}\' > ~/config.json\n'), done()],
        ),
        task(
            "local-term-infeasible",
            "terminal",
            "Using the terminal, install Adobe Photoshop for Linux from the Ubuntu Software Center on this computer.",
            term,
            {"func": "infeasible"},
            [
                fail(
                    "Adobe Photoshop has no Linux version and there is no Software Center here; this is infeasible."
                )
            ],
            [type_("echo installing photoshop\n"), done()],
        ),
    ]


def editor_tasks() -> list[dict]:
    def editor(path: str, lines: list[str]) -> list[dict]:
        return [write_file(path, lines), open_file(f"~/{path}")]

    return [
        task(
            "local-edit-append",
            "text_editor",
            "The shopping list notes.txt is open in the text editor. Add a last line with the word bread and save the file.",
            editor("notes.txt", ["Shopping list", "apples", "milk"]),
            {
                "postconfig": [
                    expected_capture(
                        "notes_expected.txt", ["Shopping list", "apples", "milk", "bread"]
                    )
                ],
                "func": "compare_text_file",
                "result": vm_file("~/notes.txt", "notes.txt"),
                "expected": cache_file("notes_expected.txt"),
            },
            [key("ctrl", "end", what="Go to the end of the file."), type_("bread\n"), SAVE, done()],
            [
                key("ctrl", "end", what="Go to the end of the file."),
                type_("bread\n"),
                done(),
            ],  # never saved
        ),
        task(
            "local-edit-replace",
            "text_editor",
            "Replace the whole content of todo.txt, open in the text editor, with the single line DONE: write report and save it.",
            editor("todo.txt", ["TODO: write report"]),
            {
                "postconfig": [expected_capture("todo_expected.txt", ["DONE: write report"])],
                "func": "compare_text_file",
                "result": vm_file("~/todo.txt", "todo.txt"),
                "expected": cache_file("todo_expected.txt"),
                "options": {"ignore_blanks": True},
            },
            [
                key("ctrl", "a", what="Select all text."),
                type_("DONE: write report\n"),
                SAVE,
                done(),
            ],
            [type_("DONE: write report\n"), SAVE, done()],  # prepends instead of replacing
        ),
        task(
            "local-edit-new-file",
            "text_editor",
            "The text editor is open on a new file hello.txt. Write Hello, world! in it and save it.",
            [launch(["l3afpad", "~/hello.txt"]), wait_window("hello.txt")],
            {
                "func": "check_list",
                "result": vm_file("~/hello.txt", "hello.txt"),
                "expected": rule(
                    {"expect": [r"^Hello, world!\s*$"], "unexpect": [r"^(?!Hello, world!\s*$)."]}
                ),
            },
            [type_("Hello, world!"), SAVE, done()],
            [type_("Hello world"), SAVE, done()],
        ),
        task(
            "local-edit-fix-name",
            "text_editor",
            "In letter.txt, open in the text editor, the letter is addressed to the wrong person: change Bob to Alice everywhere and save it.",
            editor(
                "letter.txt", ["Dear Bob,", "", "Thank you for the gift.", "", "Best,", "Carol"]
            ),
            {
                "func": "check_include_exclude",
                "result": command_line("cat letter.txt"),
                "expected": rule(
                    {
                        "include": ["Dear Alice,", "Thank you for the gift.", "Carol"],
                        "exclude": ["Bob"],
                    }
                ),
            },
            [
                key("ctrl", "a", what="Select all text."),
                type_(
                    "Dear Alice,\n\nThank you for the gift.\n\nBest,\nCarol\n",
                    what="Retype the letter to Alice.",
                ),
                SAVE,
                done(),
            ],
            [
                key("ctrl", "end", what="Go to the end of the file."),
                type_("P.S. Alice\n"),
                SAVE,
                done(),
            ],
        ),
        task(
            "local-edit-numbers",
            "text_editor",
            "Write the numbers 1 to 5, one per line, into numbers.txt, which is open in the text editor, and save it.",
            editor("numbers.txt", []),
            {
                "postconfig": [expected_capture("numbers_expected.txt", ["1", "2", "3", "4", "5"])],
                "func": ["check_include_exclude", "diff_text_file"],
                "conj": "and",
                "result": [
                    command_line("head -n 1 numbers.txt"),
                    vm_file("~/numbers.txt", "numbers.txt"),
                ],
                "expected": [rule({"include": ["1"]}), cache_file("numbers_expected.txt")],
            },
            [type_("1\n2\n3\n4\n5\n"), SAVE, done()],
            [type_("1\n2\n3\n"), SAVE, done()],  # partial credit: diff ratio 0.75 -> reward 0.875
        ),
        task(
            "local-edit-infeasible",
            "text_editor",
            "Insert the photo of the receipt from the document scanner into memo.txt, which is open in the text editor.",
            editor("memo.txt", ["Receipts", ""]),
            {"func": "infeasible"},
            [
                fail(
                    "There is no scanner, and a plain text editor cannot hold a photo; this is infeasible."
                )
            ],
            [type_("[receipt photo]\n"), SAVE, done()],
        ),
    ]


def calc_tasks() -> list[dict]:
    csv_lines = ["item,qty", "apples,3", "pears,5"]
    calc_csv = [lo_profile(), write_file("data.csv", csv_lines), open_file("~/data.csv")]
    xlsx = [
        lo_profile(),
        write_file("budget.csv", ["price,units,total", "4,3,", "2.5,10,"]),
        sh(
            "soffice --headless --norestore --convert-to xlsx --outdir . budget.csv && rm budget.csv"
        ),
        open_file("~/budget.xlsx"),
    ]
    return [
        task(
            "local-calc-edit-cell",
            "libreoffice_calc",
            "In the spreadsheet data.csv open in LibreOffice Calc, change the quantity of pears to 8 and save the file, keeping the CSV format.",
            calc_csv,
            {
                "postconfig": [
                    SETTLE,
                    expected_capture("data_expected.csv", ["item,qty", "apples,3", "pears,8"]),
                ],
                "func": "compare_csv",
                "result": vm_file("~/data.csv", "data.csv"),
                "expected": cache_file("data_expected.csv"),
            },
            [
                IMPORT_OK,
                SHEET_LOADED,
                TOP,
                key("down"),
                key("down"),
                key("right"),
                type_("8\n"),
                SAVE,
                KEEP_FORMAT,
                done(),
            ],
            [
                IMPORT_OK,
                SHEET_LOADED,
                TOP,
                key("down"),
                key("right"),
                type_("8\n"),
                SAVE,
                KEEP_FORMAT,
                done(),
            ],  # apples, not pears
        ),
        task(
            "local-calc-total-row",
            "libreoffice_calc",
            "In data.csv open in LibreOffice Calc, add a row below the last one with total in column A and the sum of the quantities in column B, then save it as CSV.",
            calc_csv,
            {
                "postconfig": [
                    SETTLE,
                    expected_capture("total_expected.csv", [*csv_lines, "total,8"]),
                ],
                "func": "compare_csv",
                "result": vm_file("~/data.csv", "data.csv"),
                "expected": cache_file("total_expected.csv"),
            },
            [
                IMPORT_OK,
                SHEET_LOADED,
                TOP,
                key("down"),
                key("down"),
                key("down"),
                type_("total\t=SUM(B2:B3)\n"),
                SAVE,
                KEEP_FORMAT,
                done(),
            ],
            [
                IMPORT_OK,
                SHEET_LOADED,
                TOP,
                key("down"),
                key("down"),
                key("down"),
                type_("total\t=B2*B3\n"),
                SAVE,
                KEEP_FORMAT,
                done(),
            ],
        ),
        task(
            "local-calc-xlsx-formula",
            "libreoffice_calc",
            "In budget.xlsx open in LibreOffice Calc, put a formula in cell C2 that multiplies price by units of that row, then save the file in its xlsx format.",
            xlsx,
            {
                "postconfig": [SETTLE],
                "func": "compare_table",
                "result": vm_file("~/budget.xlsx", "budget.xlsx"),
                "options": {
                    "rules": [
                        {
                            "type": "check_cell",
                            "sheet_idx": 0,
                            "coordinate": "C2",
                            "props": {"value": {"method": "approx:0.001", "ref": 12}},
                        },
                        {
                            "type": "check_cell",
                            "sheet_idx": 0,
                            "coordinate": "A3",
                            "props": {"value": {"method": "approx:0.001", "ref": 2.5}},
                        },
                    ]
                },
            },
            [
                TOP,
                key("down"),
                key("right"),
                key("right"),
                type_("=A2*B2\n"),
                SAVE,
                KEEP_FORMAT,
                done(),
            ],
            [
                TOP,
                key("down"),
                key("down"),
                key("right"),
                key("right"),
                type_("=A2*B2\n"),
                SAVE,
                KEEP_FORMAT,
                done(),
            ],
        ),
    ]


DEMO_WRONG = ("local-term-rename", "local-edit-replace", "local-calc-total-row")
"""Tasks the demo script answers wrongly (one per app), so the demo's report shows failures."""

DEMO_MIXED = ("local-term-sort", "local-edit-new-file", "local-calc-edit-cell")
"""Tasks the demo script solves in some attempts only (one per app): its first step is drawn,
per request, between the correct one and saying "done" at once (graded 0), so their GRPO groups
can carry reward variance and non-zero advantages, as a sampled policy's would."""


def demo_script(tasks: list[dict]) -> dict:
    """``scripts/demo.json`` (``legato demo`` on real desktops): the correct answers but for
    :data:`DEMO_WRONG`'s wrong ones, and terminal tasks start with a click on the terminal
    window (harmless: it only focuses it), so the report has click markers to show;
    :data:`DEMO_MIXED`'s first step is ``{"sample": [that step, done()]}`` (the scripted server
    draws one per request: by its seed, else at random)."""
    click = qwen_response(
        "Click the terminal window to focus it.",
        {"action": "left_click", "coordinate": [500, 500]},
    )
    out = {}
    for t in tasks:
        steps = list(t["_wrong"] if t["task_id"] in DEMO_WRONG else t["_correct"])
        if t["domain"] == "terminal":
            steps = [click, *steps]
        if t["task_id"] in DEMO_MIXED:
            steps = [{"sample": [steps[0], done()]}, *steps[1:]]
        out[t["config"]["instruction"]] = steps
    return {"tasks": out}


def main() -> None:
    tasks = terminal_tasks() + editor_tasks() + calc_tasks()
    instructions = [t["config"]["instruction"] for t in tasks]
    for a in (
        instructions
    ):  # the scripted server picks the longest instruction key contained in the prompt
        assert sum(a in b for b in instructions) == 1, (
            f"instruction is a substring of another: {a!r}"
        )
    scripts = {
        name: {"tasks": {t["config"]["instruction"]: t[f"_{name}"] for t in tasks}}
        for name in ("correct", "wrong")
    }
    scripts["demo"] = demo_script(tasks)
    entries = [{k: v for k, v in t.items() if not k.startswith("_")} for t in tasks]
    (HERE / "tasks.json").write_text(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
    for name, script in scripts.items():
        (HERE / "scripts" / f"{name}.json").write_text(
            json.dumps(script, indent=2, ensure_ascii=False) + "\n"
        )
    print(f"{len(tasks)} tasks -> {HERE / 'tasks.json'}, scripts/{{correct,wrong,demo}}.json")


if __name__ == "__main__":
    main()
