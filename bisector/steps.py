"""What a run reports as it goes: one Step per judged commit, and the Handler that hears of each."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bisector.results import StepRecord
from bisector.seams import Verdict


@dataclass(kw_only=True, frozen=True)
class Step:
    """A judged commit as the run sees it land (the policy observes it, the handler shows it)."""

    sha: str
    role: str  # endpoint | seed | probe
    round: int
    verdict: Verdict
    reason: str
    cached: bool
    seconds: float
    log_path: str | None
    build: str | None
    details: dict = field(default_factory=dict)
    cache_key: dict = field(default_factory=dict)  # the parts of the verdict cache key it was judged under
    from_earlier_run: bool = False  # cached from a run before this one (not this run nor one it resumes)
    cause: str | None = None  # why it is no verdict about the commit (bisector.store.CAUSES): not cached

    def record(self) -> StepRecord:
        """The step as results keep it (seconds to the millisecond)."""
        return StepRecord(sha=self.sha, role=self.role, round=self.round, verdict=self.verdict, reason=self.reason,
                          cached=self.cached, seconds=round(self.seconds, 3), log=self.log_path, build=self.build,
                          details={**self.details, **({"cause": self.cause} if self.cause else {})},
                          cache_key=self.cache_key,
                          from_earlier_run=self.from_earlier_run)


class Handler:
    """Receives engine events; the CLI's progress display overrides what it shows."""

    def waiting(self, holder: str) -> None: ...
    def started(self, run_id: int, total: int, resumed_from: int | None, logs: Path) -> None: ...
    def testing(self, sha: str, role: str) -> None: ...
    def tested(self, step: Step, left: int, steps_left: int) -> None: ...
    def level(self, text: str) -> None: ...  # --follow-pins: a level inside a dependency begins
