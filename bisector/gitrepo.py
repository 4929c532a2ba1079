"""Everything git: refs, ranges, commit facts and the pool of worktrees steps run in.

GitPython with argument lists only: no ref, branch or message ever passes through a shell.
"""
from __future__ import annotations

import contextlib
import fcntl
import fnmatch
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
import threading
from typing import Iterator, Sequence

import git

PR_SUFFIX = re.compile(r"\(#(\d+)\)\s*$")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
PORCELAIN_HEADER = re.compile(r"^([0-9a-f]{40}) \d+ \d+")
CHERRY_PICKED_FROM = re.compile(r"\(cherry picked from commit ([0-9a-f]{7,40})\)")
NULL_SHA = "0" * 40
# Settings a cherry-pick in a tool-owned worktree runs with: no replayed resolutions, no signing
# prompt, no user hooks -- the pick is the same on every machine.
PICK_CONFIG = {"rerere.enabled": "false", "commit.gpgsign": "false", "core.hooksPath": os.devnull}


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


@dataclass(frozen=True)
class Hunk:
    """One hunk of a commit's diff: its header and its body lines with their ' ', '-', '+' prefixes."""

    path: str
    header: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class PickResult:
    status: str  # clean | conflict | empty
    sha: str | None  # the picked commit when clean
    conflicts: tuple[dict, ...] = ()  # {"file", "kind", "hunks"} per conflicted path


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

    # -- backport: branches, equivalence, cherry-pick --------------------------------------------
    def branches(self, pattern: str) -> list[tuple[str, str]]:
        """(name, tip sha) of local and remote-tracking branches whose short name matches the glob.

        Local branches are named as themselves (releases/v0.19), remote-tracking ones with their
        remote (origin/releases/v0.19); symbolic refs such as origin/HEAD are left out.
        """
        out = self.git.for_each_ref("--format=%(refname)%00%(objectname)%00%(symref)",
                                    "refs/heads", "refs/remotes")
        found = []
        for line in out.splitlines():
            ref, sha, symref = line.split("\0")
            if symref:
                continue
            name = ref.removeprefix("refs/heads/").removeprefix("refs/remotes/")
            if fnmatch.fnmatchcase(name, pattern):
                found.append((name, sha))
        return found

    def parents(self, sha: str) -> list[str]:
        return self.git.rev_list("--parents", "-n", "1", sha).split()[1:]

    def merge_base(self, a: str, b: str) -> str | None:
        try:
            return self.git.merge_base(a, b)
        except git.GitCommandError as exc:
            if exc.status == 1:
                return None
            raise

    def _patch_ids(self, *log_args: str) -> dict[str, str]:
        """sha -> `git patch-id --stable` of the commits `git log` lists for log_args."""
        with tempfile.TemporaryFile() as diff:
            self.git.log("-p", "--no-color", "--no-ext-diff", "--no-renames", "--full-diff",
                         "--no-merges", "--format=commit %H", *log_args, output_stream=diff)
            diff.seek(0)
            out = self.git.patch_id("--stable", istream=diff)
        return {sha: pid for pid, sha in (line.split() for line in out.splitlines())}

    def patch_id(self, sha: str) -> str | None:
        """`git patch-id --stable` of one commit; None for a commit without a patch (empty, merge)."""
        return self._patch_ids("--no-walk", sha).get(sha)

    def picked_from(self, sha: str) -> list[str]:
        """Commits that sha's message names in `(cherry picked from commit ...)` trailers."""
        return CHERRY_PICKED_FROM.findall(self.git.log("-1", "--format=%B", sha))

    def find_equivalent(self, fix: str, tip: str) -> tuple[str, str] | None:
        """A commit on tip since its merge-base with fix that carries fix under another sha.

        Returns (sha, how): how is "cherry-picked" when its message has a `(cherry picked from
        commit X)` trailer naming fix (or the commit fix itself was picked from), "patch-id" when
        its `git patch-id --stable` equals fix's. None when tip has no such commit.
        """
        base = self.merge_base(fix, tip)
        since = [tip] + ([f"^{base}"] if base else [])
        names = [fix, *self.picked_from(fix)]
        out = self.git.log("--format=%H%x00%B%x1e", "--fixed-strings",
                           "--grep=(cherry picked from commit ", *since)
        for record in out.split("\x1e"):
            sha, _, body = record.strip().partition("\0")
            if any(name.startswith(quoted) for quoted in CHERRY_PICKED_FROM.findall(body)
                   for name in names):
                return sha, "cherry-picked"
        wanted = self.patch_id(fix)
        files = self.commit_info(fix).files
        if wanted is None or not files:
            return None
        for sha, pid in self._patch_ids(*since, "--", *files).items():
            if pid == wanted:
                return sha, "patch-id"
        return None

    def diff_hunks(self, sha: str) -> list[Hunk]:
        """The hunks of sha's change against its first parent (whole files for a root commit)."""
        out = self.git.diff_tree("-p", "--no-color", "--no-ext-diff", "--no-renames", "--root",
                                 "--no-commit-id", "-U3", sha)
        hunks: list[Hunk] = []
        path, header, body = None, None, []
        for line in out.splitlines():
            if line.startswith("diff --git "):
                path = None
            elif line.startswith("--- "):
                path = line[6:] if line != "--- /dev/null" else None
            elif line.startswith("+++ ") and path is None:
                path = line[6:] if line != "+++ /dev/null" else None
            elif line.startswith("@@"):
                if header is not None:
                    hunks.append(Hunk(hunk_path, header, tuple(body)))
                header, body, hunk_path = line, [], path
            elif header is not None and line[:1] in (" ", "-", "+"):
                body.append(line)
        if header is not None:
            hunks.append(Hunk(hunk_path, header, tuple(body)))
        return hunks

    def file_text(self, sha: str, path: str) -> str | None:
        """Content of path at sha, or None when the file is not there."""
        try:
            return self.git.cat_file("blob", f"{sha}:{path}", strip_newline_in_stdout=False)
        except git.GitCommandError:
            return None

    def _pick_env(self, tip: str, fix: str) -> dict[str, str]:
        """Environment for a reproducible pick: the later committer date of tip and fix, an identity
        when the user has none, and PICK_CONFIG."""
        stamps = [self.git.log("-1", "--format=%ct %cd", "--date=raw", sha).split(" ", 1)
                  for sha in (tip, fix)]
        env = {"GIT_COMMITTER_DATE": max(stamps, key=lambda s: int(s[0]))[1],
               "GIT_CONFIG_COUNT": str(len(PICK_CONFIG))}
        for i, (key, value) in enumerate(PICK_CONFIG.items()):
            env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
        for key, variable, default in (("user.name", "GIT_COMMITTER_NAME", "bisector"),
                                       ("user.email", "GIT_COMMITTER_EMAIL", "bisector@localhost")):
            if not os.environ.get(variable) and not self._config(key):
                env[variable] = default
        return env

    def origin_url(self) -> str | None:
        return self._config("remote.origin.url")

    def _config(self, key: str) -> str | None:
        try:
            return self.git.config("--get", key)
        except git.GitCommandError:
            return None

    def cherry_pick(self, worktree: Path, fix: str) -> PickResult:
        """`git cherry-pick -x fix` onto the detached HEAD of a tool-owned worktree.

        A conflicted or empty pick is aborted before returning, so the worktree is back at its tip.
        The pick's committer date is fixed (see _pick_env): the same tip and fix give the same sha.
        """
        wt = git.Git(str(worktree))
        tip = wt.rev_parse("HEAD")
        try:
            wt.cherry_pick("-x", fix, env=self._pick_env(tip, fix))
            return PickResult("clean", wt.rev_parse("HEAD"))
        except git.GitCommandError as exc:
            conflicts = self._conflicts(wt, fix)
            if conflicts:
                return PickResult("conflict", None, tuple(conflicts))
            if not wt.diff("--cached", "--name-only", "HEAD"):
                return PickResult("empty", None)
            raise GitError(f"cherry-pick of {fix[:12]} onto {tip[:12]} failed: "
                           f"{exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else exc}") \
                from None
        finally:
            try:
                wt.rev_parse("--verify", "--quiet", "CHERRY_PICK_HEAD")
                wt.cherry_pick("--abort")
            except git.GitCommandError:
                pass  # no pick in progress
            if wt.rev_parse("HEAD") == tip:
                wt.reset("--hard", "--quiet", tip)

    def _conflicts(self, wt: git.Git, fix: str) -> list[dict]:
        """Conflicted paths of an unfinished pick with what conflicts in each: the combined diff's
        hunk headers, or the fix's own hunks for a file one side deleted."""
        stages: dict[str, set[str]] = {}
        for line in wt.ls_files("-u", "-z").split("\0"):
            if line:
                meta, _, path = line.partition("\t")
                stages.setdefault(path, set()).add(meta.split()[2])
        fix_hunks = None
        conflicts = []
        for path, present in sorted(stages.items()):
            kind = {frozenset("123"): "both modified", frozenset("13"): "deleted in branch",
                    frozenset("12"): "deleted by fix", frozenset("23"): "added in both"
                    }.get(frozenset(present), "conflict")
            if kind == "both modified" or kind == "added in both":
                hunks = [line for line in wt.diff("--no-color", "--no-ext-diff", "--", path).splitlines()
                         if line.startswith("@@@")]
            else:
                fix_hunks = fix_hunks if fix_hunks is not None else self.diff_hunks(fix)
                hunks = [h.header for h in fix_hunks if h.path == path]
            conflicts.append({"file": path, "kind": kind, "hunks": hunks})
        return conflicts

    def create_branch(self, name: str, sha: str) -> bool:
        """Create refs/heads/name at sha; False (and nothing changed) when it already exists."""
        try:
            self.git.check_ref_format("--branch", name)
        except git.GitCommandError:
            raise GitError(f"invalid branch name: {name}") from None
        try:
            self.git.update_ref("-m", "bisector backport", f"refs/heads/{name}", sha, NULL_SHA)
            return True
        except git.GitCommandError:
            return False


