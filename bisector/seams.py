"""The plug-in seams: the data a scenario and the engine exchange, and what a scenario must offer.

The core owns these types; `scenarios.base` re-exports them for plug-ins, and this module imports no other
part of bisector. Implementations are found in registries (`bisector.registry.Registry`): scenarios in
`scenarios.BUILT_IN` (plus the `bisector.scenarios` entry-point group). The engine's own seams sit beside their
implementations: Executor in `bisector.engine.executor` (registry EXECUTORS), Build, BuildConfig and
BuildStrategy in `bisector.builds.base` (registry `bisector.builds.REGISTRY`), Environments in
`bisector.machine.envs`. Optional capabilities are Protocols checked with isinstance.
See ARCHITECTURE.md for how to add one of each.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import (
    Callable,
    ClassVar,
    Iterable,
    Mapping,
    Protocol,
    Sequence,
    runtime_checkable,
)

# The interpreter steps, builds and environments use unless the user names one (--python): the one running
# bisector, as the CLI passes it, so that a run set up in-process asks the same question as one from the CLI.
DEFAULT_PYTHON = sys.executable


class Verdict(str, Enum):
    """A commit's verdict; stored and shown as its value (`str(Verdict.BAD) == "bad"`)."""

    GOOD = "good"
    BAD = "bad"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Outcome:
    """What a scenario says of one run on one commit: what the engine decides on is typed; `details` is for
    people (shown_details: as reports and the record show them)."""

    verdict: Verdict
    reason: str
    log_path: str | None = None
    details: dict = field(default_factory=dict)
    # why a skip is no verdict about the commit, so never cached (bisector.record.store.CAUSES): "machine" (no GPU,
    # a torch of another flavour), "external-signal" (killed from outside); None: the commit's own outcome
    cause: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # measurements of this run (bisector.metrics)
    timed_out: bool = False  # a skip for the step's timeout: it counts only while the timeout is not larger
    phases: Mapping[str, float] | None = None  # seconds per part of the run, in order; None: one part "scenario"
    signature: str | None = None  # a failure's signature (bisector.signatures.failure_signature): --signature's
    masked: str | None = None  # a good run with the bug present but hidden: what hides it (a backport: "masked")

    def shown_details(self) -> dict:
        """The details as people read them: the signature and what masks the bug (when given) first, then the
        scenario's own."""
        return {**({"signature": self.signature} if self.signature else {}),
                **({"masked": self.masked} if self.masked else {}), **self.details}


@dataclass(frozen=True)
class StepContext:
    """Where and how one scenario execution happens."""

    checkout: Path
    log_path: Path
    timeout: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = DEFAULT_PYTHON
    cancel: threading.Event | None = None  # set when the step's result is no longer wanted
    container: ContainerLauncher | None = None  # --image: every process of the step runs through it
    held_tree: Path | None = None  # a level inside a dependency: the held commit's tree with its build (the world's)


@runtime_checkable
class ContainerLauncher(Protocol):
    """How a step's processes run inside the commit's image (`--image`; bisector.world.images.Container): a
    scenario that can run in images (`runs_in_images`) starts each process with the argv `command` gives."""

    python: str     # the image's interpreter
    network: str    # the containers' network (none: they cannot reach each other)

    def command(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str] | None = None,
                mounts: Iterable[Path | str] = ()) -> list[str]:
        """argv as run inside the image: cwd and mounts at their host paths, env passed in."""
        ...


@dataclass(kw_only=True, frozen=True)
class FollowUp:
    """What a scenario carries into the hunt that continues inside a pinned dependency the answer moves
    (its `follow_up` hook): the dependency's repository, the options kept, and the scenario that judges the
    dependency's commits with the first repository held at its answer (`run --follow-pins`).

    hold(repo, commit) returns that scenario: each step's checkout is then a commit of the dependency, and
    the scenario runs it against the held commit. None: this scenario cannot judge dependency commits (yet);
    `missing` says what it lacks, and the answer prints the continuation to run by hand.
    """

    repo: str | None = None  # None: the pin's repository, else upstream
    options: Mapping[str, str] = field(default_factory=dict)
    hold: Callable[[str, str], Scenario] | None = None
    missing: str = ""  # why hold is None, in words


@runtime_checkable
class Scenario(Protocol):
    """A reproduction: judges one checked-out (and built) commit good, bad or skip."""

    name: ClassVar[str]
    description: ClassVar[str]
    needs_build: ClassVar[bool]  # False: the checkout runs as it is (no build step)
    option_defaults: ClassVar[Mapping[str, str]]
    default_signature: ClassVar[str]  # --signature when not given: any | auto | a regex
    # False: what decides a verdict cannot be known (a command may read any file or variable), so its
    # verdicts are reused only by the run that recorded them (and its resumptions), or on request
    # (`--reuse-verdicts`, the environment then in the key); True: identity() names every input.
    inputs_known: ClassVar[bool]
    runs_in_images: ClassVar[bool]  # True: it starts its processes through ctx.container (--image)
    aiter_sensitive: ClassVar[bool]  # True: its verdict depends on AITER (--aiter defaults to installed)

    @property
    def gpus_per_run(self) -> int: ...

    def identity(self, python: str) -> dict:
        """What decides a verdict besides the commit (JSON-able): the verdict cache key's parts.

        BaseScenario gives: its source files' hash, its options and `environment(python)`.
        """
        ...

    def run(self, ctx: StepContext) -> Outcome:
        """Judge the commit checked out at ctx.checkout."""
        ...


# -- optional scenario capabilities (checked with isinstance) ---------------------------------------------

@runtime_checkable
class Configurable(Protocol):
    """A scenario configured by KEY=VALUE options (`--option`), defaults filled in."""

    options: Mapping[str, str]


@runtime_checkable
class TimesAlone(Protocol):
    """A scenario whose timed part can run alone on its GPUs while other steps share them (--gpus ID:N): its
    measurements wait until no other step on those GPUs starts an engine or measures, and its engine start until
    none measures (times_alone True for these options), so a performance hunt may overlap the steps' untimed
    parts."""

    @property
    def times_alone(self) -> bool: ...


@runtime_checkable
class RecordsVersions(Protocol):
    """A scenario naming the distributions whose versions each step records under `--env per-commit`
    (default: bisector.machine.envs.DEFAULT_VERSIONS)."""

    env_versions: Sequence[str]


@runtime_checkable
class ClassifiesLogs(Protocol):
    """A scenario that can judge a saved output of its child without running it (`scenario classify`)."""

    def classify_log(self, text: str, exit_code: int | None = None) -> Outcome: ...


@runtime_checkable
class FollowsPins(Protocol):
    """A scenario that says how a hunt continues inside a dependency whose pin the answer moves."""

    def follow_up(self, dependency: str) -> FollowUp | None: ...


@runtime_checkable
class ChecksMachine(Protocol):
    """A scenario that says, before anything is built or installed, why this machine can never run it
    for the step (no GPU, a torch of another flavour): the judge then skips the step with that reason."""

    def machine_check(self, ctx: StepContext) -> str | None:
        """Why the step cannot run here (ctx as the scenario's run would get it, before the build); None: it can."""
        ...


@runtime_checkable
class ImplicatesPaths(Protocol):
    """A scenario that names the files (globs, most telling first) whose change most likely moves its
    verdict: a culprit's report lists those of its files first."""

    def implicated_paths(self) -> tuple[str, ...]: ...


@runtime_checkable
class LearnsOptions(Protocol):
    """A scenario whose options `scenario calibrate` can set from the good end's step details."""

    def calibrated_options(self, good_details: list[dict]) -> dict[str, str]: ...
