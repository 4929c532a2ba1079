"""The backport progress display: imported by `bisector backport` once it runs. It is a
`bisector.engine.backport.BackportHandler` by shape (a Protocol), so importing it loads no engine."""
from __future__ import annotations

from bisector.cli.progress import ProgressHandler, console, escape
from bisector.record.backport_results import BranchEntry, BranchLevel


class BackportProgress:
    """One line per branch on stderr as its verdict lands; a --follow-pins level inside AITER is shown as
    `run --follow-pins` shows one: a heading for the branch, the level's heading, then its steps."""

    def __init__(self) -> None:
        self.steps = ProgressHandler()  # one display for every level: its heartbeat starts once

    def checking(self, branch: str, tip: str) -> None:
        console.print(f"  checking {branch} ({tip[:12]}) …", style="dim")

    def checked(self, entry: BranchEntry) -> None:
        colour = "green" if entry.settled else "red"
        at = f" at {entry.options}" if entry.options else ""
        cached = f"; {entry.said_cached}" if entry.cached else ""
        console.print(f"{escape(entry.branch)}{escape(at)}: [{colour}]{entry.verdict}[/{colour}] "
                      f"({escape(entry.reason + cached)})")

    def following(self, entry: BranchEntry, neighbour: BranchEntry) -> ProgressHandler:
        at = f" at {entry.options}" if entry.options else ""
        console.print(escape(f"follow-pins: {entry.branch}{at} tests {entry.before}, {neighbour.branch} "
                             f"{neighbour.before}; AITER {neighbour.pin} → {entry.pin}: bisecting inside AITER "
                             f"({entry.tip[:12]} held)"))
        return self.steps

    def followed(self, entry: BranchEntry, level: BranchLevel) -> None:
        at = f" at {entry.options}" if entry.options else ""
        console.print(escape(f"{entry.branch}{at}: {level.said()}"))
