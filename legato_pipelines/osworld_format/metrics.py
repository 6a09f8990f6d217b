"""Evaluator metrics: OSWorld's names, signatures and scores, for the ones that run locally.

Each metric is a plain function ``(result, expected?, **options) -> float`` with the same name,
argument order and semantics as in OSWorld's ``desktop_env/evaluators/metrics`` (``general.py``,
``docs.py``, ``table.py``), written here over the standard library and openpyxl/pandas. A
``None`` result scores 0 (a missing file). A metric that raises is scored 0 by
:func:`~legato_pipelines.osworld_format.evaluate_task`, with the reason recorded.

``compare_table`` implements the rule types ``sheet_name``, ``sheet_data`` and ``check_cell``
(``value`` only); other rule types raise ``NotImplementedError`` (see :data:`TABLE_RULE_TYPES`).
"""

from __future__ import annotations

import csv
import difflib
import functools
import json
import operator
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

Metric = Callable[..., float]


def _read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace")


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    """1 if ``result == rules["expected"]`` (OSWorld general.exact_match)."""
    return 1.0 if result == rules["expected"] else 0.0


def check_include_exclude(result: str | None, rules: dict[str, list[str]]) -> float:
    """1 if every ``rules["include"]`` string is in ``result`` and no ``rules["exclude"]`` one is."""
    if result is None:
        return 0.0
    include, exclude = rules.get("include", []), rules.get("exclude", [])
    ok = all(s in result for s in include) and all(s not in result for s in exclude)
    return 1.0 if ok else 0.0


def compare_text_file(actual: str | None, expected: str, **options: Any) -> float:
    """1 if the two text files are equal (OSWorld docs.compare_text_file).

    Options: ``ignore_blanks`` (tabs/newlines -> spaces, runs of whitespace collapsed, ends
    stripped), ``ignore_case``.
    """
    if not actual:
        return 0.0
    actual_text, expected_text = _read_text(actual), _read_text(expected)
    if options.get("ignore_blanks", False):
        actual_text = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", actual_text).strip())
        expected_text = re.sub(r"\s+", " ", re.sub(r"[\t\n]", " ", expected_text).strip())
    if options.get("ignore_case", False):
        actual_text, expected_text = actual_text.lower(), expected_text.lower()
    return 1.0 if actual_text == expected_text else 0.0


def diff_text_file(result: str | None, expect: str) -> float:
    """Line similarity in [0, 1]: ``difflib.SequenceMatcher`` ratio over the files' lines."""
    if result is None:
        return 0.0
    return difflib.SequenceMatcher(
        a=_read_text(result).splitlines(), b=_read_text(expect).splitlines()
    ).ratio()


def check_direct_json_object(result: Any, rules: dict[str, Any]) -> float:
    """Compare a JSON object (or its text, single quotes allowed) with ``rules["expected"]``.

    Default: every expected key must have the same value (``ignore_list_order`` in ``rules``
    compares sorted lists). With ``rules["expect_in_result"]``: a list value means "one of
    these" (in a result list or equal to a result string), a string value means "substring of".
    """
    if isinstance(result, str):
        result = json.loads(result.strip().replace("'", '"'))
    if result is None:
        return 0.0
    expected: dict[str, Any] = rules["expected"]
    if not rules.get("expect_in_result", False):
        for key, want in expected.items():
            got = result.get(key)
            if (
                rules.get("ignore_list_order", False)
                and isinstance(want, list)
                and isinstance(got, list)
            ):
                want, got = sorted(want), sorted(got)
            if want != got:
                return 0.0
        return 1.0
    for key, want in expected.items():
        got = result.get(key)
        if isinstance(want, list):
            if not any(
                (isinstance(got, list) and w in got) or (isinstance(got, str) and w == got)
                for w in want
            ):
                return 0.0
        elif isinstance(want, str):
            if not isinstance(got, str) or want not in got:
                return 0.0
        else:
            return 0.0
    return 1.0


