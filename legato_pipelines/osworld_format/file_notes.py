"""Facts about the files an evaluator compared, noted on the record without changing the grade.

Standard library only: the ``osworld`` backend's worker (OSWorld's interpreter, which cannot
import this package) loads this file by its path and notes the same facts about what
OSWorld's own metrics were given.

``uncached_formulas``: an xlsx stores each formula with the value it last computed (``<f>``
and ``<v>`` in the sheet XML). A spreadsheet app writes both; a library that does not compute
formulas (openpyxl) writes the formula with an empty value. Every reader of cached values
(openpyxl ``data_only=True``, pandas, OSWorld's ``compare_table``) then sees an empty cell, so
such a file usually scores 0 whatever its formulas say. OSWorld's grade stands (the same
metric, the same reward); the note says why it is what it is.
"""

from __future__ import annotations

import os
import posixpath
import zipfile
from collections.abc import Iterable
from typing import Any
from xml.etree import ElementTree

UNCACHED_FORMULAS = "uncached_formulas"
"""The kind of note (the text before ``": "``) for an xlsx holding formulas without cached values."""
WORKBOOK_SUFFIXES = (".xlsx", ".xlsm")
SHOWN_CELLS = 5  # cells named in a note; the count covers them all

_MAIN = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_REL = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}"
_PKG_REL = "{http://schemas.openxmlformats.org/package/2006/relationships}"
#: Cell types whose empty ``<v>`` is a real cached value (a formula that gave "").
_TEXT_TYPES = frozenset({"str", "inlineStr"})


def _sheet_parts(book: zipfile.ZipFile) -> list[tuple[str, str]]:
    """``(sheet name, part path)`` in workbook order; falls back to the part names."""
    try:
        workbook = ElementTree.fromstring(book.read("xl/workbook.xml"))
        rels = ElementTree.fromstring(book.read("xl/_rels/workbook.xml.rels"))
    except (KeyError, ElementTree.ParseError):
        names = sorted(n for n in book.namelist() if n.startswith("xl/worksheets/sheet"))
        return [(posixpath.basename(n).rsplit(".", 1)[0], n) for n in names]
    targets = {r.get("Id"): r.get("Target", "") for r in rels.iter(f"{_PKG_REL}Relationship")}
    parts = []
    for sheet in workbook.iter(f"{_MAIN}sheet"):
        target = targets.get(sheet.get(f"{_REL}id"), "")
        path = target.lstrip("/") if target.startswith("/") else posixpath.join("xl", target)
        parts.append((sheet.get("name", ""), posixpath.normpath(path)))
    return parts


def uncached_formulas(path: str | os.PathLike) -> list[str]:
    """The formula cells of the xlsx at ``path`` that hold no cached value, as ``Sheet!A1``
    (workbook order). Empty for a workbook whose formulas were computed and saved by a
    spreadsheet app, and for a file that is not a readable xlsx (nothing to note)."""
    found: list[str] = []
    try:
        with zipfile.ZipFile(path) as book:
            for name, part in _sheet_parts(book):
                try:
                    handle = book.open(part)
                except KeyError:
                    continue
                with handle:
                    for _, cell in ElementTree.iterparse(handle):
                        if cell.tag != f"{_MAIN}c":
                            continue
                        if cell.find(f"{_MAIN}f") is not None:
                            value = cell.find(f"{_MAIN}v")
                            empty = value is None or not (value.text or "")
                            if empty and not (value is not None and cell.get("t") in _TEXT_TYPES):
                                found.append(f"{name}!{cell.get('r', '?')}")
                        cell.clear()
    except (OSError, zipfile.BadZipFile, ElementTree.ParseError):
        return found
    return found


def _paths(value: Any) -> Iterable[str]:
    if isinstance(value, str | os.PathLike):
        yield os.fspath(value)
    elif isinstance(value, list | tuple):
        for item in value:
            if isinstance(item, str | os.PathLike):
                yield os.fspath(item)


def file_notes(value: Any, role: str) -> list[str]:
    """Notes about the files in a getter's ``value`` (a path, or a list of them, as OSWorld's
    getters return) that a metric received as its ``role`` (``result`` | ``expected``).

    Each note reads ``"<kind>: <what>"``; today the one kind is :data:`UNCACHED_FORMULAS`.
    Values that are not paths to existing xlsx files give no notes; never raises for them.
    """
    notes = []
    for path in _paths(value):
        if not path.lower().endswith(WORKBOOK_SUFFIXES) or not os.path.isfile(path):
            continue
        cells = uncached_formulas(path)
        if cells:
            shown = ", ".join(cells[:SHOWN_CELLS]) + (", ..." if len(cells) > SHOWN_CELLS else "")
            notes.append(
                f"{UNCACHED_FORMULAS}: {role} {os.path.basename(path)} holds {len(cells)} "
                f"formula cell(s) without a cached value ({shown}): readers of cached values "
                "(compare_table, pandas) see them empty; it was saved by a program that does "
                "not compute formulas (e.g. openpyxl), not by a spreadsheet app"
            )
    return notes


def note_kind(note: str) -> str:
    """The kind of a note (its text before ``": "``), for counting notes per kind."""
    return note.partition(": ")[0]
