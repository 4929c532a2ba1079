"""The plug-in seams: what a scenario and an executor must offer the engine.

Implementations are found in registries (scenarios: `scenarios.available()`, which also loads the
`bisector.scenarios` entry-point group; executors: `bisector.executor.EXECUTORS`). The third seam,
BuildStrategy, sits with its data types in `bisector.builds.base` (registry: `bisector.builds.REGISTRY`).
See ARCHITECTURE.md for how to add one of each.
"""
from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Mapping, Protocol, runtime_checkable

if TYPE_CHECKING:
    from bisector.worktrees import WorktreePool
    from scenarios.base import Outcome, StepContext


@runtime_checkable
class Scenario(Protocol):
    """A reproduction: judges one checked-out (and built) commit good, bad or skip."""

    name: ClassVar[str]
    description: ClassVar[str]
    needs_build: ClassVar[bool]  # False: the checkout runs as it is (no build step)
    option_defaults: ClassVar[Mapping[str, str]]
    default_signature: ClassVar[str]  # --signature when not given: any | auto | a regex

    @property
    def gpus_per_run(self) -> int: ...

    def identity(self, python: str) -> dict:
        """What decides a verdict besides the commit (JSON-able): the verdict cache key's parts.

        BaseScenario gives: its source files' hash, its options and `environment(python)`.
        """

    def run(self, ctx: "StepContext") -> "Outcome":
        """Judge the commit checked out at ctx.checkout."""


@runtime_checkable
class Executor(Protocol):
    """Where steps run: `size` steps at once, each a Future of the step's new executions."""

    size: int

    def start(self, pool: "WorktreePool", logs: Path) -> None:
        """Bind to this run's worktree pool and log dir (before the first step)."""

    def run_step(self, judge, sha: str, done: list) -> Future:
        """Judge sha (given its earlier executions `done`) until its verdict is decided."""

    def cancel(self, future: Future) -> None:
        """Drop a queued step, or kill a running step's processes."""

    def shutdown(self) -> None:
        """Cancel what still runs and release the workers."""