def compare_csv(result: str | None, expected: str | list[str], **options: Any) -> float:
    """1 if the CSV file's lines equal those of ``expected`` (or of any file in a list of them).

    Options (OSWorld table.compare_csv): ``strict`` (default True; False strips each line),
    ``ignore_case``.
    """
    if result is None:
        return 0.0
    result_lines = _read_text(result).splitlines()
    for path in [expected] if isinstance(expected, str) else list(expected):
        expected_lines = _read_text(path).splitlines()
        a, b = result_lines, expected_lines
        if not options.get("strict", True):
            a, b = [s.strip() for s in a], [s.strip() for s in b]
        if options.get("ignore_case", False):
            a, b = [s.lower() for s in a], [s.lower() for s in b]
        if a == b:
            return 1.0
    return 0.0


def check_csv(result: str | None, rules: dict[str, list[dict[str, str]]]) -> float:
    """1 if some row matches each ``rules["expect"]`` record and no row any ``rules["unexpect"]`` one."""
    if result is None:
        return 0.0
    expect, unexpect = rules.get("expect", []), rules.get("unexpect", [])
    found = [False] * len(expect)
    clean = True
    with open(result, newline="", encoding="utf-8", errors="replace") as handle:
        for row in csv.DictReader(handle):
            for i, record in enumerate(expect):
                found[i] = found[i] or _match_record(record, row)
            clean = clean and not any(_match_record(record, row) for record in unexpect)
    return 1.0 if all(found) and clean else 0.0


def _match_record(pattern: dict[str, Any], row: dict[str, Any]) -> bool:
    return all(key in row and row[key] == value for key, value in pattern.items())


def check_list(result: str | None, rules: dict[str, list[str]]) -> float:
    """1 if each ``rules["expect"]`` regex matches some line and no ``rules["unexpect"]`` one any line."""
    if result is None:
        return 0.0
    expect = [re.compile(p) for p in rules.get("expect", [])]
    unexpect = [re.compile(p) for p in rules.get("unexpect", [])]
    found = [False] * len(expect)
    clean = True
    for line in _read_text(result).splitlines(keepends=True):
        for i, pattern in enumerate(expect):
            found[i] = found[i] or pattern.search(line) is not None
        clean = clean and all(pattern.search(line) is None for pattern in unexpect)
    return 1.0 if all(found) and clean else 0.0


def is_in_list(result: Any, rules: dict[str, Any]) -> float:
    """1 if ``rules["expected"] in result``."""
    return 1.0 if rules["expected"] in result else 0.0


def match_in_list(result: Any, rules: dict[str, Any]) -> float:
    """1 if ``result in rules["expected"]``."""
    return 1.0 if result in rules["expected"] else 0.0


def literal_match(result: Any, expected: Any, **options: Any) -> float:
    """String (``type: str``, default) or list (``type: list``) equality, ``ignore_case`` optional."""
    kind, fold = options.get("type", "str"), options.get("ignore_case", False)
    if kind == "str":
        a, b = str(result), str(expected)
        return float(a.lower() == b.lower() if fold else a == b)
    if kind == "list":
        if (
            not isinstance(result, list | tuple)
            or not isinstance(expected, list | tuple)
            or len(result) != len(expected)
        ):
            return 0.0
        a = [str(s).lower() if fold else str(s) for s in result]
        b = [str(s).lower() if fold else str(s) for s in expected]
        return float(a == b)
    raise NotImplementedError(f"literal_match: type {kind!r} is not supported")


def infeasible(*args: Any, **kwargs: Any) -> float:
    """Never called: ``evaluate_task`` scores ``infeasible`` tasks by the last action (FAIL = 1)."""
    raise RuntimeError("infeasible is decided by the last action, not computed")


# --- compare_table (OSWorld table.compare_table, the common rule types) ---

TABLE_RULE_TYPES = frozenset({"sheet_name", "sheet_data", "check_cell"})


def match_value_to_rule(value: Any, rule: dict[str, Any]) -> bool:
    """OSWorld's ``_match_value_to_rule``: ``{"method", "ref"}`` with ``re[.FLAG...]``,
    ``eq/ne/le/lt/ge/gt``, ``approx:THRESHOLD``, ``str_list_eq``, ``str_set_eq``."""
    method, ref = rule["method"], rule.get("ref")
    if method.startswith("re"):
        flags = functools.reduce(
            operator.or_, (getattr(re, f) for f in method.split(".")[1:]), re.RegexFlag(0)
        )
        return re.search(ref, str(value), flags) is not None
    if method in {"eq", "ne", "le", "lt", "ge", "gt"}:
        return bool(getattr(operator, method)(value, ref))
    if method.startswith("approx"):
        try:
            return abs(float(value) - float(ref)) <= float(method.split(":")[1])
        except (TypeError, ValueError):
            return False
    if method == "str_list_eq":
        return [str(v) for v in (value or [])] == [str(r) for r in ref]
    if method == "str_set_eq":
        return {str(v) for v in (value or [])} == {str(r) for r in ref}
    raise NotImplementedError(f"rule method {method!r} is not supported locally")


