"""Carrying a fix to another branch: patch-ids, cherry-pick trailers, diff hunks and reproducible picks.

Picks happen in tool-owned worktrees; the user's refs change only through create_branch.
"""
from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import git

from bisector.errors import GitError
from bisector.record.backport_results import Conflict
from bisector.repo.refs import GitRepo
from bisector.repo.worktrees import slot_git

CHERRY_PICKED_FROM = re.compile(r"\(cherry picked from commit ([0-9a-f]{7,40})\)")
NULL_SHA = "0" * 40
# Settings a cherry-pick in a tool-owned worktree runs with: no replayed resolutions, no signing
# prompt, no user hooks -- the pick is the same on every machine.
PICK_CONFIG = {"rerere.enabled": "false", "commit.gpgsign": "false", "core.hooksPath": os.devnull}


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
    conflicts: tuple[Conflict, ...] = ()  # one per conflicted path


def _patch_ids(repo: GitRepo, *log_args: str) -> dict[str, str]:
    """sha -> `git patch-id --stable` of the commits `git log` lists for log_args."""
    with tempfile.TemporaryFile() as diff:
        repo.git.log("-p", "--no-color", "--no-ext-diff", "--no-renames", "--full-diff",
                     "--no-merges", "--format=commit %H", *log_args, output_stream=diff)
        diff.seek(0)
        out = repo.git.patch_id("--stable", istream=diff)
    return {sha: pid for pid, sha in (line.split() for line in out.splitlines())}


def patch_id(repo: GitRepo, sha: str) -> str | None:
    """`git patch-id --stable` of one commit; None for a commit without a patch (empty, merge)."""
    return _patch_ids(repo, "--no-walk", sha).get(sha)


def picked_from(repo: GitRepo, sha: str) -> list[str]:
    """Commits that sha's message names in `(cherry picked from commit ...)` trailers."""
    return CHERRY_PICKED_FROM.findall(repo.git.log("-1", "--format=%B", sha))


def find_equivalent(repo: GitRepo, fix: str, tip: str) -> tuple[str, str] | None:
    """A commit on tip since its merge-base with fix that carries fix under another sha.

    Returns (sha, how): how is "cherry-picked" when its message has a `(cherry picked from
    commit X)` trailer naming fix (or the commit fix itself was picked from), "patch-id" when
    its `git patch-id --stable` equals fix's. None when tip has no such commit.
    """
    base = repo.merge_base(fix, tip)
    since = [tip] + ([f"^{base}"] if base else [])
    names = [fix, *picked_from(repo, fix)]
    out = repo.git.log("--format=%H%x00%B%x1e", "--fixed-strings",
                       "--grep=(cherry picked from commit ", *since)
    for record in out.split("\x1e"):
        sha, _, body = record.strip().partition("\0")
        if any(name.startswith(quoted) for quoted in CHERRY_PICKED_FROM.findall(body)
               for name in names):
            return sha, "cherry-picked"
    wanted = patch_id(repo, fix)
    files = repo.commit_info(fix).files
    if wanted is None or not files:
        return None
    for sha, pid in _patch_ids(repo, *since, "--", *files).items():
        if pid == wanted:
            return sha, "patch-id"
    return None


def rewritten_equivalent(repo: GitRepo, commit: str, tip: str) -> tuple[str, str] | None:
    """A commit in tip's history that is commit rewritten (a history rewrite, as ROCm/aiter's before
    v0.1.12): the same subject, author and author date; else, as find_equivalent, a cherry-pick of it or
    one with its patch-id. Returns (sha, how matched), None when tip's history has none."""
    fields = "%s%x00%an <%ae>%x00%ad"
    wanted = repo.git.log("-1", "--date=raw", f"--format={fields}", commit)
    for line in repo.git.log("--date=raw", f"--format=%H%x00{fields}", tip).splitlines():
        sha, _, rest = line.partition("\0")
        if rest == wanted and sha != commit:
            return sha, "same subject, author and author date"
    return find_equivalent(repo, commit, tip)


def diff_hunks(repo: GitRepo, sha: str) -> list[Hunk]:
    """The hunks of sha's change against its first parent (whole files for a root commit)."""
    out = repo.git.diff_tree("-p", "--no-color", "--no-ext-diff", "--no-renames", "--root",
                             "--no-commit-id", "-U3", sha)
    hunks: list[Hunk] = []
    path: str | None = None
    hunk_path, header = "", None
    body: list[str] = []
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
            header, body, hunk_path = line, [], path or ""
        elif header is not None and line[:1] in (" ", "-", "+"):
            body.append(line)
    if header is not None:
        hunks.append(Hunk(hunk_path, header, tuple(body)))
    return hunks


def _pick_env(repo: GitRepo, tip: str, fix: str) -> dict[str, str]:
    """Environment for a reproducible pick: the later committer date of tip and fix, an identity
    when the user has none, and PICK_CONFIG."""
    stamps = [repo.git.log("-1", "--format=%ct %cd", "--date=raw", sha).split(" ", 1)
              for sha in (tip, fix)]
    env = {"GIT_COMMITTER_DATE": max(stamps, key=lambda s: int(s[0]))[1],
           "GIT_CONFIG_COUNT": str(len(PICK_CONFIG))}
    for i, (key, value) in enumerate(PICK_CONFIG.items()):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = key, value
    for key, variable, default in (("user.name", "GIT_COMMITTER_NAME", "bisector"),
                                   ("user.email", "GIT_COMMITTER_EMAIL", "bisector@localhost")):
        if not os.environ.get(variable) and not _config(repo, key):
            env[variable] = default
    return env


def _config(repo: GitRepo, key: str) -> str | None:
    try:
        return repo.git.config("--get", key)
    except git.GitCommandError:
        return None


def cherry_pick(repo: GitRepo, worktree: Path, fix: str) -> PickResult:
    """`git cherry-pick -x fix` onto the detached HEAD of a tool-owned worktree.

    A conflicted or empty pick is aborted before returning, so the worktree is back at its tip.
    The pick's committer date is fixed (see _pick_env): the same tip and fix give the same sha.
    """
    wt = slot_git(worktree)
    tip = wt.rev_parse("HEAD")
    try:
        wt.cherry_pick("-x", fix, env=_pick_env(repo, tip, fix))
        return PickResult("clean", wt.rev_parse("HEAD"))
    except git.GitCommandError as exc:
        conflicts = _conflicts(repo, wt, fix)
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


def _conflicts(repo: GitRepo, wt: git.Git, fix: str) -> list[Conflict]:
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
            fix_hunks = fix_hunks if fix_hunks is not None else diff_hunks(repo, fix)
            hunks = [h.header for h in fix_hunks if h.path == path]
        conflicts.append(Conflict(file=path, kind=kind, hunks=tuple(hunks)))
    return conflicts


def create_branch(repo: GitRepo, name: str, sha: str) -> bool:
    """Create refs/heads/name at sha; False (and nothing changed) when it already exists."""
    try:
        repo.git.check_ref_format("--branch", name)
    except git.GitCommandError:
        raise GitError(f"invalid branch name: {name}") from None
    try:
        repo.git.update_ref("-m", "bisector backport", f"refs/heads/{name}", sha, NULL_SHA)
        return True
    except git.GitCommandError:
        return False