@dataclass(frozen=True)
class BlamedCommit:
    """A commit found by blame: for lines a seed changes (changed) or for lines beside them (context)."""

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
    parent = _first_parent(repo, fix, "fix")
    counts: dict[str, list[int]] = {}
    for path, (changed, spans) in _blame_spans(repo, parent, fix, "old", context).items():
        out = repo.git.blame("--porcelain", "-w", "-M", "-C", *spans, parent, "--", path)
        for sha, line_no, _ in _porcelain_lines(out):
            _tally(counts, sha, line_no in changed)
    return _ranked(counts)


def blame_reverse(repo: GitRepo, culprit: str, good: str, context: int = 3) -> list[BlamedCommit]:
    """Reverse SZZ: the commits in culprit..good that rewrote or removed the lines the culprit wrote
    (changed) or the `context` lines around them.

    `git blame --reverse -w` names, per line, the last commit where it still stood and the commit that
    then changed it; a removed file's lines go to the last commit's children on the way to good.
    Lines that reach good unchanged and blank lines are not counted. Best-scored first.
    """
    if not repo.is_ancestor(culprit, good):
        raise GitError(f"culprit {culprit[:12]} is not an ancestor of good {good[:12]}")
    parent = _first_parent(repo, culprit, "culprit")
    counts: dict[str, list[int]] = {}
    children: dict[str, list[str]] = {}
    for path, (changed, spans) in _blame_spans(repo, parent, culprit, "new", context).items():
        out = repo.git.blame("--porcelain", "--reverse", "-w", *spans, f"{culprit}..{good}", "--", path)
        for last_seen, line_no, rewriter in _porcelain_lines(out):
            if last_seen == good:
                continue
            if rewriter is None and last_seen not in children:
                children[last_seen] = _children_toward(repo, last_seen, good)
            for sha in [rewriter] if rewriter else children[last_seen]:
                _tally(counts, sha, line_no in changed)
    return _ranked(counts)


