"""The state dir and record a command reads: --state-dir, else the repository's own."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bisector.errors import (
    GitError,
    UsageError,
)

if TYPE_CHECKING:

    from bisector.record.store import Store


def resolve_state_dir(repo: str, state_dir: Path | None) -> Path | None:
    """--state-dir as given, else the repository's default; None when repo is no git repository."""
    from bisector.engine.state import default_state_dir
    from bisector.repo.refs import GitRepo

    if state_dir:
        return state_dir
    try:
        return default_state_dir(GitRepo(Path(repo)))
    except GitError:
        return None


def open_record(repo: str, state_dir: Path | None) -> Store:
    """The store of repo's state dir (or --state-dir), or UsageError when there is none."""
    from bisector.record.store import Store

    directory = resolve_state_dir(repo, state_dir)
    if directory is None:
        raise UsageError(f"not a git repository: {repo} (give --repo or --state-dir)")
    database = directory / "bisector.sqlite"
    if not database.is_file():
        raise UsageError(f"no bisector record in {directory}")
    return Store(database)


def repo_root(repo: str) -> str | None:
    """The root path runs record for repo, None when repo is no git repository."""
    from bisector.repo.refs import GitRepo

    try:
        return str(GitRepo(Path(repo)).root)
    except GitError:
        return None
