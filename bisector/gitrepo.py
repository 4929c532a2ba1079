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
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? ")
PORCELAIN_HEADER = re.compile(r"^([0-9a-f]{40}) \d+ \d+")


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


@dataclass(frozen=True)
class BlamedCommit:
    """A commit that wrote lines a fix changes (changed) or sits beside (context)."""

    sha: str
    changed: int
    context: int

    @property
    def score(self) -> int:
        """Changed lines count twice: they are what the fix had to correct."""
        return 2 * self.changed + self.context

    def as_dict(self) -> dict:
        return {"sha": self.sha, "changed_lines": self.changed, "context_lines": self.context}


def blame_fix(repo: GitRepo, fix: str, context: int = 3) -> list[BlamedCommit]:
    """SZZ: blame, in the fix's first parent, the lines the fix changes and `context` lines around.

    Whitespace-only changes and moved or copied lines are looked through (-w -M -C); blank lines are
    not counted. Best-scored first.
    """
    commit = repo.repo.commit(fix)
    if not commit.parents:
        raise GitError(f"fix {fix[:12]} has no parent to blame")
    parent = commit.parents[0].hexsha
    diff = repo.git.diff("-U0", "-w", "--no-renames", "--no-color", "--no-ext-diff", parent, fix)
    counts: dict[str, list[int]] = {}
    for path, hunks in _old_hunks(diff).items():
        length = len(repo.git.show(f"{parent}:{path}").splitlines())
        changed, spans = set(), []
        for start, count in hunks:
            changed.update(range(start, start + count))
            low, high = (start - context, start + count - 1 + context) if count else \
                (start - context + 1, start + context)
            low, high = max(1, low), min(length, high)
            if low <= high:
                spans += ["-L", f"{low},{high}"]
        if not spans:
            continue
        out = repo.git.blame("--porcelain", "-w", "-M", "-C", *spans, parent, "--", path)
        sha, line_no = None, 0
        for line in out.splitlines():
            header = PORCELAIN_HEADER.match(line)
            if header:
                sha, line_no = header.group(1), int(line.split()[2])
            elif line.startswith("\t") and sha and line[1:].strip():
                tally = counts.setdefault(sha, [0, 0])
                tally[0 if line_no in changed else 1] += 1
    blamed = [BlamedCommit(sha, changed_lines, context_lines)
              for sha, (changed_lines, context_lines) in counts.items()]
    return sorted(blamed, key=lambda b: (-b.score, b.sha))


def _old_hunks(diff: str) -> dict[str, list[tuple[int, int]]]:
    """Per pre-existing file, the (start, count) old-side hunks of a -U0 diff (count 0: insertion after start)."""
    hunks: dict[str, list[tuple[int, int]]] = {}
    path = None
    for line in diff.splitlines():
        if line.startswith("--- "):
            path = line[6:].rstrip("\t") if line.startswith("--- a/") else None
        elif path and (match := HUNK.match(line)):
            count = 1 if match.group(2) is None else int(match.group(2))
            hunks.setdefault(path, []).append((int(match.group(1)), count))
    return hunks


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
