"""How a step's worktree becomes runnable: build strategies behind one interface."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class BuildResult:
    strategy: str
    ok: bool
    reason: str
    log_path: str | None = None
    env: dict = field(default_factory=dict)


class NoBuild:
    """The tree runs as checked out (the CPU probe, or a command that builds for itself)."""

    name = "none"

    def prepare(self, worktree: Path, sha: str, log_dir: Path) -> BuildResult:
        return BuildResult("none", True, "no build")
