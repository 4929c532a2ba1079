"""The backport progress display: imported by `bisector backport` once it runs. It is a
`bisector.backport.BackportHandler` by shape (a Protocol), so importing it loads no engine."""
from __future__ import annotations

from bisector.cli.progress import console, escape
from bisector.results import BranchEntry


class BackportProgress:
    """One line per branch on stderr as its verdict lands."""

    def checking(self, branch: str, tip: str) -> None:
        console.print(f"  checking {branch} ({tip[:12]}) …", style="dim")

    def checked(self, entry: BranchEntry) -> None:
        colour = "green" if entry.settled else "red"
        at = f" at {entry.options}" if entry.options else ""
        console.print(f"{escape(entry.branch)}{escape(at)}: [{colour}]{entry.verdict}[/{colour}] "
                      f"({escape(entry.reason)})")
