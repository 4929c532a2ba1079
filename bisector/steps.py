"""What a run reports as it goes: one Step per judged commit, and the Handler that hears of each."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bisector.results import StepRecord
from bisector.seams import Verdict
from bisector.store import Execution


@dataclass(kw_only=True, frozen=True)
class Step:
    """A judged commit as the run sees it land (the policy observes it, the handler shows it): its decided
    execution, and how the run came by it."""

    role: str  # endpoint | seed | probe
    round: int
    execution: Execution  # the decided verdict (bisector.engine.judge.Judge.decide)
    cached: bool
    cache_key: dict = field(default_factory=dict)  # the parts of the verdict cache key it was judged under
    from_earlier_run: bool = False  # cached from a run before this one (not this run nor one it resumes)

    @property
    def sha(self) -> str:
        return self.execution.sha

    @property
    def verdict(self) -> Verdict:
        return self.execution.verdict

    @property
    def reason(self) -> str:
        return self.execution.reason

    @property
    def seconds(self) -> float:
        return self.execution.seconds

    @property
    def log_path(self) -> str | None:
        return self.execution.log_path

    @property
    def build(self) -> str | None:
        return self.execution.build

    @property
    def details(self) -> dict:
        """What a human reads of it."""
        return self.execution.details

    @property
    def cause(self) -> str | None:
        """Why it is no verdict about the commit (bisector.store.CAUSES): not cached."""
        return self.execution.cause

    def record(self) -> StepRecord:
        """The step as results keep it (seconds to the millisecond)."""
        run = self.execution
        return StepRecord(sha=run.sha, role=self.role, round=self.round, verdict=run.verdict, reason=run.reason,
                          cached=self.cached, seconds=round(run.seconds, 3), log=run.log_path, build=run.build,
                          details={**run.details, **({"cause": run.cause} if run.cause else {})},
                          cache_key=self.cache_key,
                          from_earlier_run=self.from_earlier_run, manual=run.manual)


class Handler:
    """Receives engine events; the CLI's progress display overrides what it shows."""

    def waiting(self, holder: str) -> None: ...
    def started(self, run_id: int, total: int, resumed_from: int | None, logs: Path) -> None: ...
    def calibrating(self, good: str, bad: str, runs: int, logs: Path) -> None: ...  # `scenario calibrate` begins
    def judging(self, sha: str, logs: Path) -> None: ...  # `scenario run` begins judging its one commit
    def named(self, names: Mapping[str, str]) -> None: ...  # sha -> the tag or branch that names it
    def testing(self, sha: str, role: str) -> None: ...
    def tested(self, step: Step, left: int, steps_left: int) -> None: ...
    def cancelled(self, sha: str) -> None: ...  # a running step whose answer no longer matters
    def level(self, text: str) -> None: ...  # --follow-pins: a level inside a dependency begins
