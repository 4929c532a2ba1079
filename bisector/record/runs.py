"""A recorded run as the store's row gives it: what it was asked (`RunParams`), where it stands, and its typed
result by kind (`RESULTS`)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Mapping

from bisector.record.backport_results import BackportResult
from bisector.record.results import BisectResult, _shas

Result = BisectResult | BackportResult
RESULTS: dict[str, type[BisectResult] | type[BackportResult]] = {"bisect": BisectResult, "backport": BackportResult}


@dataclass(kw_only=True, frozen=True)
class RunParams:
    """What a recorded run was asked (the parts `bisector runs` lists)."""

    repo: str | None = None
    good: tuple[str, ...] = ()
    bad: tuple[str, ...] = ()
    fix: str | None = None        # backport
    globs: tuple[str, ...] = ()   # backport
    scenario: str | None = None
    command_line: tuple[str, ...] = ()
    parent_run: int | None = None  # --follow-pins: a level inside a dependency, under this run
    level: int | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> RunParams:
        return cls(repo=data.get("repo"), good=_shas(data.get("good")), bad=_shas(data.get("bad")),
                   fix=data.get("fix"), globs=tuple(data.get("globs", ())), scenario=data.get("scenario"),
                   command_line=tuple(data.get("command_line") or ()), parent_run=data.get("parent_run"),
                   level=data.get("level"))


@dataclass(kw_only=True, frozen=True)
class StoredRun:
    """A recorded run, read from its row in the store: what it was asked, where it stands, its result."""

    id: int
    kind: str    # bisect | backport
    status: str  # running | finished | failed | interrupted
    params: RunParams
    record: dict | None  # the result as stored; None until the run finishes
    started: float | None = None  # when the run started and ended (seconds since the epoch); None: not known
    ended: float | None = None

    @classmethod
    def from_row(cls, row: Mapping) -> StoredRun:
        return cls(id=row["id"], kind=row["kind"], status=row["status"],
                   params=RunParams.from_json(json.loads(row["params"])),
                   record=json.loads(row["result"]) if row["result"] else None,
                   started=row["created"] if "created" in row.keys() else None,
                   ended=row["finished"] if "finished" in row.keys() else None)

    @cached_property
    def result(self) -> Result | None:
        """The typed result (None: the run has none yet, or it is of a kind this version does not know)."""
        if self.record is None or self.kind not in RESULTS:
            return None
        return RESULTS[self.kind].from_json(self.record)
