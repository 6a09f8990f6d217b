"""The desktop's accessibility tree as OSWorld's ``/accessibility`` returns it, from AT-SPI.

Run *inside the desktop* (its session bus, as its user) by the system ``python3`` with Debian's
``python3-pyatspi``: the desktop server passes this file's source to ``python3 -c`` (the
project is not visible inside a sandbox), so it imports the standard library and pyatspi only.
Prints one XML document on stdout; exits 3 when pyatspi is missing.

The shape is the one OSWorld's in-VM server builds (``desktop_env/server/main.py``,
``get_accessibility_tree`` / ``_create_atspi_node``), which its getters and agents parse:

- the root ``desktop-frame``, one child per AT-SPI application, depth at most 50, at most 1024
  children a node;
- a node's tag is its role name with spaces as ``-`` (``push-button``, ``document-
  spreadsheet``; ``unknown`` when empty); attributes: ``name``; ``st:<state>="true"`` for
  every state; ``attr:<key>`` for the object attributes; for visible and showing nodes with a
  component ``cp:screencoord="(x, y)"`` and ``cp:size="(w, h)"`` (pixels, screen
  coordinates); ``image``/``selection="true"`` when the node has that interface;
  ``val:value/min/max/step`` for values; ``act:<action>_desc`` / ``_kb`` for actions; its
  text (U+FFFC and U+FFFD removed) as the element's text;
- an application named as in OSWorld's VM (:data:`APP_NAMES`: Chromium as Google Chrome);
- namespaces ``st attr cp doc docattr txt val act`` under
  ``https://accessibility.ubuntu.example.org/ns/...``;
- in a spreadsheet's table only the cells on screen (showing), row by row, as OSWorld does:
  a Calc sheet has 16384 x 1048576 cells.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

NS = {
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
#: Application names as OSWorld's getters select them: Debian's Chromium runs as
#: ``google-chrome`` on local desktops (chrome.py) but names itself "Chromium" (its build's
#: product name); ``get_active_url_from_accessTree`` looks for
#: ``application[name=Google\ Chrome]``, as Google's build in OSWorld's VM names itself.
APP_NAMES = {"Chromium": "Google Chrome"}
MAX_DEPTH = 50
MAX_WIDTH = 1024
#: Calc's columns a row (LibreOffice >= 7.4) and how far a row or column is searched for the
#: first cell on screen (OSWorld's limits).
SHEET_COLUMNS = 16384
SHEET_ROWS = 1048576
SHEET_SEARCH = 500


def q(prefix: str, name: str) -> str:
    """An attribute name in one of :data:`NS` (``{uri}name``)."""
    return "{" + NS[prefix] + "}" + name


def node_element(pyatspi, node, depth: int, flag: str | None) -> ET.Element:
    """``node`` and what is below it as an element (see the module docstring)."""
    attrs = {"name": node.name or ""}
    state_names = pyatspi.StateType._enum_lookup
    for state in node.getState().get_states():
        name = state_names[state].split("_", 1)[1].lower()
        if name:
            attrs[q("st", name)] = "true"
    try:
        for key, value in node.get_attributes().items():
            if key:
                attrs[q("attr", key)] = value
    except Exception:
        pass
    if attrs.get(q("st", "visible")) == "true" and attrs.get(q("st", "showing")) == "true":
        try:
            box = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
            attrs[q("cp", "screencoord")] = str((box[0], box[1]))
            attrs[q("cp", "size")] = str((box[2], box[3]))
        except NotImplementedError:
            pass
    text = ""
    try:
        text_iface = node.queryText()
        text = text_iface.getText(0, text_iface.characterCount)
        text = text.replace("\ufffc", "").replace("\ufffd", "")
    except NotImplementedError:
        pass
    for key, query in (("image", node.queryImage), ("selection", node.querySelection)):
        try:
            query()
            attrs[key] = "true"
        except NotImplementedError:
            pass
    try:
        value = node.queryValue()
        for key, read in (
            ("value", lambda: value.currentValue),
            ("min", lambda: value.minimumValue),
            ("max", lambda: value.maximumValue),
            ("step", lambda: value.minimumIncrement),
        ):
            try:
                attrs[q("val", key)] = str(read())
            except Exception:
                pass
    except NotImplementedError:
        pass
    try:
        action = node.queryAction()
        for i in range(action.nActions):
            name = action.getName(i).replace(" ", "-")
            attrs[q("act", name + "_desc")] = action.getDescription(i)
            attrs[q("act", name + "_kb")] = action.getKeyBinding(i)
    except NotImplementedError:
        pass
    role = node.getRoleName().strip()
    if role == "application":
        attrs["name"] = APP_NAMES.get(attrs["name"], attrs["name"])
    if not flag and role == "document spreadsheet":
        flag = "calc"
    element = ET.Element((role or "unknown").replace(" ", "-"), attrs)
    if text:
        element.text = text
    if depth >= MAX_DEPTH:
        return element
    if flag == "calc" and role == "table":
        for cell in showing_cells(pyatspi, node):
            element.append(node_element(pyatspi, cell, depth + 1, flag))
        return element
    try:
        for i, child in enumerate(node):
            if i == MAX_WIDTH:
                break
            element.append(node_element(pyatspi, child, depth + 1, flag))
    except Exception:  # an app that went away or answers wrongly: keep what was read
        pass
    return element


def showing_cells(pyatspi, table):
    """The cells of a Calc sheet on screen, row by row: the first row with a showing cell
    sets the first column; later rows start there and end at their first hidden cell; the
    walk ends at the first row whose first column is hidden (or after 500 rows with none)."""
    base, first_column = 0, None
    for row in range(SHEET_ROWS):
        found = False
        column = first_column or 0
        while column < SHEET_COLUMNS:
            cell = table[base + column]
            if cell.getState().contains(pyatspi.STATE_SHOWING):
                if first_column is None:
                    first_column = column
                found = True
                yield cell
            elif first_column is not None or column >= SHEET_SEARCH:
                break
            column += 1
        if (first_column is not None and not found) or (first_column is None and row >= 500):
            return
        base += SHEET_COLUMNS


def main() -> int:
    try:
        import pyatspi
    except ImportError:
        print("pyatspi is missing (apt-get install python3-pyatspi)", file=sys.stderr)
        return 3
    for prefix, uri in NS.items():
        ET.register_namespace(prefix, uri)
    root = ET.Element("desktop-frame")
    for app in pyatspi.Registry.getDesktop(0):
        try:
            root.append(node_element(pyatspi, app, 1, None))
        except Exception as exc:  # an app that exited while being read
            print(f"skipped an application: {exc}", file=sys.stderr)
    sys.stdout.write(ET.tostring(root, encoding="unicode"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