def _first_parent(repo: GitRepo, sha: str, what: str) -> str:
    commit = repo.repo.commit(sha)
    if not commit.parents:
        raise GitError(f"{what} {sha[:12]} has no parent to blame")
    return commit.parents[0].hexsha


def _blame_spans(repo: GitRepo, parent: str, sha: str, side: str,
                 context: int) -> dict[str, tuple[set[int], list[str]]]:
    """Per file, on the diff's `side` (old: in parent, new: in sha), the lines parent..sha changes and
    the `-L` spans covering them with `context` lines around (whitespace-only changes ignored)."""
    diff = repo.git.diff("-U0", "-w", "--no-renames", "--no-color", "--no-ext-diff", parent, sha)
    blamed_rev = parent if side == "old" else sha
    result = {}
    for path, hunks in _side_hunks(diff, side).items():
        length = len(repo.git.show(f"{blamed_rev}:{path}").splitlines())
        changed, spans = set(), []
        for start, count in hunks:
            changed.update(range(start, start + count))
            low, high = (start - context, start + count - 1 + context) if count else \
                (start - context + 1, start + context)
            low, high = max(1, low), min(length, high)
            if low <= high:
                spans += ["-L", f"{low},{high}"]
        if spans:
            result[path] = (changed, spans)
    return result


