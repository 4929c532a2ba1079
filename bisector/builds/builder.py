"""An opened build: the cheapest registered strategy (bisector.builds.REGISTRY) that can serve each commit,
over the artifact cache of one state dir; NoBuild when the tree runs as checked out."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import shlex
import shutil
import tarfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Mapping

import git

from bisector.builds.artifacts import ArtifactCache
from bisector.builds.base import (
    FREE_COST,
    UNAVAILABLE,
    BuildContext,
    BuildOptions,
    BuildResult,
    BuildStrategy,
    Decision,
    HeldBuild,
    Target,
    remove_outputs,
)
from bisector.builds.native import NATIVE_PATHS, detect_toolchain, native_hash
from bisector.builds.version import release_version
from bisector.machine.cachedir import EXCLUSIVE, SHARED, evict, lock_file, locked, take
from bisector.machine.envs import Environment
from bisector.repo.archives import extract

if TYPE_CHECKING:
    from bisector.repo.refs import GitRepo

# Worse than any compile: the commit cannot be built (it failed before, or the chosen strategy cannot serve).
KNOWN_FAILURE_COST = 2.0
FAILED_BEFORE = "failed-before"
# What a held commit's tree holds besides its build: what the held scenario reads of vLLM (its package, its pins).
HELD_PATHS = ("vllm", "docker/Dockerfile.rocm_base")


def installs_packages(argv: tuple[str, ...]) -> bool:
    """Whether a command installs packages (pip install, uv pip install), as a build's requirements step does."""
    names = [Path(part).name for part in argv]
    return "install" in names and any(name == "pip" or name.startswith("pip3") for name in names)


def tried(failure: BuildResult) -> str:
    """A strategy that did not serve, in words: a refusal as it reads (nothing ran, no log), or the
    failure with its cause and the log of the command that failed."""
    if failure.log_path is None:
        return failure.reason
    return f"{failure.strategy} failed: {failure.reason} (log {failure.log_path})"


class NoBuild:
    """The tree runs as checked out (the CPU probe, or a command that builds for itself)."""

    name = "none"

    def open(self, repo: GitRepo, state_dir: Path) -> "NoBuild":
        return self

    def cost(self, sha: str) -> float:
        return FREE_COST

    def decide(self, sha: str) -> Decision:
        return Decision("none", "no build", "")

    def prepare(self, worktree: Path, sha: str, log_dir: Path,
                environment: Environment | None = None) -> BuildResult:
        return BuildResult("none", True, "no build")

    def held_tree(self, sha: str, root: Path) -> HeldBuild:
        return HeldBuild(sha, None, None, "held build not found: the first level built nothing (--build none): "
                                          "the held commit's sources alone")


HELD_KEPT = 4  # held trees kept under <state dir>/held: the least recently used beyond it removed, one in use never


@contextlib.contextmanager
def holding(held: HeldBuild | None) -> Iterator[None]:
    """While a level runs on held's tree: a shared lock beside it, so pruning leaves it alone, and the held
    trees past HELD_KEPT, least recently used first, removed (those other levels hold are kept)."""
    if held is None or held.path is None:
        yield
        return
    tree = held.path
    with lock_file(tree.parent / f".{tree.name}.lock") as handle:
        take(handle, SHARED)
        os.utime(tree)  # used now
        _prune_held(tree.parent, HELD_KEPT)
        yield


