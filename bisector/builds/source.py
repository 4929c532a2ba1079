"""`--build source`: vLLM's documented ROCm build, through the compiler cache vLLM's setup.py picks."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Mapping

from bisector.builds.base import (
    BUILD_IN_PLACE,
    COMPILE_COST,
    BuildContext,
    BuildResult,
    Command,
    Decision,
    Target,
    keep_outputs,
    run_commands,
)
from bisector.builds.native import Toolchain
from bisector.repo.worktrees import clean_ignored

# ROCm build requirements: requirements/build/rocm.txt from 0.20, requirements/rocm-build.txt before.
BUILD_REQUIREMENTS = ("requirements/build/rocm.txt", "requirements/rocm-build.txt")


class SourceBuild:
    name = "source"
    cost = COMPILE_COST

    def __init__(self, context: BuildContext):
        self.settings, self.toolchain, self.cache = context.settings, context.toolchain, context.cache
        self.compiler_cache = context.state_dir / "compiler-cache"

    def can_serve(self, target: Target) -> Decision:
        requirements = next((path for path in BUILD_REQUIREMENTS if path in target.trees), None)
        why = "--build source" if self.settings.strategy == self.name else \
            f"native {target.short} not built" + (", no wheel" if self.settings.wheels else "")
        return Decision(self.name, why, target.native,
                        tuple(source_plan(target.python, requirements, self.toolchain, self.settings.max_jobs,
                                          {**compiler_cache_env(compiler_launcher(), self.compiler_cache,
                                                                target.worktree), **target.version_env},
                                          target.install)))

    def prepare(self, target: Target, decision: Decision, log_dir: Path) -> BuildResult:
        clean_ignored(target.worktree)  # an earlier commit's build dir may hold stale objects and modules
        built = run_commands(target, decision, log_dir)
        if not built.ok:
            self.cache.fail(target.native, self.name, built.log_path)  # remembered: never compiled again
            return built
        return keep_outputs(self.cache, target, built)


def compiler_launcher() -> str | None:
    """The launcher vLLM's setup.py itself picks: sccache if on PATH, else ccache."""
    return next((name for name in ("sccache", "ccache") if shutil.which(name)), None)


def compiler_cache_env(launcher: str | None, cache_dir: Path, worktree: Path) -> dict:
    """Where the launcher keeps its cache; ccache also rebases paths so worktrees share hits."""
    if launcher == "sccache":
        return {"SCCACHE_DIR": str(cache_dir / "sccache")}
    if launcher == "ccache":
        return {"CCACHE_DIR": str(cache_dir / "ccache"), "CCACHE_BASEDIR": str(worktree)}
    return {}


def source_plan(python: str, requirements: str | None, toolchain: Toolchain, max_jobs: int,
                develop_env: Mapping[str, str], install: tuple[str, ...] = ()) -> list[Command]:
    """vLLM's documented ROCm build in python's environment: install the commit's build requirements
    (with `install`, default `python -m pip install`), then build in place (BUILD_IN_PLACE, what `setup.py
    develop` does to the tree, nothing linked into the environment) with develop_env besides the arch
    and jobs (the compiler cache's variables, Target.version_env: never given to the requirement installs,
    whose own sdists would take the version too)."""
    env = {"PYTORCH_ROCM_ARCH": toolchain.arch, "MAX_JOBS": str(max_jobs), **develop_env}
    commands = []
    if requirements:
        install = install or (python, "-m", "pip", "install")
        commands.append(Command("build-requirements", (*install, "-r", requirements), {}))
    commands.append(Command("develop", (python, *BUILD_IN_PLACE), env))
    return commands