def _porcelain_lines(out: str) -> Iterator[tuple[str, int, str | None]]:
    """(commit, line number in the blamed revision, `previous` commit or None) per non-blank line."""
    previous: dict[str, str] = {}  # porcelain names a commit's `previous` only where it first shows it
    sha, line_no = None, 0
    for line in out.splitlines():
        header = PORCELAIN_HEADER.match(line)
        if header:
            sha, line_no = header.group(1), int(line.split()[2])
        elif line.startswith("previous ") and sha:
            previous[sha] = line.split()[1]
        elif line.startswith("\t") and sha and line[1:].strip():
            yield sha, line_no, previous.get(sha)


def _children_toward(repo: GitRepo, sha: str, tip: str) -> list[str]:
    """sha's children among tip's ancestors."""
    out = repo.git.rev_list("--parents", "--ancestry-path", f"{sha}..{tip}")
    return [fields[0] for fields in map(str.split, out.splitlines()) if sha in fields[1:]]


def _tally(counts: dict[str, list[int]], sha: str, changed: bool) -> None:
    tally = counts.setdefault(sha, [0, 0])
    tally[0 if changed else 1] += 1


def _ranked(counts: dict[str, list[int]]) -> list[BlamedCommit]:
    blamed = [BlamedCommit(sha, changed_lines, context_lines)
              for sha, (changed_lines, context_lines) in counts.items()]
    return sorted(blamed, key=lambda b: (-b.score, b.sha))


def _side_hunks(diff: str, side: str) -> dict[str, list[tuple[int, int]]]:
    """Per file present on `side` (old or new), that side's (start, count) hunks of a -U0 diff
    (count 0: the other side's lines go after start)."""
    marker, prefix, group = ("--- ", "--- a/", 1) if side == "old" else ("+++ ", "+++ b/", 3)
    hunks: dict[str, list[tuple[int, int]]] = {}
    path, in_header = None, False  # in a hunk's body, "--- x" is a removed line "-- x"
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            path, in_header = None, True
        elif in_header and line.startswith(marker):
            path = line[6:].rstrip("\t") if line.startswith(prefix) else None
        elif match := HUNK.match(line):
            in_header = False
            if path:
                count = 1 if match.group(group + 1) is None else int(match.group(group + 1))
                hunks.setdefault(path, []).append((int(match.group(group)), count))
    return hunks


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
