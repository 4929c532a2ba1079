"""How a step's worktree becomes runnable: build strategies behind one Protocol, found in a registry.

A commit's native-input hash (tree ids of the paths that decide the compiled extensions, plus the
toolchain) keys an artifact cache under <state_dir>/artifacts/<hash>/; `--build auto` takes per step the
cheapest registered strategy that can serve the commit: reuse those artifacts, else a precompiled wheel,
else vLLM's ROCm source build. A new strategy is one module (see base.BuildStrategy) and one entry below,
with the command-line options it reads from BuildSettings. Settings are opened (builder.Builder) per run.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bisector.errors import UsageError
from bisector.registry import Option, Registry
from bisector.seams import DEFAULT_PYTHON

if TYPE_CHECKING:
    from bisector.builds.base import Build, BuildStrategy
    from bisector.repo.refs import GitRepo

# The registered strategies by --build name; in a tie of cost `auto` takes the one registered first.
REGISTRY: Registry[type[BuildStrategy]] = Registry("build strategy")
REGISTRY.register("reuse", "bisector.builds.reuse:ReuseArtifacts", aliases=("python",))
REGISTRY.register("precompiled", "bisector.builds.precompiled:Precompiled", options=[
    Option("--wheels", metavar="DIR|URL-TEMPLATE",
           help="Per-commit wheels for precompiled builds: a directory, or a URL with {commit}.")])
REGISTRY.register("source", "bisector.builds.source:SourceBuild", options=[
    Option("--rocm-arch", help="PYTORCH_ROCM_ARCH for source builds. Default: the GPUs', else gfx942."),
    Option("--allow-install-into-python", is_flag=True,
           help="Let a build install the commit's build requirements (pip install -r) into --python itself "
                "under --env shared; without it such a build is refused (--env per-commit installs into the "
                "tool's own environments).")])
STRATEGIES = ("auto", *REGISTRY, "none")
DEFAULT_CACHE_SIZE = "50G"  # --cache-size: the cap on stored compiled artifacts


MOST_SIZE = 1024 ** 5  # 1024T: a larger size is a typo (and 1e400 bytes would overflow)


def parse_size(text: str) -> int:
    """'50G', '512M', '10k' or plain bytes -> bytes, at most MOST_SIZE."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not match:
        raise ValueError(f"not a size: {text!r} (e.g. 50G, 512M)")
    size = float(match.group(1)) * 1024 ** " kmgt".index(match.group(2) or " ")
    if size > MOST_SIZE:
        raise ValueError(f"{text.strip()[:40]!r} is more than 1024T")
    return int(size)


MOST_JOBS = 1024  # a larger MAX_JOBS is a typo


def max_jobs_from_env() -> int:
    """How many compile jobs a source build runs at once: $MAX_JOBS (1 to MOST_JOBS), else the CPU count;
    UsageError in one line for anything else."""
    given = os.environ.get("MAX_JOBS", "").strip()
    if not given:
        return os.cpu_count() or 1
    if not given.isdecimal() or not 1 <= int(given) <= MOST_JOBS:
        raise UsageError(f"MAX_JOBS={given[:40]!r}: a whole number of parallel compile jobs from 1 to {MOST_JOBS}")
    return int(given)


@dataclass(frozen=True)
class BuildSettings:
    """What the user asked for; `open` binds it to a repository and state dir for one run."""

    strategy: str = "auto"  # auto | none | a registered strategy (an alias is taken as its strategy)
    python: str = DEFAULT_PYTHON
    rocm_arch: str | None = None
    wheels: str | None = None
    cache_size: int = parse_size(DEFAULT_CACHE_SIZE)
    max_jobs: int = dataclasses.field(default_factory=max_jobs_from_env)
    install_into_python: bool = False  # --allow-install-into-python: pip may write into --python (--env shared)

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", REGISTRY.canonical(self.strategy))

    @classmethod
    def from_options(cls, build: str | None, python: str, rocm_arch: str | None, wheels: str | None,
                     cache_size: str, command: tuple[str, ...] = ()) -> BuildSettings:
        """The build options (`--build`, `--cache-size`, ...) checked: UsageError in one line. Without --build
        a -- CMD run builds nothing, as `git bisect run` does."""
        try:
            size = parse_size(cache_size)
        except ValueError as exc:
            raise UsageError(f"--cache-size: {exc}") from None
        return cls(build or ("none" if command else "auto"), python, rocm_arch, wheels, size)

    @property
    def name(self) -> str:
        return self.strategy

    def allowing_install(self, allowed: bool) -> BuildSettings:
        """These settings with --allow-install-into-python given (allowed) or not."""
        return dataclasses.replace(self, install_into_python=allowed)

    def open(self, repo: GitRepo, state_dir: Path) -> Build:
        """The build of this run; ValueError when the strategy is unknown or its options are bad."""
        from bisector.builds.builder import Builder, NoBuild
        if self.strategy == "none":
            return NoBuild()
        return Builder(self, repo, Path(state_dir), REGISTRY)
