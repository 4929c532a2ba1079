"""Shared fixtures: real git repositories built in temp dirs."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {"GIT_AUTHOR_NAME": "Test Author", "GIT_AUTHOR_EMAIL": "author@example.com",
       "GIT_COMMITTER_NAME": "Test Committer", "GIT_COMMITTER_EMAIL": "committer@example.com",
       "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+00:00", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+00:00"}


def git(repo: Path, *args: str) -> str:
    """Run git with an argument list in repo; returns stdout stripped."""
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **ENV}).stdout.strip()


class RepoBuilder:
    """A real git repository in a temp dir, grown commit by commit."""

    def __init__(self, path: Path):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        git(path, "init", "-q", "-b", "main")

    def commit(self, message: str, files: dict[str, str | None]) -> str:
        """Write (or delete, with None) files and commit them; returns the new sha."""
        for name, content in files.items():
            target = self.path / name
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        git(self.path, "add", "-A")
        git(self.path, "commit", "-q", "--allow-empty", "-m", message)
        return self.head()

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD")

    def linear(self, count: int, bad_from: int | None, start: int = 0) -> list[str]:
        """count commits; from index bad_from on the file `state` says bad. Returns shas."""
        shas = []
        for i in range(start, start + count):
            broken = bad_from is not None and i >= bad_from
            shas.append(self.commit(f"change {i} (#{1000 + i})",
                                    {"counter.txt": f"{i}\n", "state": "bad\n" if broken else "good\n"}))
        return shas

    def snapshot(self) -> dict:
        """Everything a bisection must leave as it was: HEAD, refs, index, working tree status."""
        return {"head": git(self.path, "rev-parse", "HEAD"),
                "symbolic": git(self.path, "symbolic-ref", "-q", "HEAD"),
                "refs": git(self.path, "for-each-ref"),
                "index": (self.path / ".git" / "index").read_bytes(),
                "status": git(self.path, "status", "--porcelain", "--untracked-files=all"),
                "worktrees": git(self.path, "worktree", "list", "--porcelain")}


@pytest.fixture
def make_repo(tmp_path):
    """Factory: make_repo(name) -> RepoBuilder of a fresh repository under tmp_path."""
    return lambda name="repo": RepoBuilder(tmp_path / name)


def bisector(*args: str, cwd: Path | None = None, env: dict | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (python -m bisector.cli)."""
    return subprocess.run([sys.executable, "-m", "bisector.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, **ENV, "PYTHONPATH": str(ROOT), **(env or {})})


# A command scenario judging the checkout by its `state` file: exit 0 good, 1 bad.
STATE_IS_GOOD = ["grep", "-q", "good", "state"]