def _sheet_name(
    idx: int | str, result_names: list[str], expected_names: list[str] | None
) -> tuple[str, str]:
    """``("result"|"expected", sheet name)`` for OSWorld's sheet index (0, "RI0", "RNSheet1", "EI0", "ENSheet1")."""

    def pick(names: list[str] | None, position: str) -> str:
        try:
            return (names or [])[int(position)]
        except (ValueError, IndexError):
            return ""

    if isinstance(idx, int):
        return "result", pick(result_names, str(idx))
    prefix, rest = idx[:2], idx[2:]
    if prefix == "RI":
        return "result", pick(result_names, rest)
    if prefix == "RN":
        return "result", rest
    if prefix == "EI":
        return "expected", pick(expected_names, rest)
    if prefix == "EN":
        return "expected", rest
    raise ValueError(f"compare_table: unrecognized sheet index {idx!r}")


def compare_table(result: str | None, expected: str | None = None, **options: Any) -> float:
    """Check an xlsx workbook rule by rule (``options["rules"]``); 1 only if every rule holds.

    Rules: ``sheet_name`` (same sheet names as expected), ``sheet_data`` (``sheet_idx0``,
    ``sheet_idx1``, ``precision`` = 4 decimals: pandas frames equal after rounding),
    ``check_cell`` (``sheet_idx``, ``coordinate``, ``props: {"value": {method, ref}}``; computed
    values, as saved by the app). A result that is not a readable workbook scores 0.
    """
    import openpyxl
    import pandas as pd

    if result is None:
        return 0.0
    try:
        books = {"result": openpyxl.load_workbook(result, data_only=True)}
        frames = {"result": pd.ExcelFile(result, engine="openpyxl")}
    except Exception:
        return 0.0
    if expected is not None:
        books["expected"] = openpyxl.load_workbook(expected, data_only=True)
        frames["expected"] = pd.ExcelFile(expected, engine="openpyxl")
    result_names = list(books["result"].sheetnames)
    expected_names = list(books["expected"].sheetnames) if expected is not None else None
    for rule in options.get("rules", []):
        kind = rule["type"]
        if kind == "sheet_name":
            ok = result_names == expected_names
        elif kind == "sheet_data":
            frames_pair = []
            for key in ("sheet_idx0", "sheet_idx1"):
                side, name = _sheet_name(rule[key], result_names, expected_names)
                if side not in frames or name not in books[side].sheetnames:
                    return 0.0
                frames_pair.append(
                    pd.read_excel(frames[side], name).round(rule.get("precision", 4))
                )
            ok = frames_pair[0].equals(frames_pair[1])
        elif kind == "check_cell":
            side, name = _sheet_name(rule["sheet_idx"], result_names, expected_names)
            if side not in books or name not in books[side].sheetnames:
                return 0.0
            value = books[side][name][rule["coordinate"]].value
            ok = True
            for prop, prop_rule in rule["props"].items():
                if prop != "value":
                    raise NotImplementedError(
                        f"compare_table check_cell: property {prop!r} is not supported locally"
                    )
                ok = ok and match_value_to_rule(value, prop_rule)
        else:
            raise NotImplementedError(f"compare_table: rule type {kind!r} is not supported locally")
        if not ok:
            return 0.0
    return 1.0


METRICS: dict[str, Metric] = {
    "exact_match": exact_match,
    "check_include_exclude": check_include_exclude,
    "compare_text_file": compare_text_file,
    "diff_text_file": diff_text_file,
    "check_direct_json_object": check_direct_json_object,
    "compare_csv": compare_csv,
    "check_csv": check_csv,
    "check_list": check_list,
    "is_in_list": is_in_list,
    "match_in_list": match_in_list,
    "literal_match": literal_match,
    "compare_table": compare_table,
    "infeasible": infeasible,
}
