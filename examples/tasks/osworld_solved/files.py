"""The input and gold files of the solved OSWorld tasks, built with openpyxl, python-docx and
python-pptx, and put in a file cache under OSWorld's own cache names.

OSWorld's real files live on huggingface.co; collection here is offline, so the files a task
downloads (``download`` steps) and the gold files its evaluator compares against
(``cloud_file`` getters) are built from code: documents of the same kind and layout the task
describes (a heading to centre, upper-case text to lower, a ``Seq No.`` column to fill), so
that what the task's script does turns the input into the gold. They are not OSWorld's bytes,
and a score here says the script solves *these* files.

Where a file goes is the file cache's business (:mod:`legato_pipelines.osworld_format.fetch`:
``<cache>/<task_id>/<name>``, the name from :func:`~legato_pipelines.osworld_format.fetch.cache_file_name`),
the place both the ``local`` backend and OSWorld's own ``SetupController`` / ``cloud_file``
getter look first. Run ``python examples/tasks/osworld_solved/files.py CACHE_DIR`` to fill a
cache, then pass it to ``legato collect --cache-dir CACHE_DIR`` (or ``--desktop-option
cache_dir=CACHE_DIR``).
"""

from __future__ import annotations

import io
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import docx
import openpyxl
import PIL.Image
import pptx
from docx.enum.text import WD_BREAK
from pptx.dml.color import RGBColor
from pptx.enum.text import PP_ALIGN
from pptx.oxml.ns import qn
from pptx.util import Pt

from legato_pipelines.desktops.server import home
from legato_pipelines.osworld_format.fetch import cache_file_name
from legato_pipelines.osworld_format.files import task_files
from legato_pipelines.tasks import Task


def _docx(
    paragraphs: list[str],
    *,
    heading: str | None = None,
    page_breaks: int = 0,
    double_spaced: int = 0,
) -> bytes:
    """A Word document: an optional heading, then ``paragraphs``; ``page_breaks`` manual page
    breaks spread after the first paragraphs (each one page: ``w:br w:type="page"``);
    ``double_spaced``: the first paragraphs with double line spacing, the others with 1.15, as
    LibreOffice writes them back (python-docx's template's default spacing, made explicit)."""
    doc = docx.Document()
    if heading is not None:
        doc.add_paragraph(heading, style="Heading 1")
    for i, text in enumerate(paragraphs):
        paragraph = doc.add_paragraph(text)
        if i < page_breaks:
            paragraph.add_run().add_break(WD_BREAK.PAGE)
        if double_spaced:
            paragraph.paragraph_format.line_spacing = 2.0 if i < double_spaced else 1.15
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def _h2o(*, subscript: bool) -> bytes:
    """A fact sheet whose heading starts with "H2O"; ``subscript``: its 2 a run of its own in
    subscript (the heading's runs ``H``, ``2``, ``O Factsheet``, as LibreOffice saves it)."""
    doc = docx.Document()
    heading = doc.add_paragraph(style="Heading 1")
    if subscript:
        heading.add_run("H")
        heading.add_run("2").font.subscript = True
        heading.add_run("O Factsheet")
    else:
        heading.add_run("H2O Factsheet")
    for text in WATER:
        doc.add_paragraph(text)
    out = io.BytesIO()
    doc.save(out)
    return out.getvalue()


