"""A run's state on disk: the state dir (where it may go, that it is writable), the lock that serializes runs,
and the state opened for a run (worktree pool, record store, the build settings opened on its caches)."""
from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Callable, Iterator

import git

from bisector.errors import UsageError
from bisector.machine.cachedir import claim
from bisector.process import DEFAULT_LOG_LIMIT, GROUPS, kill_recorded_groups
from bisector.record.store import Store
from bisector.repo.refs import GitRepo
from bisector.repo.worktrees import WorktreePool


def default_state_dir(repo: GitRepo) -> Path:
    return repo.common_dir / "bisector"


STATE_MARKER = "bisector-state"  # marks a dir the tool made (or took over) as its state dir
GIT_OWNED = ("worktrees", "refs", "objects", "hooks", "info", "logs", "modules", "lfs")


def choose_state_dir(repo: GitRepo, given: Path | str | None) -> Path:
    """The state dir: `given` made absolute against the cwd (once), else the default.

    Refuses (UsageError) a path where the tool's files would mix with the user's: git's own
    directories, or a work tree of the repository (this one or another linked worktree) outside git's
    directory unless git ignores the path there.
    """
    path = Path(os.path.abspath(given)) if given else default_state_dir(repo)
    real = path.resolve()
    common, git_dir = repo.common_dir, Path(repo.repo.git_dir).resolve()
    inside_git = _within(real, common) or _within(real, git_dir)
    if real in (common, git_dir) or (_within(real, common) and real.relative_to(common).parts[0] in GIT_OWNED):
        raise UsageError(f"state dir {path} is git's own directory; give another --state-dir "
                         f"(default: {default_state_dir(repo)})")
    for work_tree in _work_trees(repo):
        if _within(real, work_tree) and not inside_git and not _ignored(git.Git(str(work_tree)), real):
            raise UsageError(f"state dir {path} is inside the work tree of {work_tree}; give a path outside it "
                             f"(or one git ignores)")
    return path


def _within(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _work_trees(repo: GitRepo) -> list[Path]:
    """Every work tree of the repository (this one and its linked worktrees), resolved."""
    listed = repo.git.worktree("list", "--porcelain").splitlines()
    trees = {Path(line.removeprefix("worktree ")).resolve() for line in listed if line.startswith("worktree ")}
    return sorted(trees | {repo.root.resolve()})


def _ignored(work_tree_git: git.Git, path: Path) -> bool:
    try:
        work_tree_git.check_ignore("-q", "--no-index", str(path) + "/")
        return True
    except git.GitCommandError:
        return False


def _is_default_state_dir(path: Path) -> bool:
    """Whether path is `bisector` right inside a git directory (the default, made by earlier versions)."""
    parent = path.parent
    return path.name == "bisector" and (parent / "HEAD").is_file() and (parent / "objects").is_dir()


def _claim(path: Path) -> None:
    """Mark path as this tool's state dir, or raise UsageError when it holds files the tool did not make.

    Ours: a new or empty dir, one carrying the marker, one holding an earlier version's bisector.sqlite,
    or the default `<git dir>/bisector` (both then get the marker).
    """
    claim(path, STATE_MARKER, "state dir",
          taken_over=lambda path: (path / "bisector.sqlite").is_file() or _is_default_state_dir(path))


def prepare_state_dir(path: Path) -> Path:
    """Create (or take over) the state dir, marked as the tool's, and prove it writable; or raise UsageError
    (a dir holding files the tool did not make is refused: the tool deletes and rewrites files in it)."""
    try:
        _claim(path)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"state dir not writable: {path} ({exc.strerror})") from None
    return path


class RepoLock:
    """Serializes runs on one repository (a lock in its common git dir) and on one state dir: a second
    run waits for the first."""

    def __init__(self, repo: GitRepo, state_dir: Path, on_wait: Callable[[str], None] = lambda holder: None):
        self.paths = [repo.common_dir / "bisector.lock", state_dir / "lock"]
        self.on_wait = on_wait
        self.handles: list = []

    def __enter__(self) -> "RepoLock":
        try:
            for path in self.paths:
                self.handles.append(self._take(path))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _take(self, path: Path):
        try:
            fh = open(path, "a+")
        except OSError as exc:
            raise UsageError(f"cannot create the run lock {path} ({exc.strerror})") from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            self.on_wait(fh.read().strip() or "another process")
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        return fh

    def __exit__(self, *exc) -> None:
        while self.handles:
            fh = self.handles.pop()
            fh.truncate(0)
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()


@contextlib.contextmanager
def open_state(repo: GitRepo, given: Path | str | None, on_wait: Callable[[str], None] = lambda holder: None,
               log_limit: int = DEFAULT_LOG_LIMIT, isolate: bool = False) -> Iterator[tuple[Path, WorktreePool, Store]]:
    """The run's state: locks taken, process groups a killed run left killed, worktree pool (slots that are
    clones of their own with isolate), store.

    Yields (state dir, pool, store); on the way out every step process still running is killed.
    """
    state_dir = prepare_state_dir(choose_state_dir(repo, given))
    with RepoLock(repo, state_dir, on_wait):
        running = state_dir / "running"
        kill_recorded_groups(running)
        with GROUPS.recording(running, log_limit), WorktreePool(repo, state_dir, isolate) as pool:
            store = Store(state_dir / "bisector.sqlite")
            try:
                yield state_dir, pool, store
            finally:
                GROUPS.stop()
                store.close()


def open_builder(cfg, repo: GitRepo, state_dir: Path):
    """cfg.builder (build settings) opened on this repository and state dir's artifact cache."""
    try:
        return cfg.builder.open(repo, state_dir)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

