"""Metrics on real files: OSWorld names, signatures and scores."""

from __future__ import annotations

import openpyxl
import pytest

from legato_pipelines.osworld_format.metrics import (
    METRICS,
    check_direct_json_object,
    check_include_exclude,
    check_list,
    compare_csv,
    compare_table,
    compare_text_file,
    diff_text_file,
    exact_match,
    match_value_to_rule,
)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_exact_match_and_include_exclude():
    assert exact_match("a", {"expected": "a"}) == 1.0
    assert exact_match("a\n", {"expected": "a"}) == 0.0
    rules = {"include": ["use terminal"], "exclude": ["error"]}
    assert check_include_exclude("use terminal\n", rules) == 1.0
    assert check_include_exclude("use terminal; error", rules) == 0.0
    assert check_include_exclude(None, rules) == 0.0


def test_compare_text_file_options(tmp_path):
    a = write(tmp_path, "a.txt", "Hello\tWorld\n\n")
    b = write(tmp_path, "b.txt", "hello world")
    assert compare_text_file(a, b) == 0.0
    assert compare_text_file(a, b, ignore_blanks=True) == 0.0
    assert compare_text_file(a, b, ignore_blanks=True, ignore_case=True) == 1.0
    assert compare_text_file(None, b) == 0.0


def test_diff_text_file_is_line_similarity(tmp_path):
    a = write(tmp_path, "a.txt", "1\n2\n3\n")
    b = write(tmp_path, "b.txt", "1\n2\n3\n4\n5\n")
    assert diff_text_file(a, b) == pytest.approx(2 * 3 / 8)
    assert diff_text_file(b, b) == 1.0


def test_compare_csv_strict_case_and_alternatives(tmp_path):
    got = write(tmp_path, "got.csv", "Item,Qty \napples,3\n")
    want = write(tmp_path, "want.csv", "item,qty\napples,3")
    assert compare_csv(got, want) == 0.0
    assert compare_csv(got, want, strict=False) == 0.0
    assert compare_csv(got, want, strict=False, ignore_case=True) == 1.0
    other = write(tmp_path, "other.csv", "Item,Qty \napples,3")
    assert compare_csv(got, [want, other]) == 1.0
    assert compare_csv(None, want) == 0.0


def test_check_direct_json_object_modes():
    rules = {"expected": {"name": "legato", "version": 2}}
    assert check_direct_json_object('{"name": "legato", "version": 2, "x": 1}', rules) == 1.0
    assert (
        check_direct_json_object("{'name': 'legato', 'version': 2}", rules) == 1.0
    )  # single quotes ok
    assert check_direct_json_object({"name": "legato", "version": "2"}, rules) == 0.0
    ordered = {"expected": {"m": ["a", "b"]}, "ignore_list_order": True}
    assert check_direct_json_object({"m": ["b", "a"]}, ordered) == 1.0
    assert check_direct_json_object({"m": ["b", "a"]}, {"expected": {"m": ["a", "b"]}}) == 0.0
    contains = {"expected": {"q": "python", "lang": ["en", "de"]}, "expect_in_result": True}
    assert check_direct_json_object({"q": "learn python fast", "lang": "de"}, contains) == 1.0
    assert check_direct_json_object({"q": "learn python fast", "lang": "fr"}, contains) == 0.0
    with pytest.raises(ValueError):
        check_direct_json_object("{broken", rules)


def test_check_list_expect_and_unexpect(tmp_path):
    f = write(
        tmp_path, "out.txt", "gnome-terminal-server.Gnome-terminal host ~/Projects\nnautilus\n"
    )
    assert check_list(f, {"expect": [r"gnome-terminal", r"^nautilus$"]}) == 1.0
    assert check_list(f, {"expect": [r"chrome"]}) == 0.0
    assert check_list(f, {"unexpect": [r".+"]}) == 0.0
    assert check_list(write(tmp_path, "empty.txt", ""), {"unexpect": [r".+"]}) == 1.0


def test_match_value_to_rule_methods():
    assert match_value_to_rule("Investment Summary", {"method": "eq", "ref": "Investment Summary"})
    assert match_value_to_rule(12.0004, {"method": "approx:0.001", "ref": 12})
    assert not match_value_to_rule(None, {"method": "approx:0.001", "ref": 12})
    assert match_value_to_rule("Total: 12", {"method": "re.I", "ref": "total"})
    assert match_value_to_rule(5, {"method": "gt", "ref": 3})
    with pytest.raises(NotImplementedError):
        match_value_to_rule(1, {"method": "spreadsheet_range", "ref": ["A1", "B2"]})


def workbook(path, rows, title="Sheet1"):
    wb = openpyxl.Workbook()
    ws = wb.active
    ws.title = title
    for row in rows:
        ws.append(row)
    wb.save(path)
    return str(path)


def test_compare_table_rules(tmp_path):
    result = workbook(tmp_path / "r.xlsx", [["price", "units"], [4.00001, 3], [2.5, 10]])
    expected = workbook(tmp_path / "e.xlsx", [["price", "units"], [4, 3], [2.5, 10]])
    data = {"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}
    assert compare_table(result, expected, rules=[data]) == 1.0  # rounded to 4 decimals
    assert compare_table(result, expected, rules=[{**data, "precision": 6}]) == 0.0
    cell = {
        "type": "check_cell",
        "sheet_idx": "RNSheet1",
        "coordinate": "A3",
        "props": {"value": {"method": "eq", "ref": 2.5}},
    }
    assert compare_table(result, expected, rules=[cell, {"type": "sheet_name"}]) == 1.0
    renamed = workbook(tmp_path / "n.xlsx", [["price", "units"]], title="Data")
    assert compare_table(renamed, expected, rules=[{"type": "sheet_name"}]) == 0.0
    with pytest.raises(NotImplementedError, match="chart"):
        compare_table(
            result, expected, rules=[{"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
        )
    not_a_workbook = write(tmp_path, "bad.xlsx", "plain text")
    assert compare_table(not_a_workbook, expected, rules=[data]) == 0.0
    assert compare_table(None, expected, rules=[data]) == 0.0


def test_registry_names_match_functions():
    for name, metric in METRICS.items():
        assert metric.__name__ == name
