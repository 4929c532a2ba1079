"""The build-strategy seam: what a strategy is asked (a Target), what it answers (a Decision), what it
returns after preparing a worktree (a BuildResult), and the pieces strategies share."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, runtime_checkable

from bisector.builds.version import pretend_env
from bisector.process import run_process
from bisector.repo.worktrees import untracked_files
from bisector.seams import DEFAULT_PYTHON

if TYPE_CHECKING:
    from bisector.builds.artifacts import ArtifactCache
    from bisector.builds.native import Toolchain
    from bisector.machine.envs import Environment
    from bisector.repo.refs import GitRepo

# A strategy that only copies files costs nothing; one that compiles costs a compile.
FREE_COST, COMPILE_COST = 0.0, 1.0
UNAVAILABLE = "unavailable"
# How a build makes the worktree runnable: what `setup.py develop` does to the tree (metadata, extensions in
# place), never its link into the environment (an egg-link, easy-install.pth or PEP 660 install, which would
# replace a user's own editable vLLM with a slot that is removed after the step); steps import the worktree
# through PYTHONPATH (Target.env).
BUILD_IN_PLACE = ("setup.py", "egg_info", "build_ext", "--inplace")


@dataclass(frozen=True)
class Command:
    label: str
    argv: tuple[str, ...]
    env: dict


@dataclass(frozen=True)
class Decision:
    """What a step's build would do, decided from git objects and the cache alone."""

    strategy: str  # a registered strategy's name, or none | failed-before | unavailable
    reason: str
    native: str
    commands: tuple[Command, ...] = ()

    @property
    def serves(self) -> bool:
        return self.strategy != UNAVAILABLE


@dataclass(frozen=True)
class BuildResult:
    strategy: str
    ok: bool
    reason: str
    log_path: str | None = None
    env: dict = field(default_factory=dict)

    @property
    def summary(self) -> str:
        """What ran and why, as stored per step: 'python: native 1a2b3c4d5e6f built before'."""
        return f"{self.strategy}: {self.reason}"


@dataclass(frozen=True)
class HeldBuild:
    """A commit held while a level bisects a dependency (run --follow-pins), as the first level's build left it:
    its tree (the vllm/ package and docker/Dockerfile.rocm_base) with the stored build restored beside it, or
    why there is none (path None: the held commit runs from its sources alone)."""

    commit: str
    path: Path | None  # the held tree with its build, made once under <state dir>/held/
    native: str | None  # the native hash of the build restored (part of the level's verdict cache key)
    said: str  # in words: the build restored, or why none was found

    @property
    def details(self) -> dict:
        """What a level step's details say of it (`"held_build"`)."""
        return {"commit": self.commit, "found": self.path is not None, "native": self.native, "said": self.said}


@dataclass(frozen=True)
class Target:
    """The commit a strategy is asked to serve, and the worktree it would build in."""

    sha: str
    native: str  # native-input hash (bisector.builds.native.native_hash)
    trees: Mapping[str, str]  # native input path -> tree id, for the paths present at sha
    worktree: Path  # a placeholder when only planning
    python: str = DEFAULT_PYTHON  # the interpreter of the environment the build runs in
    installer: tuple[str, ...] = ()  # installs requirement files there; () = `python -m pip install`
    variables: Mapping[str, str] = field(default_factory=dict)  # select that environment (PATH, VIRTUAL_ENV)
    version: str = ""  # what the tree's build is told its version is (bisector.builds.version); "": ask git

    @property
    def install(self) -> tuple[str, ...]:
        return self.installer or (self.python, "-m", "pip", "install")

    @property
    def short(self) -> str:
        return self.native[:12]

    @property
    def env(self) -> dict:
        """The scenario's environment once built: the worktree's package importable."""
        return {"PYTHONPATH": os.pathsep.join(filter(None, [str(self.worktree), os.environ.get("PYTHONPATH")]))}

    @property
    def version_env(self) -> dict[str, str]:
        """The variables of a command that builds the tree itself: its version, never a user's tag."""
        return pretend_env(self.version)

    def refuse(self, reason: str) -> Decision:
        """A strategy's answer when it cannot serve this commit."""
        return Decision(UNAVAILABLE, reason, self.native)


