"""Every report format of every result kind, rendered in-process from stored records and compared with
golden files.

Inputs: tests/golden/fixtures/*.json (run rows as the store keeps them: id, kind, status, params, result;
made by real `bisector run`/`backport` runs on throwaway repositories, paths normalised, plus the oldest
record shapes) and the real H200 records in tests/records/. Expected outputs: tests/golden/expected/.

After an intended change of a report, regenerate the goldens and review the diff:

    BISECTOR_UPDATE_GOLDEN=1 python -m pytest tests/test_golden_reports.py
    git diff tests/golden/expected
"""
from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bisector.record.plan import Plan
from bisector.report import renderers as report
from bisector.report import tables

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "golden" / "fixtures"
EXPECTED = TESTS / "golden" / "expected"
RECORDS = ("h200-bisect", "h200-bisect-final")  # real results in tests/records (no run row around them)
EXTENSIONS = {"text": "txt", "json": "json", "markdown": "md", "junit": "xml", "html": "html"}
PULL_LINKS = "https://github.com/vllm-project/vllm/pull/{pr}"
UPDATE = bool(os.environ.get("BISECTOR_UPDATE_GOLDEN"))


def fixture_rows() -> dict[str, dict]:
    """name -> a run row as store.runs gives it (result and params as JSON text)."""
    rows = {}
    for path in sorted(FIXTURES.glob("*.json")):
        stored = json.loads(path.read_text())
        if "result" in stored:
            rows[path.stem] = {**stored, "params": json.dumps(stored["params"]),
                               "result": json.dumps(stored["result"])}
    for name in RECORDS:
        result = json.loads((TESTS / "records" / f"{name}.json").read_text())
        rows[name] = {"id": result["run_id"], "kind": "bisect", "status": "finished", "params": "{}",
                      "result": json.dumps(result)}
    return rows


ROWS = fixture_rows()


def check(name: str, text: str) -> None:
    """text equals the golden file `name` (written instead when BISECTOR_UPDATE_GOLDEN is set)."""
    golden = EXPECTED / name
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.exists(), f"no golden {golden}: run with BISECTOR_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{name} differs from its golden file (see this module's docstring)"


@pytest.mark.parametrize("fmt", report.FORMATS)
@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_format_of_every_record_matches_its_golden(name, fmt):
    check(f"{name}.{EXTENSIONS[fmt]}", report.render(ROWS[name], fmt))


def test_markdown_links_pull_requests_with_a_template():
    check("bisect-culprit.linked.md", report.render(ROWS["bisect-culprit"], "markdown", PULL_LINKS))


def test_runs_listing_matches_its_golden_whole_and_within_100_columns(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")  # the listing shows local times
    time.tzset()
    fixtures = [ROWS[name] for name in sorted(ROWS) if name not in RECORDS]
    try:
        check("runs.txt", tables.runs_table(fixtures) + "\n")
        check("runs.100.txt", tables.runs_table(fixtures, width=100) + "\n")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert max(map(len, tables.runs_table(fixtures, width=100).splitlines())) <= 100


def test_plan_matches_its_golden():
    check("plan.txt", tables.plan_text(Plan.from_json(json.loads((FIXTURES / "plan.json").read_text()))) + "\n")


def test_a_named_commit_reads_as_the_progress_line_has_it_in_every_format():
    """`testing 4e0f2cad79b2 (v1.0), endpoint`: in no format is a commit's name in parentheses followed by
    another parenthesis (JUnit's step names read `step 1: 4e0f2cad79b2 (v1.0) (endpoint)` on 5ba5601)."""
    row = ROWS["bisect-named"]
    result = json.loads(row["result"])
    doubled = re.compile(r"\((?:%s)\) \(" % "|".join(map(re.escape, result["names"].values())))
    rendered = {fmt: report.render(row, fmt) for fmt in report.FORMATS}
    rendered["runs"] = tables.runs_table([row])
    assert {fmt: doubled.findall(text) for fmt, text in rendered.items() if doubled.search(text)} == {}
    cases = [case.get("name") for case in ET.fromstring(rendered["junit"]).iter("testcase")]
    assert cases[1] == f"step 1: {result['good'][:12]} (v1.0), endpoint", cases
