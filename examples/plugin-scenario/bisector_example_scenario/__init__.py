"""file-marker: a commit is bad when a file in the checkout contains a marker text."""
from __future__ import annotations

from scenarios.base import BaseScenario, Outcome, StepContext, Verdict


class FileMarker(BaseScenario):
    """Reads one file of the checkout; no build, no GPU."""

    name = "file-marker"
    description = "bad when --option path=FILE contains --option marker=TEXT; skip when FILE is missing"
    needs_build = False
    option_defaults = {"path": "state", "marker": "bad"}

    def run(self, ctx: StepContext) -> Outcome:
        target = ctx.checkout / self.options["path"]
        if not target.is_file():
            return Outcome(Verdict.SKIP, f"{self.options['path']} is missing")
        if self.options["marker"] in target.read_text(errors="replace"):
            return Outcome(Verdict.BAD, f"{self.options['path']} contains {self.options['marker']!r}")
        return Outcome(Verdict.GOOD, f"{self.options['path']} has no {self.options['marker']!r}")
