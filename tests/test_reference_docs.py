"""The docs stay true: the README is short and reaches every docs page, and the reference pages
(docs/reference/cli.md, docs/reference/environment.md) are the ones the code generates
(``python3 -m legato_pipelines.reference``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from legato_pipelines import reference
from legato_pipelines.rollout.settings import CollectSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
README = REPO_ROOT / "README.md"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEGATO_")}
    return env | {"PYTHONPATH": str(REPO_ROOT)}


@pytest.mark.slow
def test_the_committed_reference_pages_are_the_generated_ones():
    done = subprocess.run(
        [sys.executable, "-m", "legato_pipelines.reference", "--check"],
        cwd=REPO_ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_check_names_a_stale_or_missing_page(tmp_path):
    reference.write_pages(tmp_path)
    assert reference.stale_pages(tmp_path) == []
    page = tmp_path / reference.PAGES["cli"]
    page.write_text(page.read_text().replace("--max-steps", "--max-stepz"))
    (tmp_path / reference.PAGES["environment"]).unlink()
    assert reference.stale_pages(tmp_path) == [
        str(reference.PAGES["cli"]),
        str(reference.PAGES["environment"]),
    ]


def test_the_cli_page_carries_every_collection_setting_from_its_model():
    page = reference.cli_reference()
    collect = page.split("## `legato collect`", 1)[1].split("\n## ", 1)[0]
    for name, field in CollectSettings.model_fields.items():
        dashed = name.replace("_", "-")
        flag = f"--{dashed} / --no-{dashed}" if field.annotation is bool else f"--{dashed}"
        row = next((r for r in collect.splitlines() if r.startswith(f"| `{flag}")), None)
        assert row is not None, flag
        assert " ".join(field.description.split()) in row.replace("\\|", "|"), flag
    assert "/root" not in page and str(REPO_ROOT) not in page  # no value of this host


def test_every_variable_the_code_location_reads_sets_a_resource_field():
    mapping, defaults = reference.variable_fields()
    assert "LEGATO_POLICY_URL" in mapping and "LEGATO_LAKE" in mapping
    unmapped = sorted(name for name, fields in mapping.items() if not fields)
    assert not unmapped, f"no probe value moved a resource field: {unmapped}"
    assert mapping["LEGATO_CHECKPOINTS"] == [
        ("policy", "checkpoint_root"),
        ("checkpoints", "directory"),
    ]
    assert mapping["LEGATO_POLICY_LOAD_KEEP"] == [("policy", "load_keep")]
    assert defaults[("policy", "load_keep")] == "2"
    page = reference.environment_reference()
    assert "| `LEGATO_DESKTOPS` | `desktops.desktops` | `4` |" in page
    assert "| `LEGATO_LAKE` | `lake.root` | `'./lake'` |" in page  # not this host's path


def test_the_readme_is_short_and_reaches_every_docs_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    linked = set(re.findall(r"\]\((docs/[\w./-]+\.md)(?:#[\w-]+)?\)", text))
    pages = {
        str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").rglob("*.md") if p.is_file()
    }
    assert pages - linked == set(), "docs pages the README does not link"
    assert linked - pages == set(), "README links to missing docs pages"


def test_the_readme_keeps_its_two_commands_and_ci_runs_the_test_one():
    text = README.read_text()
    commands = re.findall(r"^scripts/setup\.sh && .*?(?=\s+#|$)", text, re.M)
    assert commands == ["scripts/setup.sh && legato demo", "scripts/setup.sh && python3 -m pytest"]
    assert "scripts/setup.sh && python3 -m pytest\n" in (REPO_ROOT / ".ci" / "run").read_text()
