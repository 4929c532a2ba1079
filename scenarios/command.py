"""Any command, judged by git bisect's exit protocol."""
from __future__ import annotations

import hashlib
import json
import shutil

from bisector.errors import ScenarioAbort, ScenarioError
from bisector.process import run_process
from scenarios.base import BaseScenario, Outcome, StepContext, Verdict, fault_lines

SKIP_EXIT = 125


class CommandScenario(BaseScenario):
    """Exit 0 good, 125 skip, 1-127 bad; killed by a signal bad; other exits >= 128 abort the run."""

    name = "command"
    version = "1"
    description = "run a command in the checkout; git bisect run's exit protocol"

    def __init__(self, argv: list[str]):
        super().__init__({})
        if not argv:
            raise ScenarioError("no command given after --")
        if shutil.which(argv[0]) is None and not _is_checkout_relative(argv[0]):
            raise ScenarioError(f"command not found: {argv[0]}")
        self.argv = list(argv)

    @property
    def gpus_per_run(self) -> int:
        """A command may drive a GPU: it gets one where there are GPUs, a CPU slot elsewhere."""
        return 1

    def fingerprint(self) -> str:
        blob = json.dumps({"name": self.name, "version": self.version, "argv": self.argv})
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def run(self, ctx: StepContext) -> Outcome:
        argv = list(self.argv)
        candidate = ctx.checkout / argv[0]
        if _is_checkout_relative(argv[0]) and candidate.exists():
            argv[0] = str(candidate)
        try:
            result = run_process(argv, ctx.checkout, ctx.log_path, ctx.timeout, ctx.env, ctx.cancel)
        except OSError as exc:
            return Outcome(Verdict.SKIP, f"cannot start {argv[0]}: {exc.strerror}", str(ctx.log_path))
        log = str(ctx.log_path)
        if result.timed_out:
            return Outcome(Verdict.SKIP, f"timed out after {ctx.timeout:g}s", log, {"timed_out": True})
        code = result.returncode
        faults = fault_lines("\n".join(result.marked))
        if result.signal_name:
            reason = f"killed by {result.signal_name}"
            return Outcome(Verdict.BAD, reason + (f": {faults[0]}" if faults else ""), log)
        if code == 0:
            return Outcome(Verdict.GOOD, "exit 0", log)
        if code == SKIP_EXIT:
            return Outcome(Verdict.SKIP, "exit 125 (skip)", log)
        if code < 128:
            return Outcome(Verdict.BAD, f"exit {code}" + (f": {faults[0]}" if faults else ""), log)
        if faults:
            return Outcome(Verdict.BAD, f"exit {code}: {faults[0]}", log)
        raise ScenarioAbort(f"command exited {code} (>= 128, not a signal): aborting as git bisect run "
                            f"does; see {log}")


def _is_checkout_relative(program: str) -> bool:
    return "/" in program and not program.startswith("/")
