"""SZZ over git blame: which commits wrote, or later rewrote, the lines a commit changes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

from bisector.errors import GitError
from bisector.repo.refs import GitRepo

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
PORCELAIN_HEADER = re.compile(r"^([0-9a-f]{40}) \d+ \d+")


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
        changed: set[int] = set()
        spans = []
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
