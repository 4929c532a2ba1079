"""What `bisector run` was asked: the settings one bisection runs with."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from bisector.engine.executor import Executor
from bisector.engine.settings import SharedConfig
from bisector.record.results import PinLevel
from bisector.seams import Scenario
from bisector.search.perf import PerfSettings


@dataclass(kw_only=True)
class RunConfig(SharedConfig):
    """The settings of one bisection (the options of `bisector run`; those backport shares: SharedConfig)."""

    good: str | Sequence[str]  # several: git's many good revs (with --find-fix: several bad ones)
    bad: str | Sequence[str]
    scenario: Scenario
    first_parent: bool = False
    paths: Sequence[str] = ()
    find_fix: bool = False
    verify_endpoints: bool = True
    jobs: int = 1
    executor: Executor | None = None  # default: LocalExecutor on `jobs` CPU slots
    fix: str | None = None             # seed the search with the commits the fix's lines blame to
    culprit: str | None = None         # --find-fix: seed with the commits that rewrote the culprit's lines
    flaky: bool = False                # probabilistic search over intermittent faults
    confidence: float = 0.95
    fault_rate: float | None = None    # --flaky: known fault probability (default: estimated)
    max_runs_per_commit: int = 20
    signature: str | None = None      # any | auto | a regex; default: the scenario's default_signature
    prefilter: Scenario | None = None  # a cheap scenario bisected first; this one confirms its culprit
    isolate: bool = False              # each slot a clone of its own (refs, stash, worktrees), not a linked worktree
    skip: Sequence[str] = ()           # --skip/--skip-file: revs and A..B ranges never tested (git bisect skip)
    level: PinLevel | None = None      # this run is such a level (bisector.engine.follow): how it came about
    perf: PerfSettings | None = None   # --metric: a performance hunt (bisector.search.perf, policies.PerfPolicy)
    chain: Sequence[str] = ()          # bisect these commits, oldest first, each standing on the one before
                                       # (release tags of histories that share no ancestor) instead of a range
