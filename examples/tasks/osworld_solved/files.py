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
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import docx
import openpyxl
import pptx
from docx.enum.text import WD_BREAK
from pptx.dml.color import RGBColor
from pptx.enum.text import PP_ALIGN
from pptx.oxml.ns import qn
from pptx.util import Pt

from legato_pipelines.osworld_format.fetch import cache_file_name
from legato_pipelines.osworld_format.files import task_files
from legato_pipelines.tasks import Task


def _docx(paragraphs: list[str], *, heading: str | None = None, page_breaks: int = 0) -> bytes:
    """A Word document: an optional heading, then ``paragraphs``; ``page_breaks`` manual page
    breaks spread after the first paragraphs (each one page: ``w:br w:type="page"``)."""
    doc = docx.Document()
    if heading is not None:
        doc.add_paragraph(heading, style="Heading 1")
    for i, text in enumerate(paragraphs):
        paragraph = doc.add_paragraph(text)
        if i < page_breaks:
            paragraph.add_run().add_break(WD_BREAK.PAGE)
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


def _xlsx(rows: list[list], *, freeze: str | None = None) -> bytes:
    """A workbook of one sheet ``Sheet1`` holding ``rows`` from A1 (values only, no formulas);
    ``freeze``: the top-left cell of the unfrozen pane (``"C2"`` freezes row 1 and columns A:B)."""
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Sheet1"
    for row in rows:
        sheet.append(row)
    sheet.freeze_panes = freeze
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


def _title_case(lines: list[str]) -> list[str]:
    return [" ".join(word[:1].upper() + word[1:] for word in line.split(" ")) for line in lines]


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