def _prune_held(root: Path, kept: int) -> list[Path]:
    """Remove held trees under root beyond kept, least recently used first, skipping any a level holds; the
    removed. Their files are hard links into the artifact cache: removing a tree frees what the cache evicted."""
    trees = [path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")]

    def remove(tree: Path) -> bool:
        with locked(root / f".{tree.name}.lock", EXCLUSIVE, wait=False) as lock:
            if lock is None:  # a level runs on it
                return False
            shutil.rmtree(tree, ignore_errors=True)
            return True

    return evict(trees, kept, remove, used=lambda tree: tree.stat().st_mtime)


class Builder:
    """Prepares a worktree for one commit by the cheapest registered strategy the settings allow."""

    def __init__(self, settings: BuildOptions, repo: GitRepo, state_dir: Path,
                 registry: Mapping[str, type[BuildStrategy]]):
        if settings.strategy != "auto" and settings.strategy not in registry:
            raise ValueError(f"unknown build strategy {settings.strategy!r} "
                             f"(one of {', '.join(['auto', *registry, 'none'])})")
        self.settings, self.repo, self.state_dir = settings, repo, state_dir
        self.name = settings.strategy
        self.toolchain = detect_toolchain(settings.python, settings.rocm_arch)
        self.cache = ArtifactCache(state_dir, settings.cache_size)
        context = BuildContext(settings, self.toolchain, self.cache, state_dir)
        # every strategy is opened, so its options are checked whichever one was chosen
        self.strategies = {name: strategy(context) for name, strategy in registry.items()}
        chosen = self.strategies.values() if self.name == "auto" else [self.strategies[self.name]]
        self.candidates = sorted(chosen, key=lambda strategy: strategy.cost)
        self.trees: dict[str, dict[str, str]] = {}
        self.vllm_trees: dict[str, bool] = {}
        self.versions: dict[str, str] = {}
        self.hash_locks: dict[str, threading.Lock] = {}
        self.lock = threading.Lock()

    def native_trees(self, sha: str) -> dict[str, str]:
        with self.lock:
            if sha not in self.trees:
                self.trees[sha] = self.repo.tree_ids(sha, NATIVE_PATHS)
            return self.trees[sha]

    def recognised(self, sha: str) -> bool:
        """Whether sha's tree is one `auto` knows how to build: vLLM (setup.py and the vllm package)."""
        with self.lock:
            if sha not in self.vllm_trees:
                self.vllm_trees[sha] = bool(self.repo.tree_ids(sha, ["vllm"]))
            return self.vllm_trees[sha]

    def version(self, sha: str) -> str:
        """The version sha's build is told: from the nearest release tag, never a user's own tag."""
        with self.lock:
            if sha not in self.versions:
                self.versions[sha] = release_version(self._git_output, sha)
            return self.versions[sha]

    def _git_output(self, *args: str) -> str | None:
        try:
            return self.repo.git.execute(["git", *args])
        except git.GitCommandError:
            return None

    def native(self, sha: str) -> str:
        return native_hash(self.native_trees(sha), self.toolchain)

    def target(self, sha: str, worktree: Path | None = None, environment: Environment | None = None) -> Target:
        """What a strategy serves; environment is where the build runs, by default --python itself."""
        if environment is None:
            environment = Environment("")
        return Target(sha, self.native(sha), self.native_trees(sha),
                      worktree or self.state_dir / "worktrees" / "slot-N", environment.python or self.settings.python,
                      environment.installer, environment.env, self.version(sha))

    def cost(self, sha: str) -> float:
        """0 when no compile is needed (built before, or a wheel), 1 for a compile, 2 for a known failure."""
        decision = self.decide(sha)
        if decision.strategy in (FAILED_BEFORE, UNAVAILABLE):
            return KNOWN_FAILURE_COST
        return self.strategies[decision.strategy].cost if decision.strategy in self.strategies else FREE_COST

    def decide(self, sha: str, worktree: Path | None = None) -> Decision:
        """The build sha needs under the chosen strategy, with the commands it would run."""
        return next(self._decisions(self.target(sha, worktree)))

    def _decisions(self, target: Target) -> Iterator[Decision]:
        """The builds that could serve target, cheapest first; a refusal when none can."""
        if "setup.py" not in target.trees:
            yield Decision("none", "no setup.py at this commit", target.native)
            return
        if self.name == "auto" and not self.recognised(target.sha):
            yield Decision("none", "not a vLLM tree (no vllm/ package beside setup.py): --build auto "
                                   "builds only vLLM; name a strategy to build it anyway", target.native)
            return
        record = self.cache.get(target.native)
        if record and record.status == "failed":
            yield Decision(FAILED_BEFORE, f"native {target.short} failed to build before ({record.strategy})",
                           target.native)
            return
        refusals, served = [], False
        for strategy in self.candidates:
            decision = strategy.can_serve(target)
            if decision.serves:
                served = True
                yield decision
            else:
                refusals.append(decision.reason)
        if not served:
            yield target.refuse("; ".join(refusals) + ("" if self.name == "auto" else f" (--build {self.name})"))

    def prepare(self, worktree: Path, sha: str, log_dir: Path,
                environment: Environment | None = None) -> BuildResult:
        """Make worktree runnable for sha in environment: stale outputs out, then the cheapest strategy
        that serves it; when that fails, the next one (a wheel that fails to install: compile instead)."""
        target = self.target(sha, worktree, environment)
        with self.lock:
            hash_lock = self.hash_locks.setdefault(target.native, threading.Lock())
        with hash_lock:  # two slots never build the same native inputs at once
            failed: list[BuildResult] = []
            for decision in self._decisions(target):
                kept = self._in_users_python(decision, environment)
                if isinstance(kept, str):  # the user's own interpreter: not the tool's to change unless allowed
                    failed.append(BuildResult(decision.strategy, False, kept))
                    continue
                decision = kept
                remove_outputs(worktree)  # a previous step's, or the failed strategy's
                result = self._prepare(target, decision, log_dir)
                if result.ok or decision.strategy not in self.strategies:
                    return dataclasses.replace(result, reason=result.reason + "".join(
                        f" (after {tried(f)})" for f in failed)) if failed else result
                failed.append(result)
            if len(failed) == 1:
                return failed[0]
            ran = next((f for f in failed if f.log_path), failed[-1])  # the log the step names
            return BuildResult(self.name, False, "; ".join(tried(f) for f in failed), ran.log_path)

    def held_tree(self, sha: str, root: Path) -> HeldBuild:
        """sha held while a level bisects a dependency: its tree (HELD_PATHS) exported under root with the build
        the first level's steps reused restored beside it (by native hash, as `reuse` restores it), made once per
        commit and native hash; or why there is none (nothing stored, a failed build, no setup.py)."""
        target = self.target(sha)
        if "setup.py" not in target.trees:
            return HeldBuild(sha, None, None, "held build not found: no setup.py at the held commit (nothing to "
                                              "build): its sources alone")
        record = self.cache.get(target.native)
        if record is None or record.status != "ok":
            why = (f"it failed to build before ({record.strategy})" if record else
                   "never stored here: not built, built by a strategy that keeps no artifacts, or evicted past "
                   "--cache-size")
            return HeldBuild(sha, None, None, f"held build not found: native {target.short} of {sha[:12]} {why}: "
                                              f"its sources alone")
        dest = root / f"{sha}-{target.native[:16]}"
        if not dest.is_dir():
            partial = root / f".{dest.name}.{os.getpid()}.{threading.get_ident()}"
            try:
                self._export_held(sha, target.native, partial)
            except (git.GitCommandError, OSError, tarfile.TarError) as exc:
                shutil.rmtree(partial, ignore_errors=True)
                return HeldBuild(sha, None, None, f"held build not restored: native {target.short} of {sha[:12]}: "
                                                  f"{exc}: its sources alone")
            try:
                partial.rename(dest)
            except OSError:  # another level made it first: keep theirs
                shutil.rmtree(partial, ignore_errors=True)
        return HeldBuild(sha, dest, target.native, f"native {target.short} built before ({record.strategy}), "
                                                   f"{len(record.files)} files reused")

    def _export_held(self, sha: str, native: str, partial: Path) -> None:
        """sha's HELD_PATHS exported into partial (made here), the stored build of native restored over them."""
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        present = list(self.repo.tree_ids(sha, HELD_PATHS))
        if present:
            archive = self.repo.git.archive("--format=tar", sha, "--", *present, stdout_as_string=False)
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                extract(tar, partial)
        self.cache.restore(native, partial, link=True)

    def _in_users_python(self, decision: Decision, environment: Environment | None) -> Decision | str:
        """decision as it may run in environment. In --python itself (the shared environment, none of the
        tool's own) without --allow-install-into-python nothing is installed there: a package install is
        refused (why, as a string). No build links the worktree there (BUILD_IN_PLACE)."""
        if self.settings.install_into_python or (environment is not None and environment.path is not None):
            return decision
        installs = [command for command in decision.commands if installs_packages(command.argv)]
        if installs:
            return (f"{decision.strategy} build refused: `{shlex.join(installs[0].argv)}` would install into "
                    f"--python {self.settings.python} (--env shared); --env per-commit builds in the tool's own "
                    f"environments, --allow-install-into-python allows it")
        return decision

    def _prepare(self, target: Target, decision: Decision, log_dir: Path) -> BuildResult:
        if decision.strategy == "none":
            return BuildResult("none", True, decision.reason)
        if decision.strategy == FAILED_BEFORE:
            record = self.cache.get(target.native)
            assert record is not None, "failed-before is decided from the cache's record"
            return BuildResult(record.strategy, False, decision.reason, record.log_path)
        if decision.strategy == UNAVAILABLE:
            return BuildResult(self.name, False, decision.reason)
        return self.strategies[decision.strategy].prepare(target, decision, log_dir)
