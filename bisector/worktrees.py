"""Tool-owned worktrees steps run in: the local pool, and a Ray node's checkout from its own clone."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import threading
from pathlib import Path
from typing import Iterator

import git

from bisector.errors import GitError
from bisector.refs import GitRepo


def untracked_files(worktree: Path, pattern: str) -> list[str]:
    """Untracked files (ignored ones included) matching pattern, relative to the worktree."""
    out = git.Git(str(worktree)).ls_files("--others", "--", pattern)
    return [line for line in out.splitlines() if line]


def clean_ignored(worktree: Path) -> None:
    """Delete the ignored files (build dirs, extension modules) from a worktree."""
    git.Git(str(worktree)).clean("-ffdqX")


class WorktreePool:
    """Detached worktrees owned by the tool under state_dir/worktrees, reused between steps.

    Use as a context manager: every worktree is removed and pruned on exit, Ctrl-C included.
    """

    def __init__(self, repo: GitRepo, state_dir: Path):
        self.repo = repo
        self.base = Path(state_dir) / "worktrees"
        self.free: list[Path] = []
        self.all: list[Path] = []
        self.lock = threading.Lock()

    def __enter__(self) -> "WorktreePool":
        self.base.mkdir(parents=True, exist_ok=True)
        self._prune()
        for stale in sorted(self.base.iterdir()):
            shutil.rmtree(stale, ignore_errors=True)
        self._prune()
        return self

    def __exit__(self, *exc) -> None:
        for path in self.all:
            try:
                self.repo.git.worktree("remove", "--force", str(path))
            except git.GitCommandError:
                shutil.rmtree(path, ignore_errors=True)
        self._prune()

    def _prune(self) -> None:
        self.repo.git.worktree("prune")

    def acquire(self, sha: str) -> Path:
        """A worktree with sha checked out, clean apart from ignored files (build outputs)."""
        with self.lock:
            path = self.free.pop() if self.free else None
            if path is None:
                path = self.base / f"slot-{len(self.all)}"
                self.repo.git.worktree("add", "--detach", "--force", "--quiet", str(path), sha)
                self.all.append(path)
                return path
        worktree = git.Git(str(path))
        worktree.checkout("--detach", "--force", "--quiet", sha)
        worktree.clean("-ffdq")
        return path

    def release(self, path: Path) -> None:
        with self.lock:
            self.free.append(path)

    def checkout(self, sha: str) -> "_Lease":
        """`with pool.checkout(sha) as path:` leases a worktree for one step."""
        return _Lease(self, sha)


class _Lease:
    def __init__(self, pool: WorktreePool, sha: str):
        self.pool, self.sha, self.path = pool, sha, None

    def __enter__(self) -> Path:
        self.path = self.pool.acquire(self.sha)
        return self.path

    def __exit__(self, *exc) -> None:
        self.pool.release(self.path)


class NodeCheckout:
    """A worktree of sha at `path`, from this node's clone of source (a URL or a path all nodes see).

    Steps on one node share one clone under cache_root, cloned once and fetched when sha is new; a
    file lock serializes cloning, fetching and adding or removing worktrees. `with` it: on exit the
    worktree is removed.
    """

    def __init__(self, source: str, cache_root: Path, sha: str, path: Path):
        self.source, self.sha, self.path = source, sha, Path(path)
        self.cache_root = Path(cache_root)
        self.clone_path = self.cache_root / hashlib.sha256(source.encode()).hexdigest()[:16]
        self.repo: GitRepo | None = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the node lock; released even when a cancel interrupts right after it is taken."""
        self.cache_root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.cache_root / f"{self.clone_path.name}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def __enter__(self) -> "NodeCheckout":
        with self._locked():
            try:
                if not (self.clone_path / ".git").exists():
                    git.Repo.clone_from(self.source, self.clone_path, no_checkout=True, multi_options=["--quiet"])
                clone = git.Repo(self.clone_path)
                if not _has_commit(clone, self.sha):
                    clone.git.fetch("--quiet", "--force", "--tags", "origin",
                                    "+refs/heads/*:refs/remotes/origin/*")
                if not _has_commit(clone, self.sha):
                    clone.git.fetch("--quiet", "origin", self.sha)
                clone.git.worktree("add", "--detach", "--force", "--quiet", str(self.path), self.sha)
            except git.GitCommandError as exc:
                detail = (exc.stderr or "").strip().splitlines() or [str(exc)]
                raise GitError(f"cannot get {self.sha[:12]} from {self.source}: {detail[-1].strip()}") from None
        self.repo = GitRepo(self.clone_path)
        return self

    def __exit__(self, *exc) -> None:
        with self._locked():
            try:
                self.repo.git.worktree("remove", "--force", str(self.path))
            except git.GitCommandError:
                shutil.rmtree(self.path, ignore_errors=True)
            self.repo.git.worktree("prune")


def _has_commit(repo: git.Repo, sha: str) -> bool:
    try:
        repo.git.cat_file("-e", f"{sha}^{{commit}}")
        return True
    except git.GitCommandError:
        return False
