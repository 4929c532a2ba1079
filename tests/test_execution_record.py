"""What the engine decides on is typed on the execution record, and stored in its own columns: files of an
older schema are migrated by reading each row's details once (tests/records/store-v3.sqlite was written by
the bisector of schema version 3)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bisector.builds.builder import NoBuild
from bisector.engine.judge import JudgeSpec, signature_of
from bisector.record.store import SCHEMA_VERSION, Execution, Store
from bisector.seams import Verdict
from bisector.signatures import SignatureRule
from scenarios.command import CommandScenario

pytestmark = pytest.mark.unit

VERSION_3 = Path(__file__).resolve().parent / "records" / "store-v3.sqlite"


def judge(timeout: float | None = None, signature: str = "any") -> JudgeSpec:
    return JudgeSpec(CommandScenario(["true"]), NoBuild(), timeout, "python3", 1, SignatureRule.parse(signature))


def test_a_version_3_file_gets_typed_columns_from_its_details_and_keeps_the_details(tmp_path):
    path = tmp_path / "bisector.sqlite"
    shutil.copy(VERSION_3, path)
    with Store(path) as store:
        assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        [faulted] = store.executions("a" * 40, "command/abc")
        [timed_out] = store.executions("b" * 40, "command/abc")
        [imaged] = store.executions("c" * 40, "command/img")
        [plain] = store.executions("d" * 40, "command/abc")
    assert faulted.signature == "GPU memory access fault" and faulted.details == {"signature": faulted.signature}
    assert timed_out.timed_out_after == 10.0 and timed_out.details == {"timed_out_after": 10.0}
    assert imaged.image_digest == "sha256:feed" and imaged.details["image"]["proof"] == "holds c"
    assert (plain.signature, plain.timed_out_after, plain.image_digest) == (None, None, None)
    # the judge decides on the migrated columns
    assert signature_of(faulted) == "GPU memory access fault"
    assert judge(timeout=20.0).decide([timed_out]) is None and judge(timeout=10.0).decide([timed_out]) == timed_out


def test_the_engine_reads_typed_fields_not_details(tmp_path):
    """details are for humans: a signature or a timeout written only there decides nothing."""
    told = Execution("a" * 40, Verdict.BAD, "exit 1", None, 1.0, None, {"signature": "ImportError"})
    assert signature_of(told) == "exit N"
    assert judge(signature="ImportError").decide([told]).verdict == Verdict.SKIP
    typed = Execution("a" * 40, Verdict.BAD, "exit 1", None, 1.0, None, {}, signature="ImportError")
    assert judge(signature="ImportError").decide([typed]) == typed
    with Store(tmp_path / "bisector.sqlite") as store:
        timed_out = Execution("b" * 40, Verdict.SKIP, "timed out after 5s", None, 5.0, None, {},
                              timed_out_after=5.0, image_digest="sha256:beef")
        store.add_execution("k", timed_out)
        [stored] = store.executions("b" * 40, "k")
    assert (stored.timed_out_after, stored.image_digest, stored.details) == (5.0, "sha256:beef", {})
    assert judge(timeout=10.0).decide([stored]) is None