def _xlsx(rows: list[list], *, freeze: str | None = None, zoom: int | None = None) -> bytes:
    """A workbook of one sheet ``Sheet1`` holding ``rows`` from A1 (values only, no formulas);
    ``freeze``: the top-left cell of the unfrozen pane (``"C2"`` freezes row 1 and columns A:B);
    ``zoom``: the sheet's zoom [%]."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Sheet1"
    for row in rows:
        sheet.append(row)
    sheet.freeze_panes = freeze
    if zoom is not None:
        sheet.sheet_view.zoomScale = zoom
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _pptx(slides: list[tuple[str, str]], *, portrait: bool = False) -> bytes:
    """A presentation of title-and-content slides ``(title, body)`` on a 10 x 7.5 inch page
    (7.5 x 10 when ``portrait``)."""
    deck = pptx.Presentation()
    # a solid white master background, as LibreOffice writes it back (python-pptx's template
    # takes it from the theme, which compare_pptx_files reads as a different background)
    deck.slide_master.background.fill.solid()
    deck.slide_master.background.fill.fore_color.rgb = RGBColor(0xFF, 0xFF, 0xFF)
    if portrait:
        deck.slide_width, deck.slide_height = deck.slide_height, deck.slide_width
    for title, body in slides:
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        for shape, text, align, size, bulleted in (
            (slide.shapes.title, title, PP_ALIGN.CENTER, 44, False),
            (slide.placeholders[1], body, PP_ALIGN.LEFT, 32, True),
        ):
            # explicit alignment and font, as LibreOffice writes them back on every save
            # (compare_pptx_files compares the values python-pptx reads, None included)
            paragraph = shape.text_frame.paragraphs[0]
            paragraph.alignment = align
            run = paragraph.add_run()
            run.text = text
            run.font.name, run.font.size, run.font.bold = "Calibri", Pt(size), False
            run.font.color.rgb = RGBColor(0, 0, 0)
            if bulleted:  # the body's bullet, written out as LibreOffice does
                bullet = paragraph._p.get_or_add_pPr().makeelement(qn("a:buChar"), {"char": "•"})
                paragraph._p.get_or_add_pPr().append(bullet)
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


# --- the documents, one per task file ---

CONSTITUTION = [
    "Article I - Name. The name of this organization shall be the Student Chess Club.",
    "Article II - Purpose. The club promotes chess among students of every level.",
    "Article III - Membership. Membership is open to every enrolled student.",
    "Article IV - Officers. The officers are a president, a treasurer and a secretary.",
]
DECLARATION = [
    "I, the undersigned, do solemnly and sincerely declare that:",
    "1. I am the owner of the property described in the schedule.",
    "2. The property is free of any charge or encumbrance.",
    "3. I make this declaration believing it to be true.",
    "Declared at the city on the date below, before me:",
]
ZOO = [
    "Dublin Zoo is a zoo in Phoenix Park, Dublin, Ireland.",
    "It opened in 1831 and is one of the oldest zoos in the world.",
    "It houses some 400 animals of around 100 species.",
]
SHOUTED = [
    "PRESENTATION INSTRUCTIONS FOR FEBRUARY 2023",
    "EVERY GROUP PRESENTS FOR TEN MINUTES.",
    "SEND YOUR SLIDES BY EMAIL THE DAY BEFORE.",
]
WATER = [
    "Water covers about 71 percent of the surface of the Earth.",
    "Each molecule holds two hydrogen atoms and one oxygen atom.",
]
GEOGRAPHY = [
    "geography and magical realism",
    "the landscape of the novel shapes the lives of its people",
    "rivers and mountains become characters of their own",
]
ORDERS = ["Seq No.", "Order ID", "Customer", "Amount"]
ORDER_ROWS = [
    [None, 10248, "Vins et alcools", 440.0],
    [None, 10249, "Toms Spezialitaeten", 1863.4],
    [None, 10250, "Hanari Carnes", 1552.6],
    [None, 10251, "Victuailles en stock", 654.06],
    [None, 10252, "Supremes delices", 3597.9],
    [None, 10253, "Hanari Carnes", 1444.8],
    [None, 10254, "Chop-suey Chinese", 556.62],
]
PAYMENTS = [
    ["Payee", "Amount"],
    ["Rent", 1200],
    ["Phone", 45.5],
    ["Groceries", 310.2],
    ["Insurance", 89],
    ["Gym", 30],
    ["Electricity", 74.35],
]
STAFF = [["Name", "Team", "Hours", "Rate"]] + [
    [f"Employee {i}", "North" if i % 2 else "South", 30 + i, 20 + i / 2] for i in range(1, 40)
]
SLIDES = [
    ("Secrets of Monetizing Video", "Earn from what you already film"),
    ("Three revenue streams", "Ads, sponsors and memberships"),
    ("Next steps", "Start with one stream and measure it"),
]


def _webp() -> bytes:
    """A small WebP poster (PIL)."""
    out = io.BytesIO()
    PIL.Image.new("RGB", (64, 96), (120, 30, 160)).save(out, "WEBP")
    return out.getvalue()


def _sh(*lines: str) -> bytes:
    """A bash script of ``lines``."""
    return ("#!/bin/bash\n" + "\n".join(lines) + "\n").encode()


#: The os tasks' scripts: OSWorld's ``setup.sh`` (run in HOME by the setup) and ``eval.sh`` (run
#: in HOME by the ``vm_command_line`` getter, printing the line the rule looks for on success).
#: Written here from the task's instruction and expected output, not OSWorld's bytes.
OS_SCRIPTS = {
    "5ced85fc": {
        "eval.sh": _sh(
            "expected=\"$(printf '1<br/>\\n2<br/>\\n3<br/>')\"",
            'if [ -f output.txt ] && [ "$(cat output.txt)" = "$expected" ]; then',
            '  echo "Success: The task has been completed correctly."',
            'else echo "Failure: output.txt is not as expected."; fi',
        ),
    },
    "6f56bf42": {
        "setup.sh": _sh("mkdir -p dir1 dir2 dir3", "echo 'the first file' > file1"),
        "eval.sh": _sh(
            "for d in dir1 dir2 dir3; do",
            '  if cmp -s file1 "$d/file1"; then echo "Success: file1 exists in $d.";',
            '  else echo "Failure: file1 is missing in $d."; fi',
            "done",
        ),
    },
    "4d117223": {
        "setup.sh": _sh(
            "mkdir -p testDir/a/b testDir/c",
            "for f in testDir/one testDir/a/two testDir/a/b/three testDir/c/four; do echo x > $f; done",
            "chmod 600 testDir/one; chmod 755 testDir/a/two; chmod 700 testDir/a/b/three",
            "chmod 666 testDir/c/four",
        ),
        "eval.sh": _sh(
            'bad="$(find testDir -type f ! -perm 644)"',
            'if [ -z "$bad" ] && [ "$(find testDir -type f | wc -l)" = 4 ]; then',
            '  echo "All files have the correct permissions."',
            'else echo "Wrong permissions: $bad"; fi',
        ),
    },
    "5c1075ca": {
        "setup.sh": _sh(
            "mkdir -p test_environment/dir1/sub test_environment/dir2",
            "cd test_environment",
            "touch run1_failed.ipynb dir1/run2_failed.ipynb dir1/sub/run3_failed.ipynb",
            "touch dir1/ok.ipynb dir2/notes_passed.ipynb dir2/run4_failed.ipynb",
        ),
        "eval.sh": _sh(
            "cd test_environment || exit 1",
            "want='./fails/dir1/run2_failed.ipynb ./fails/dir1/sub/run3_failed.ipynb "
            "./fails/dir2/run4_failed.ipynb ./fails/run1_failed.ipynb'",
            "got=\"$(find ./fails -type f 2>/dev/null | sort | tr '\\n' ' ' | sed 's/ $//')\"",
            'if [ "$got" = "$want" ]; then echo "Evaluation successful."; '
            'else echo "Evaluation failed: $got"; fi',
        ),
    },
}


OUTLINE = [
    "GEOG2169 Course Outline 2022-23",
    "The course covers the physical geography of river basins.",
    "Assessment is by one essay and one examination.",
    "Extra reading lists follow in week two.",
]
SOLAR = [
    "The Sun holds more than 99 percent of the mass of the Solar System.",
    "Eight planets orbit it, from Mercury to Neptune.",
]


def _title_case(lines: list[str]) -> list[str]:
    return [" ".join(word[:1].upper() + word[1:] for word in line.split(" ")) for line in lines]


#: The profile folder OSWorld's ``thunderbird-profile.tar.gz`` holds (its getters read files in it).
THUNDERBIRD_PROFILE = "t5q2a5hp.default-release"


def thunderbird_profile() -> bytes:
    """A stand-in for OSWorld's ``thunderbird-profile.tar.gz`` as its configs unpack it into HOME
    (``.thunderbird/...``): the baseline HOME's Thunderbird files (``profiles.ini``,
    ``installs.ini``, the profile's ``user.js``: a Local Folders account, the first-start windows
    off; :mod:`legato_pipelines.desktops.server.home`) under OSWorld's profile folder name. No
    Thunderbird start, no download; without OSWorld's Outlook account and mail, so a grader
    reading those scores 0 (docs/osworld.md, Thunderbird)."""
    folder = home.THUNDERBIRD_PROFILE.split("/")[1]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for rel, text in home.BASELINE_FILES.items():
            if rel.startswith(".thunderbird/"):
                data = text.replace(folder, THUNDERBIRD_PROFILE).encode()
                info = tarfile.TarInfo(rel.replace(folder, THUNDERBIRD_PROFILE))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


#: task id -> file name (the task's ``path`` / ``dest`` base name) -> the bytes' builder
BUILDERS: dict[str, dict[str, Callable[[], bytes]]] = {
    "3ef2b351-8a84-4ff2-8724-d86eae9b842e": {
        "Constitution_Template_With_Guidelines.docx": lambda: _docx(
            CONSTITUTION, heading="Constitution of the Student Chess Club"
        ),
    },
    "ecc2413d-8a48-416e-a3a2-d30106ca36cb": {
        # four page breaks: the task's evaluator wants five once the blank page is added
        "Sample_Statutory_Declaration.docx": lambda: _docx(DECLARATION, page_breaks=4),
    },
    "0e763496-b6bb-4508-a427-fad0b6c3e195": {
        "Dublin_Zoo_Intro.docx": lambda: _docx(ZOO, heading="Dublin Zoo"),
    },
    "d53ff5ee-3b1a-431e-b2be-30ed2673079b": {
        "presentation_instruction_2023_Feb.docx": lambda: _docx(SHOUTED),
        "presentation_instruction_2023_Feb_Gold.docx": lambda: _docx(
            [line.lower() for line in SHOUTED]
        ),
    },
    "e528b65e-1107-4b8c-8988-490e4fece599": {
        "Geography_And_Magical_Realism.docx": lambda: _docx(GEOGRAPHY),
        "Geography_And_Magical_Realism_Gold.docx": lambda: _docx(_title_case(GEOGRAPHY)),
    },
    "0b17a146-2934-46c7-8727-73ff6b6483e8": {
        "H2O_Factsheet_WA.docx": lambda: _h2o(subscript=False),
        "H2O_Factsheet_WA_Gold.docx": lambda: _h2o(subscript=True),
    },
    "7efeb4b1-3d19-4762-b163-63328d66303b": {
        "Order_Sales_Serial#.xlsx": lambda: _xlsx([ORDERS, *ORDER_ROWS]),
        "Order_Sales_Serial#_gold.xlsx": lambda: _xlsx(
            [ORDERS, *([f"No. {i}", *row[1:]] for i, row in enumerate(ORDER_ROWS, 1))]
        ),
    },
    "51b11269-2ca8-4b2a-9163-f21758420e78": {
        "Arrang_Value_min_to_max.xlsx": lambda: _xlsx(PAYMENTS),
        "Arrang_Value_min_to_max_gold.xlsx": lambda: _xlsx(
            [PAYMENTS[0], *sorted(PAYMENTS[1:], key=lambda row: row[1])]
        ),
    },
    "4188d3a4-077d-46b7-9c86-23e1a036f6c1": {
        "Freeze_row_column.xlsx": lambda: _xlsx(STAFF),
        "Freeze_row_column_gold.xlsx": lambda: _xlsx(STAFF, freeze="C2"),
    },
    "2b9493d7-49b8-493a-a71b-56cd1f4d6908": {
        "15-MB-docx-file-download.docx": lambda: _docx(ZOO * 40, heading="A long report"),
    },
    "a097acff-6266-4291-9fbd-137af7ecd439": {
        "Secrets-of-Monetizing-Video.pptx": lambda: _pptx(SLIDES),
    },
    "ce88f674-ab7a-43da-9201-468d38539e4a": {
        "AM_Last_Page_Template.pptx": lambda: _pptx([("Thank you", "Questions welcome")]),
    },
    "5ea617a3-0e86-4ba6-aab2-dac9aa2e8d57": {"poster_party_night.webp": _webp},
    "0810415c-bde4-4443-9047-d5f70165a697": {
        "Novels_Intro_Packet.docx": lambda: _docx(GEOGRAPHY),
        "Novels_Intro_Packet_Gold.docx": lambda: _docx(GEOGRAPHY, double_spaced=2),
        "Novels_Intro_Packet_Gold_2.docx": lambda: _docx(GEOGRAPHY, double_spaced=2),
    },
    "72b810ef-4156-4d09-8f08-a0cf57e7cefe": {
        "GEOG2169_Course_Outline_2022-23.docx": lambda: _docx(OUTLINE),
        "GEOG2169_Course_Outline_2022-23_Gold.docx": lambda: _docx(OUTLINE),
    },
    "f178a4a9-d090-4b56-bc4c-4b72a61a035d": {
        "loa-one-time-submission-sealand.docx": lambda: _docx(DECLARATION),
    },
    "bb8ccc78-479f-4a2f-a71e-d565e439436b": {
        "The Wonders of Our Solar System.docx": lambda: _docx(SOLAR, heading="Our Solar System"),
    },
    "1334ca3e-f9e3-4db8-9ca7-b4c653be7d17": {
        "Zoom_Out_Oversized_Cells.xlsx": lambda: _xlsx(PAYMENTS, zoom=400),
        "Zoom_Out_Oversized_Cells_gold.xlsx": lambda: _xlsx(PAYMENTS),
    },
    "3f49d2cc-f400-4e7d-90cc-9b18e401cc31": {"thunderbird-profile.tar.gz": thunderbird_profile},
    "a10b69e1-6034-4a2b-93e1-571d45194f75": {"thunderbird-profile.tar.gz": thunderbird_profile},
    # OSWorld's blank profile has no account: the stand-in's Local Folders only is as blank
    "a1af9f1c-50d5-4bc3-a51e-4d9b425ff638": {
        "thunderbird-profile-blank.tar.gz": thunderbird_profile
    },
    **{
        task_id: {name: (lambda data=data: data) for name, data in OS_SCRIPTS[task_id[:8]].items()}
        for task_id in (
            "5ced85fc-fa1a-4217-95fd-0fb530545ce2",
            "6f56bf42-85b8-4fbb-8e06-6c44960184ba",
            "4d117223-a354-47fb-8b45-62ab1390a95f",
            "5c1075ca-bb34-46a3-a7a0-029bd7463e79",
        )
    },
}


def fill_cache(cache_dir: str | Path, tasks: list[Task]) -> list[Path]:
    """Write every file ``tasks`` reference (setup downloads and ``cloud_file`` gold files) into
    ``cache_dir`` under OSWorld's cache names; the paths written.

    Raises ``KeyError`` naming the task and file when a task references a file no builder
    makes (add one to :data:`BUILDERS`). Tasks without files are skipped.
    """
    written = []
    for task in tasks:
        for file in task_files(task):
            name = PurePosixPath(file.dest or file.url).name
            builders = BUILDERS.get(task.task_id, {})
            if name not in builders:
                raise KeyError(
                    f"task {task.task_id!r}: no builder for {name!r} ({file.field}); "
                    "fix: add one to BUILDERS in examples/tasks/osworld_solved/files.py"
                )
            path = Path(cache_dir) / task.task_id / cache_file_name(file)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(builders[name]())
            written.append(path)
    return written


if __name__ == "__main__":
    from legato_pipelines.tasks import load_tasks

    here = Path(__file__).resolve().parent
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/tasks/osworld_solved/files.py CACHE_DIR")
    repo = here.parents[2]
    tasks = load_tasks(here / "tasks.json", osworld=repo / "tests" / "data" / "osworld")
    for path in fill_cache(sys.argv[1], list(tasks)):
        print(path)