class BuildOptions(Protocol):
    """The build settings a strategy reads: bisector.builds.BuildSettings, named here by what it offers so that
    the strategies need not know the package that registers them."""

    @property
    def strategy(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def rocm_arch(self) -> str | None: ...
    @property
    def wheels(self) -> str | None: ...
    @property
    def cache_size(self) -> int: ...
    @property
    def max_jobs(self) -> int: ...
    @property
    def install_into_python(self) -> bool: ...


@dataclass(frozen=True)
class BuildContext:
    """What every strategy of one opened build shares."""

    settings: BuildOptions
    toolchain: "Toolchain"
    cache: "ArtifactCache"
    state_dir: Path


class BuildStrategy(Protocol):
    """One way to make a worktree runnable. `--build auto` takes, per commit, the cheapest registered
    strategy that can serve it (ties: the one registered first), and falls through to the next one
    that can serve when preparing fails. Constructed once per opened build: Strategy(context)."""

    name: str  # its --build choice and the label stored per step
    cost: float  # FREE_COST when it copies files, COMPILE_COST when it compiles

    def __init__(self, context: BuildContext) -> None: ...

    def can_serve(self, target: Target) -> Decision:
        """The build this strategy would run for target, or target.refuse(why) when it cannot."""

    def prepare(self, target: Target, decision: Decision, log_dir: Path) -> BuildResult:
        """Make target.worktree runnable as decided (stale extension modules are already removed)."""


def run_commands(target: Target, decision: Decision, log_dir: Path) -> BuildResult:
    """Run the decision's commands in the worktree, one log each; fails at the first non-zero exit."""
    log_path = None
    for n, command in enumerate(decision.commands, 1):
        log_path = Path(log_dir) / f"build-{target.sha[:12]}-{decision.native[:12]}-{n}-{command.label}.log"
        result = run_process(list(command.argv), target.worktree, log_path, env={**target.variables, **command.env})
        if result.returncode != 0:
            cause = last_line(result.output)
            return BuildResult(decision.strategy, False, f"{command.label} exited {result.returncode} "
                               f"({decision.reason})" + (f": {cause}" if cause else ""), str(log_path))
    return BuildResult(decision.strategy, True, decision.reason, str(log_path), target.env)


def last_line(output: str, kept: int = 300) -> str:
    """A failed command's cause in one line: the last line it wrote (a traceback's exception, pip's
    ERROR), cut to kept characters."""
    return next((line.strip()[:kept] for line in reversed(output.splitlines()) if line.strip()), "")


def keep_outputs(cache: "ArtifactCache", target: Target, built: BuildResult) -> BuildResult:
    """Store a successful build's extension modules under its native hash for later reuse."""
    files = built_outputs(target.worktree)
    cache.save(target.native, target.worktree, files, built.strategy, built.log_path)
    return BuildResult(built.strategy, True, f"{built.reason}, {len(files)} files stored", built.log_path,
                       built.env)


def built_outputs(worktree: Path) -> list[str]:
    """Every file the build added to the tree (extension modules, generated and vendored Python), outside
    the build/ scratch dir (kept for incremental builds), caches and egg-info."""
    return [rel for rel in untracked_files(worktree, "*") if _is_output(rel)]


def _is_output(rel: str) -> bool:
    """Outputs: extension modules and the Python a build or wheel adds (vllm/_version.py, vendored
    packages such as vllm/third_party/flashmla); not the build's scratch dir, caches or metadata."""
    return not rel.startswith("build/") and "__pycache__/" not in rel and ".egg-info/" not in rel \
        and not rel.endswith(".pyc")


def remove_outputs(worktree: Path) -> None:
    """Delete what a previous step's build left (ignored files survive `git clean`)."""
    for rel in built_outputs(worktree):
        (worktree / rel).unlink()


@runtime_checkable
class Build(Protocol):
    """A build opened on a repository and state dir: prepares a worktree for one commit."""

    name: str

    def cost(self, sha: str) -> float: ...

    def decide(self, sha: str) -> Decision: ...

    def prepare(self, worktree: Path, sha: str, log_dir: Path,
                environment: Environment | None = None) -> BuildResult: ...


@runtime_checkable
class BuildConfig(Protocol):
    """Build settings (`--build` and its options): pickled into Ray tasks, opened where steps run."""

    @property
    def name(self) -> str: ...

    def open(self, repo: GitRepo, state_dir: Path) -> Build: ...
