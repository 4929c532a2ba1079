"""Where a step stands, as its world hands it to the judge (`Place`), and the step as its world sees it
(`StepAt`)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from bisector.machine.envs import Environment
from bisector.world.images import Container


@dataclass
class Place:
    """Where one step stands: ready (its container, or its environment with AITER) or why not."""

    ok: bool
    reason: str = ""
    log_path: str | None = None
    container: Container | None = None
    environment: Environment | None = None  # replaces the step's environment (an AITER layer)
    python: str | None = None  # the interpreter the scenario runs (the image's)
    slot_env: Mapping[str, str] | None = None  # the slot's variables as the scenario sees them
    build: bool = True  # build the tree as usual (False: the image holds the build)
    summary: str = ""  # added to the step's build line
    details: dict = field(default_factory=dict)  # what a human reads of it (the step's details)
    image_digest: str | None = None  # the --image the step runs in: part of its verdict cache key
    held_tree: Path | None = None  # a level inside AITER: the held commit's tree with its build (StepContext)
    phases: Mapping[str, float] = field(default_factory=dict)  # seconds of its parts (the step's phases)


@dataclass(frozen=True)
class StepAt:
    """One step as its world sees it: the commit, its worktree and log dir, its slot's variables."""

    sha: str
    worktree: Path
    logs: Path
    slot_env: Mapping[str, str] = field(default_factory=dict)
    cancel: threading.Event | None = None
