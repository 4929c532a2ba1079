"""What a run reports as it goes: one Step per judged commit, and the Handler that hears of each."""
from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Sequence

from bisector.record.results import StepRecord
from bisector.record.store import Execution
from bisector.seams import Verdict


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
        """Why it is no verdict about the commit (bisector.record.store.CAUSES): not cached."""
        return self.execution.cause

    def record(self) -> StepRecord:
        """The step as results keep it (seconds to the millisecond)."""
        run = self.execution
        return StepRecord(sha=run.sha, role=self.role, round=self.round, verdict=run.verdict, reason=run.reason,
                          cached=self.cached, seconds=round(run.seconds, 3), log=run.log_path, build=run.build,
                          details={**run.details, **({"cause": run.cause} if run.cause else {})},
                          cache_key=self.cache_key,
                          from_earlier_run=self.from_earlier_run, manual=run.manual)


PHASES = "phases"  # the details key: seconds per part of a run, in order, summing to its seconds (docs/run.md)


class PhaseClock:
    """Where a step's seconds go: named parts timed in order (`part`), and the step's executions stamped with
    them (`stamp`), what no part covers named "other"."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.parts: dict[str, float] = {}  # before the scenario's runs
        self.after: dict[str, float] = {}  # after them

    @contextlib.contextmanager
    def part(self, name: str, after_runs: bool = False) -> Iterator[None]:
        """Time the block as the part name (added to it when timed again), listed before the scenario's runs
        or after them."""
        parts = self.after if after_runs else self.parts
        start = time.monotonic()
        try:
            yield
        finally:
            parts[name] = parts.get(name, 0.0) + time.monotonic() - start

    def split(self, name: str, inside: Mapping[str, float]) -> None:
        """The part name told in the parts timed inside it, listed in its place; what they leave stays name."""
        if not inside:
            return
        whole = self.parts.pop(name, 0.0)
        self.parts.update({**inside, name: max(whole - sum(inside.values()), 0.0)})

    def stamp(self, fresh: Sequence[Execution]) -> list[Execution]:
        """fresh, the step's runs in order, with the step's own time on its first: that run's seconds become
        all the step took but the later runs' seconds, and its phases this clock's parts around its own."""
        if not fresh:
            return []
        later = sum(run.seconds for run in fresh[1:])
        first = fresh[0]
        seconds = max(time.monotonic() - self.started - later, first.seconds)
        own = {name: value for name, value in first.details.get(PHASES, {}).items() if name != "other"}
        parts = {**self.parts, **own, **self.after}
        return [with_phases(first, parts, seconds), *fresh[1:]]


def with_phases(run: Execution, parts: Mapping[str, float], seconds: float | None = None) -> Execution:
    """run with seconds (default its own) and details' phases: parts to the millisecond, the rest "other"."""
    seconds = run.seconds if seconds is None else seconds
    rounded = {name: round(value, 3) for name, value in parts.items() if name != "other"}
    rounded["other"] = round(max(seconds - sum(rounded.values()), 0.0), 3)
    return dataclasses.replace(run, seconds=seconds, details={**run.details, PHASES: rounded})


def before_phases(run: Execution, name: str, seconds: float) -> Execution:
    """run with a part timed before all it holds (the executor's worktree), added to its seconds."""
    parts = {name: seconds, **run.details.get(PHASES, {})}
    return with_phases(run, parts, run.seconds + seconds)


def summed_phases(runs: Sequence[Execution]) -> dict[str, float]:
    """The phases of runs added part by part (a repeated good verdict's, whose seconds are the runs' sum)."""
    total: dict[str, float] = {}
    for run in runs:
        for name, seconds in run.details.get(PHASES, {}).items():
            total[name] = round(total.get(name, 0.0) + seconds, 3)
    if "other" in total:
        total["other"] = total.pop("other")
    return total


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
