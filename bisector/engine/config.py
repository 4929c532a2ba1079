"""What `bisector run` was asked: the settings one bisection runs with."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bisector.builds.base import BuildConfig
from bisector.builds.builder import NoBuild
from bisector.engine.executor import Executor
from bisector.machine.envs import EnvSettings
from bisector.process import DEFAULT_LOG_LIMIT
from bisector.record.results import PinLevel
from bisector.seams import DEFAULT_PYTHON, Scenario
from bisector.search.perf import PerfSettings
from bisector.world.world import WorldSettings


@dataclass(kw_only=True)
class RunConfig:
    """The settings of one bisection (the options of `bisector run`)."""

    repo: Path
    good: str | Sequence[str]  # several: git's many good revs (with --find-fix: several bad ones)
    bad: str | Sequence[str]
    scenario: Scenario
    first_parent: bool = False
    paths: Sequence[str] = ()
    find_fix: bool = False
    timeout: float | None = None
    state_dir: Path | None = None
    verify_endpoints: bool = True
    jobs: int = 1
    repeat: int = 1
    python: str = DEFAULT_PYTHON
    executor: Executor | None = None  # default: LocalExecutor on `jobs` CPU slots
    builder: BuildConfig = field(default_factory=NoBuild)
    fix: str | None = None             # seed the search with the commits the fix's lines blame to
    culprit: str | None = None         # --find-fix: seed with the commits that rewrote the culprit's lines
    flaky: bool = False                # probabilistic search over intermittent faults
    confidence: float = 0.95
    fault_rate: float | None = None    # --flaky: known fault probability (default: estimated)
    max_runs_per_commit: int = 20
    signature: str | None = None      # any | auto | a regex; default: the scenario's default_signature
    prefilter: Scenario | None = None  # a cheap scenario bisected first; this one confirms its culprit
    log_limit: int = DEFAULT_LOG_LIMIT  # bytes kept of each step's log (head and tail)
    no_cache: bool = False             # judge every commit again (still recording the verdicts)
    reuse_verdicts: bool = False       # serve a command's verdicts of earlier runs too (engine.driver.CacheUse)
    command_line: Sequence[str] = ()   # how the user asked for this run, stored and shown in reports
    envs: EnvSettings = field(default_factory=EnvSettings)  # --env shared | per-commit
    world: WorldSettings = field(default_factory=WorldSettings)  # --image, --aiter
    isolate: bool = False              # each slot a clone of its own (refs, stash, worktrees), not a linked worktree
    skip: Sequence[str] = ()           # --skip/--skip-file: revs and A..B ranges never tested (git bisect skip)
    follow_pins: bool = False          # when the answer moves a pin, go on bisecting inside the dependency
    level: PinLevel | None = None      # this run is such a level (bisector.engine.follow): how it came about
    perf: PerfSettings | None = None   # --metric: a performance hunt (bisector.search.perf, policies.PerfPolicy)
    chain: Sequence[str] = ()          # bisect these commits, oldest first, each standing on the one before
                                       # (release tags of histories that share no ancestor) instead of a range
