"""The scenario protocol: what every reproduction implements, and the fault signatures they share.

The seam's data types (Verdict, Outcome, StepContext) belong to the core (bisector.seams) and are
re-exported here, so a plug-in needs only `from scenarios.base import BaseScenario, Outcome, ...`.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Mapping

from bisector.errors import ScenarioError
from bisector.machine.probe_env import python_environment
from bisector.process import watch_for
from bisector.seams import FollowUp, Outcome, StepContext, Verdict

__all__ = ["BaseScenario", "FaultSignature", "Outcome", "StepContext", "Verdict", "FAULT_SIGNATURES",
           "fault_lines", "source_files", "source_hash"]


class BaseScenario(ABC):
    """What most scenarios share (implements bisector.seams.Scenario): options checked against
    option_defaults, and a verdict cache identity of source, options and environment."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    needs_build: ClassVar[bool] = True
    option_defaults: ClassVar[Mapping[str, str]] = {}
    default_signature: ClassVar[str] = "any"  # --signature when not given: any | auto | a regex
    env_versions: ClassVar[tuple[str, ...]] = ("torch", "transformers")  # recorded per step (--env per-commit)
    runs_in_images: ClassVar[bool] = False  # True: it starts its processes through ctx.container (--image)
    aiter_sensitive: ClassVar[bool] = False  # True: its verdict depends on AITER (--aiter defaults to installed)
    inputs_known: ClassVar[bool] = True  # identity() names all a verdict depends on (bisector.seams.Scenario)

    def __init__(self, options: Mapping[str, str] | None = None):
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.option_defaults))
        if unknown:
            known = ", ".join(sorted(self.option_defaults)) or "none"
            raise ScenarioError(f"scenario {self.name!r} has no option {unknown[0]!r} (known: {known})")
        self.options = {**self.option_defaults, **options}

    @property
    def gpus_per_run(self) -> int:
        return 0

    def identity(self, python: str) -> dict:
        """What decides this scenario's verdicts besides the commit: part of the verdict cache key."""
        return {"scenario": self.name, "source": source_hash(type(self)), "options": dict(self.options),
                "environment": self.environment(python)}

    def environment(self, python: str) -> dict:
        """Versions in the --python environment that change this scenario's verdicts (default: Python's).

        Override to add what the scenario depends on, e.g. `python_environment(python, ("torch",))`.
        """
        return python_environment(python)

    def machine_check(self, ctx: StepContext) -> str | None:
        """Why this machine cannot run the step, checked before the build (bisector.seams.ChecksMachine):
        override when the scenario needs what a machine may lack (a GPU, a torch flavour). None: nothing."""
        return None

    def follow_up(self, dependency: str) -> FollowUp | None:
        """How the hunt continues inside `dependency` (e.g. "aiter") when the answer moves its pin: the
        repository and the options this scenario carries over. None (the default): nothing of its own."""
        return None

    @abstractmethod
    def run(self, ctx: StepContext) -> Outcome:
        """Judge the commit checked out at ctx.checkout."""


class FaultSignature:
    """Literal parts that must appear in order on one line; a digit must follow part number
    `digit_after`. Checked with plain substring search: linear in the line's length."""

    def __init__(self, *parts: str, digit_after: int | None = None):
        self.parts, self.digit_after = parts, digit_after

    @property
    def marker(self) -> str:
        """The first part: a line without it cannot match (what a stream scan looks for)."""
        return self.parts[0]

    def search(self, line: str) -> bool:
        at = 0
        for n, part in enumerate(self.parts):
            at = line.find(part, at)
            while at >= 0 and n == self.digit_after and not line[at + len(part):at + len(part) + 1].isdigit():
                at = line.find(part, at + 1)
            if at < 0:
                return False
            at += len(part)
        return True


def source_files(cls: type) -> list[Path]:
    """The scenario's own code: its package's Python files, or its module when it is not in a package
    of its own (scenarios/command.py)."""
    module = sys.modules[cls.__module__]
    path = Path(inspect.getfile(module)).resolve()
    package = module.__name__ if path.name == "__init__.py" else module.__name__.rpartition(".")[0]
    if path.name != "__init__.py" and package in ("", "scenarios"):
        return [path]
    root = path.parent if path.name == "__init__.py" else Path(inspect.getfile(sys.modules[package])).resolve().parent
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@functools.lru_cache(maxsize=None)
def source_hash(cls: type) -> str:
    """sha256 (16 hex) of the scenario's source files, by path relative to their folder and content."""
    files = source_files(cls)
    base = files[0].parent
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# A GPU memory fault as a parent process sees it (ROCm runtime / HSA).
FAULT_SIGNATURES = (
    FaultSignature("Memory access fault by GPU node-", digit_after=0),
    FaultSignature("HSA_STATUS_ERROR_MEMORY_FAULT"),
    FaultSignature("HSA_STATUS_ERROR_EXCEPTION", "0x1016"),
)
FAULT_MARKERS = tuple(sig.marker for sig in FAULT_SIGNATURES)
watch_for(*FAULT_MARKERS)  # every command's output is scanned for them as it streams
FAULT_LINE_CHARS = 500  # a fault line is reported by its first characters


def fault_lines(text: str, limit: int = 5) -> list[str]:
    """Lines of text that carry a GPU memory-fault signature (linear in the text's length)."""
    found: list[str] = []
    if not any(marker in text for marker in FAULT_MARKERS):
        return found
    for line in text.splitlines():
        if any(sig.search(line) for sig in FAULT_SIGNATURES):
            found.append(line.strip()[:FAULT_LINE_CHARS])
            if len(found) == limit:
                break
    return found
