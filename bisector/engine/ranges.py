"""The asked range, validated and resolved: its ends in git's terms, the merge bases to test first, its commits."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from bisector.engine.config import RunConfig
from bisector.errors import UsageError
from bisector.repo.refs import GitRepo
from bisector.search.policies import Endpoints


@dataclass(frozen=True)
class Range:
    """The validated range a run bisects: old and new in git's terms, with the user's names.

    good and bad are the resolved shas (several on the side that may be given several times).
    """

    repo: GitRepo
    good: tuple[str, ...]
    bad: tuple[str, ...]
    ends: Endpoints
    commits: list


def _refs(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


GLOB_CHARACTERS = "*?[]\\"


def check_paths(paths: Sequence[str]) -> None:
    """Refuse a --path git would not take as one literal path inside the repository (UsageError).

    A --path is relative to the repository's top (not the current directory) and names a file or folder
    as written: no pathspec magic (`:(glob)`, `:!`), no wildcards, nothing absolute or above the top. A path
    need not exist at the bad end: one that only earlier commits touch is fine.
    """
    for path in paths:
        if not path:
            raise UsageError("--path '': give a file or folder relative to the repository's top ('.' for all)")
        if path.startswith(":"):
            raise UsageError(f"--path {path!r}: pathspec magic is not taken; give a file or folder as written")
        if any(char in path for char in GLOB_CHARACTERS):
            raise UsageError(f"--path {path!r}: wildcards are not taken; give a file or folder as written")
        if os.path.isabs(path) or os.path.normpath(path).split(os.sep)[0] == "..":
            raise UsageError(f"--path {path!r}: give a path inside the repository, relative to its top")


def resolve_range(cfg: RunConfig) -> Range:
    """Validate the asked range, or raise UsageError.

    As git bisect does: many old refs (good; bad with --find-fix) and one new ref; when an old ref is
    not an ancestor of the new one, their merge bases must be tested first (Endpoints.merge_bases).
    """
    check_paths(cfg.paths)
    repo = GitRepo(cfg.repo)
    old_name, new_name = ("bad", "good") if cfg.find_fix else ("good", "bad")
    old_refs, new_refs = _refs(getattr(cfg, old_name)), _refs(getattr(cfg, new_name))
    if len(new_refs) != 1:
        raise UsageError(f"give one --{new_name} (--{old_name} may be given several times"
                         + (", with --find-fix --bad is the older end)" if cfg.find_fix else ")"))
    new, olds = repo.resolve(new_refs[0]), [repo.resolve(ref) for ref in old_refs]
    if cfg.chain:
        return _chain_range(repo, cfg, olds, new, old_refs[0], new_refs[0])
    olds = list(dict.fromkeys(olds))
    old_ref_of = dict(zip([repo.resolve(ref) for ref in old_refs], old_refs))
    for old in olds:
        if old == new:
            raise UsageError(f"good and bad are the same commit ({new[:12]})")
        if repo.is_ancestor(new, old):
            raise UsageError(f"{new_name} {new_refs[0]} is an ancestor of {old_name} {old_ref_of[old]}: "
                             f"did you swap --good and --bad?"
                             + (" (with --find-fix, --bad is the older end)" if cfg.find_fix else ""))
    bases: list[str] = []
    if not all(repo.is_ancestor(old, new) for old in olds):
        bases = [base for base in repo.merge_bases(new, olds) if base not in olds]
    ends = Endpoints(olds[0], new, old_name, new_name, old_ref_of[olds[0]], new_refs[0],
                     tuple(olds), tuple(old_ref_of[old] for old in olds), tuple(bases))
    commits = repo.range_commits(olds, new, cfg.first_parent, cfg.paths)
    shown_olds = " ".join(old_refs)
    if len(commits) <= 1 and cfg.paths:
        raise UsageError(f"empty range: no commit in {shown_olds}..{new_refs[0]} touches {' '.join(cfg.paths)} "
                         f"(paths are relative to the repository's top)")
    if not commits:
        raise UsageError(f"empty range: no commits between {shown_olds} and {new_refs[0]}")
    resolved = {old_name: tuple(olds), new_name: (new,)}
    return Range(repo, resolved["good"], resolved["bad"], ends, commits)


def _chain_range(repo: GitRepo, cfg: RunConfig, olds: list[str], new: str, old_ref: str, new_ref: str) -> Range:
    """A range of given commits (cfg.chain, oldest first, from the old end to the new one), each standing
    on the one before it: what --follow-pins bisects when two pins share no history (their release tags)."""
    chain = [repo.resolve(ref) for ref in cfg.chain]
    if len(olds) != 1 or chain[0] != olds[0] or chain[-1] != new or len(set(chain)) != len(chain) or len(chain) < 2:
        raise UsageError("a chain of commits runs from the old end to the new one, each commit once")
    old_name, new_name = ("bad", "good") if cfg.find_fix else ("good", "bad")
    ends = Endpoints(chain[0], new, old_name, new_name, old_ref, new_ref)
    commits = [(sha, (parent,)) for parent, sha in zip(chain, chain[1:])]
    resolved = {old_name: (chain[0],), new_name: (new,)}
    return Range(repo, resolved["good"], resolved["bad"], ends, commits)
