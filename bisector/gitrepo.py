"""Everything git: refs, ranges, commit facts and the pool of worktrees steps run in.

GitPython with argument lists only: no ref, branch or message ever passes through a shell.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
import threading
from typing import Sequence

import git

PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")


class GitError(Exception):
    """A git problem the user caused or must fix: the message is one line for them."""


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    subject: str
    author: str
    date: str
    pr: int | None
    files: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"sha": self.sha, "subject": self.subject, "author": self.author, "date": self.date,
                "pr": self.pr, "files": list(self.files)}


class GitRepo:
    """A user's repository, opened read-only as far as their HEAD, index, tree and refs go."""

    def __init__(self, path: str | Path):
        try:
            self.repo = git.Repo(Path(path), search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError):
            raise GitError(f"not a git repository: {path}") from None
        if self.repo.bare:
            raise GitError(f"bare repositories are not supported: {path}")
        self.git = self.repo.git
        self.root = Path(self.repo.working_tree_dir)
        self.common_dir = Path(self.repo.common_dir).resolve()

    def resolve(self, ref: str) -> str:
        """Full sha of the commit ref names."""
        if not ref or ref.startswith("-"):
            raise GitError(f"unknown ref: {ref!r}")
        try:
            return self.git.rev_parse("--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
        except git.GitCommandError:
            raise GitError(f"unknown ref: {ref}") from None

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        try:
            self.git.merge_base("--is-ancestor", ancestor, descendant)
            return True
        except git.GitCommandError as exc:
            if exc.status == 1:
                return False
            raise

    def range_commits(self, olds: Sequence[str], new: str, first_parent: bool = False,
                      paths: Sequence[str] = ()) -> list[tuple[str, tuple[str, ...]]]:
        """(sha, parents) of commits reachable from new but not from any old, parents first.

        With paths only commits touching them are listed (parents rewritten, as git bisect does),
        and new is always last, standing on the heads of what was listed.
        """
        args = ["--parents", "--topo-order", "--reverse"]
        if first_parent:
            args.append("--first-parent")
        args += [new, *(f"^{old}" for old in olds)]
        if paths:
            args += ["--", *paths]
        out = self.git.rev_list(*args)
        commits = []
        for line in out.splitlines():
            sha, *parents = line.split()
            commits.append((sha, tuple(parents[:1] if first_parent else parents)))
        if commits and commits[-1][0] != new:
            listed = {sha for sha, _ in commits}
            referenced = {p for _, parents in commits for p in parents}
            heads = tuple(sha for sha, _ in commits if sha not in referenced and sha in listed)
            commits.append((new, heads))
        return commits

    def commit_info(self, sha: str) -> CommitInfo:
        commit = self.repo.commit(sha)
        subject = commit.summary if isinstance(commit.summary, str) else commit.summary.decode()
        match = PR_SUFFIX.search(subject)
        if commit.parents:
            files = self.git.diff("--name-only", "--no-renames", commit.parents[0].hexsha, sha)
        else:
            files = self.git.ls_tree("-r", "--name-only", sha)
        return CommitInfo(sha=sha, subject=subject, author=f"{commit.author.name} <{commit.author.email}>",
                          date=commit.authored_datetime.isoformat(),
                          pr=int(match.group(1)) if match else None,
                          files=tuple(f for f in files.splitlines() if f))

    def short(self, sha: str) -> str:
        return sha[:12]

    def tree_ids(self, sha: str, paths: Sequence[str]) -> dict[str, str]:
        """Object ids of those paths (files or folders) present at sha, read from git objects alone."""
        if not paths:
            return {}
        out = self.git.ls_tree("--full-tree", sha, "--", *paths)
        ids = {}
        for line in out.splitlines():
            meta, _, name = line.partition("\t")
            ids[name] = meta.split()[2]
        return ids


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
