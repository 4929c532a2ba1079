"""Typed results: stored records read back unchanged, older shapes upgraded in from_json, the culprit stored
once, exit codes from the result. Inputs: tests/golden/fixtures and the real records in tests/records."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bisector.errors import EXIT_ABORTED, EXIT_ENDPOINT, EXIT_FOUND, EXIT_INCONCLUSIVE, EXIT_INTERRUPTED
from bisector.record.backport_results import BackportResult
from bisector.record.results import RESULT_SCHEMA, BisectResult
from bisector.record.runs import RESULTS, StoredRun

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "golden" / "fixtures"
RECORDS = TESTS / "records"


def stored(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


CURRENT = sorted(path.stem for path in FIXTURES.glob("*.json")
                 if json.loads(path.read_text()).get("result", {}).get("schema") == RESULT_SCHEMA)


@pytest.mark.parametrize("name", CURRENT)
def test_a_current_record_reads_back_to_the_same_record_without_the_culprit_twice(name):
    row = stored(name)
    record = row["result"]
    result = RESULTS[row["kind"]].from_json(record)
    written = result.to_json()
    assert "first_bad" not in written and "first_good" not in written  # the culprit is stored once
    assert written == {key: value for key, value in record.items() if key not in ("first_bad", "first_good")}
    if isinstance(result, BisectResult):
        alias = "first_good" if result.find_fix else "first_bad"
        published = result.to_json(published=True)
        added = {alias, "counts", "level", "levels"}  # what --json adds to the stored record (levels: runs of theirs)
        # --json keeps the record's keys, in order
        assert [key for key in published if key not in added] == [key for key in record if key not in added]
        assert alias in published
        assert result.to_json(published=True)[alias] == record["culprit"]


def test_records_from_before_schema_2_are_upgraded_in_one_place():
    old = stored("bisect-before-schema-2")["result"]
    assert "schema" not in old and "range" not in old and "signature" not in old
    result = BisectResult.from_json(old)
    assert result.signature.mode == "any" and result.command_line == () and result.repo is None
    assert all(step.details == {} and step.cache_key == {} for step in result.steps)
    assert set(result.range) == {*result.good, *result.candidates, *(s.sha for s in result.steps), *result.bad}
    assert result.to_json()["schema"] == RESULT_SCHEMA
    backport = BackportResult.from_json(stored("backport-before-schema-2")["result"])
    assert backport.command_line == () and backport.cache_key is None and len(backport.branches) == 10


def test_ends_are_always_tuples_and_records_keep_one_sha_as_a_string():
    one = BisectResult.from_json(stored("bisect-culprit")["result"])
    several = BisectResult.from_json(stored("bisect-find-fix")["result"])
    assert len(one.good) == 1 and isinstance(one.to_json()["good"], str)
    assert len(several.bad) == 2 and several.to_json()["bad"] == list(several.bad)
    assert several.find_fix and several.culprit_label == "first good commit (the fix)"


@pytest.mark.parametrize("name, code", [("bisect-culprit", EXIT_FOUND), ("bisect-inconclusive", EXIT_INCONCLUSIVE),
                                        ("bisect-signature-auto", EXIT_INCONCLUSIVE),
                                        ("backport-scenario", EXIT_INCONCLUSIVE)])
def test_exit_code_follows_the_answer(name, code):
    row = stored(name)
    result = RESULTS[row["kind"]].from_json(row["result"])
    assert result.exit_code == code


@pytest.mark.parametrize("outcome, code", [("endpoint", EXIT_ENDPOINT), ("merge-base", EXIT_ENDPOINT),
                                           ("aborted", EXIT_ABORTED), ("interrupted", EXIT_INTERRUPTED)])
def test_a_stopped_run_keeps_its_outcome_and_reason_and_gives_its_exit_code(outcome, code):
    answered = BisectResult.from_json(stored("bisect-inconclusive")["result"])
    assert answered.outcome == "inconclusive" and "outcome" not in answered.to_json()  # as the goldens have it
    stopped = dataclasses.replace(answered, culprit=None, candidates=(), outcome=outcome, stopped="why it stopped")
    record = stopped.to_json()
    assert (record["outcome"], record["stopped"]) == (outcome, "why it stopped")
    assert BisectResult.from_json(record) == stopped and stopped.exit_code == code
    first = BisectResult.from_json(stored("bisect-culprit")["result"])
    assert first.outcome == "found"
    assert dataclasses.replace(first, levels=(stopped,)).exit_code == code  # the last level's
    with pytest.raises(ValueError, match="unknown outcome 'lost'"):
        dataclasses.replace(answered, outcome="lost")
    with pytest.raises(ValueError, match="a culprit"):
        dataclasses.replace(first, outcome="aborted")


def test_a_level_stopped_at_its_ends_before_outcomes_were_kept_reads_as_an_endpoint_outcome():
    record = {**stored("bisect-inconclusive")["result"], "candidates": [], "stopped": "not explained by AITER alone"}
    level = BisectResult.from_json(record)
    assert (level.outcome, level.exit_code) == ("endpoint", EXIT_ENDPOINT)
    assert level.stopped == "not explained by AITER alone"
    assert level.to_json()["outcome"] == "endpoint"


def test_a_backport_is_ok_only_when_every_branch_is_settled():
    result = BackportResult.from_json(stored("backport-scenario")["result"])
    unsettled = {entry.branch for entry in result.branches if not entry.settled}
    assert unsettled == {"rel/conflict", "rel/ineffective", "rel/untestable"} and not result.ok
    settled = BackportResult(run_id=1, fix="f", fix_ref="f", fix_subject="s", scenario=None, globs=("rel/*",),
                             branches=tuple(e for e in result.branches if e.settled), executions=0)
    assert settled.ok and settled.exit_code == EXIT_FOUND and settled.to_json()["ok"] is True


def test_a_stored_row_of_an_unknown_kind_has_no_typed_result():
    row = {"id": 3, "kind": "someday", "status": "finished", "params": "{}", "result": "{}"}
    run = StoredRun.from_row(row)
    assert run.record == {} and run.result is None


def test_the_recorded_h200_bisection_named_the_planted_commit():
    """The real H200 run (tests/records): its culprit is the commit the history planted the fault in, and
    the two ImportError commits were skipped."""
    run = BisectResult.from_json(json.loads((RECORDS / "h200-bisect.json").read_text()))
    history = json.loads((RECORDS / "h200-history.json").read_text())
    planted = next(commit["sha"] for commit in history if commit["role"] == "planted-fault")
    assert run.culprit.sha == planted
    assert [step.verdict for step in run.steps].count("skip") == 2  # the ImportError range
    final = BisectResult.from_json(json.loads((RECORDS / "h200-bisect-final.json").read_text()))
    assert final.culprit.sha == planted and final.signature.mode == "auto"
