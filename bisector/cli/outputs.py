"""The files a command writes for the user (`--json`, `--markdown`, `--junit`, `report -o`, the plot beside a
performance hunt's JSON, each value's reports of `--option KEY=A,B`): their names, and the checks that refuse
them all, in one line, before anything runs."""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Sequence

from bisector.cli.options import NAME_MAX, check_writable
from bisector.errors import GitError, UsageError

NAME_SAFE = re.compile(r"[A-Za-z0-9._+,-]+")  # what a value keeps of itself in a report's name
NAME_KEPT = 40  # characters of a value kept in a report's name when it is cut


def name_part(text: str) -> str:
    """text as part of a file name: itself when it is at most NAME_KEPT letters, digits and `. _ + , -`;
    else those characters kept (each run of others one `_`, cut to NAME_KEPT), then `-` and 8 hex digits of
    text's sha256, so that no two values share a name and none holds '/' or '='."""
    if not text or (NAME_SAFE.fullmatch(text) and len(text) <= NAME_KEPT):
        return text
    kept = "_".join(NAME_SAFE.findall(text))[:NAME_KEPT]
    return f"{kept}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def value_names(runs: Sequence[tuple[str, dict[str, str]]]) -> list[str]:
    """The name each run of option_values' list gives its reports: the listed keys' `key=value`
    (name_part of each), joined by `.`; "" for a single run."""
    if len(runs) < 2:
        return [""] * len(runs)
    listed = [key for key in runs[0][1] if len({options[key] for _, options in runs}) > 1]
    return [".".join(f"{name_part(key)}={name_part(options[key])}" for key in listed) for _, options in runs]


def labelled(path: Path | None, name: str) -> Path | None:
    """A report path of one run among several: its value name before the suffix, `run.json` →
    `run.arch=gfx950.json`; a name that would pass NAME_MAX bytes keeps what fits of the value name, then `-`
    and 8 hex digits of its sha256 (check_writable refuses a --json too long to hold even that)."""
    if path is None or not name:
        return path
    room = NAME_MAX - len(os.fsencode(f"{path.stem}.{path.suffix}"))
    if len(name) > room:  # value names are ASCII (name_part): a character is a byte
        name = f"{name[:max(room - 9, 0)]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return path.with_name(f"{path.stem}.{name}{path.suffix}")


def plot_beside(json_file: Path) -> Path:
    """Where a performance hunt's plot goes: its --json with `.json` made `.svg` (`.svg` added to a name
    ending otherwise)."""
    return json_file.with_suffix(".svg") if json_file.suffix == ".json" else \
        json_file.with_name(json_file.name + ".svg")


def check_outputs(repo: str, state_dir: Path | None, outputs: Sequence[tuple[str, Path | None]],
                  plots: Sequence[tuple[str, Path]] = ()) -> None:
    """Raise UsageError unless every output (option, path) and plot (the option it goes beside, path) can be
    written without harm: a regular file or none yet, in a place where one can be made (check_writable), not in
    the state dir (the record, its journal, locks, logs: the tool's own files) nor in git's directory (repo's,
    or any repository's that path is or lies in: a `.git` file too), no two at one file however spelled, and no
    plot where a file stands that bisector did not write."""
    from bisector.cli.state import resolve_state_dir
    from bisector.repo.refs import GitRepo

    try:
        git_repo = GitRepo(Path(repo))
        git_dirs = {git_repo.common_dir, Path(git_repo.repo.git_dir)}
    except GitError:
        git_dirs = set()
    state = resolve_state_dir(repo, state_dir)
    named = [(option, path) for option, path in outputs if path is not None]
    plotted = [(f"{option}'s plot", path) for option, path in plots]
    seen: dict[tuple[object, ...], str] = {}
    for option, path in (*named, *plotted):
        check_writable(option, path)
        if state is not None and _inside(path, state):
            raise UsageError(f"{option} {path}: would write into the state dir {state}, whose files (the record "
                             "bisector.sqlite and its journal among them) are the tool's; write it elsewhere")
        for git_dir in (*git_dirs, *filter(None, [_git_place(path)])):
            if git_dir.is_file():
                raise UsageError(f"{option} {path}: is git's {git_dir} (a .git file naming its repository's git "
                                 "directory); write it elsewhere")
            if _inside(path, git_dir):
                raise UsageError(f"{option} {path}: would write into git's directory {git_dir}; write it elsewhere")
        identity = _identity(path)
        if identity in seen:
            raise UsageError(f"{option} {path}: {seen[identity]} writes that file too; give each its own")
        seen[identity] = option
    for option, path in plots:
        if path.exists() and not _holds_plot(path):
            raise UsageError(f"{option}'s plot {path}: a file bisector did not write is there; move it, or give "
                             f"{option} another name (the plot goes beside it, .json → .svg)")


def _git_place(path: Path) -> Path | None:
    """The git directory (or `.git` file) that path is or lies in, whatever repository's: a place named .git, or
    a folder git itself takes for its directory (HEAD beside objects/ and refs/, or a worktree's or
    submodule's own with its commondir), such as the one a `.git` file's `gitdir:` names."""
    real = path.resolve()
    for place in (real, *real.parents):
        if place.name == ".git" or (place / "HEAD").is_file() and (
                (place / "objects").is_dir() and (place / "refs").is_dir() or (place / "commondir").is_file()):
            return place
    return None


def _identity(path: Path) -> tuple[object, ...]:
    """What tells path's file from others however it is spelled (a hard link, a symlink, a bind mount): its
    device and inode when it is there, else its folder's and its name, else (no folder yet) its real path."""
    real = path.resolve()
    try:
        found = real.stat()
        return found.st_dev, found.st_ino
    except OSError:
        pass
    try:
        folder = real.parent.stat()
        return folder.st_dev, folder.st_ino, real.name
    except OSError:
        return (real,)


def _inside(path: Path, folder: Path) -> bool:
    """Whether path (symlinks followed) is folder or lies under it, however either is spelled (a symlink, a
    bind mount), or is a hard link to one of folder's own files (a folder not made yet: by its path)."""
    real = path.resolve()
    if real == folder.resolve() or folder.resolve() in real.parents:
        return True
    try:
        target = folder.stat()
    except OSError:
        return False
    for place in (real, *real.parents):
        try:
            if os.path.samestat(place.stat(), target):
                return True
        except OSError:
            continue
    try:
        linked = path.stat()
        return linked.st_nlink > 1 and any(os.path.samestat(linked, each.stat())
                                           for each in folder.iterdir() if each.is_file())
    except OSError:
        return False


def _holds_plot(path: Path) -> bool:
    """Whether path is a plot bisector wrote (it carries perf_report.PLOT_MARK near its start)."""
    from bisector.report.perf import PLOT_MARK

    try:
        with path.open("rb") as handle:
            return PLOT_MARK.encode() in handle.read(4096)
    except OSError:
        return False
