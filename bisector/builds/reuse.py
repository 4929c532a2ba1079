"""`--build reuse` (alias `python`): copy the extension modules an earlier step built for the same native hash."""
from __future__ import annotations

from pathlib import Path

from bisector.builds.base import FREE_COST, BuildContext, BuildResult, Decision, Target


class ReuseArtifacts:
    name = "reuse"
    cost = FREE_COST

    def __init__(self, context: BuildContext):
        self.cache = context.cache

    def can_serve(self, target: Target) -> Decision:
        record = self.cache.get(target.native)
        if record is None or record.status != "ok":
            return target.refuse(f"native {target.short} never built")
        return Decision(self.name, f"native {target.short} built before", target.native)

    def prepare(self, target: Target, decision: Decision, log_dir: Path) -> BuildResult:
        files = self.cache.restore(target.native, target.worktree)
        return BuildResult(self.name, True, f"{decision.reason}, {len(files)} files reused", None, target.env)
