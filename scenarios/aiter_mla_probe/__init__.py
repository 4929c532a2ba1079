"""aiter-mla-probe: does the checkout's AITER MLA metadata builder size its metadata for the Q dtype the
decode kernel gets? CPU only: the builder runs from source in a child interpreter against a stand-in AITER."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from bisector.process import run_process
from scenarios.aiter_mla_probe.child import RESULT_PREFIX
from scenarios.aiter_mla_probe.contract import ProbeConfig
from scenarios.base import BaseScenario, Outcome, StepContext, Verdict, python_environment

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = 120.0


class AiterMLAProbe(BaseScenario):
    """Builds AiterMLAMetadataBuilder for one rank's configuration and checks AITER's tiling contract."""

    name = "aiter-mla-probe"
    description = ("CPU: run the checkout's AiterMLAMetadataBuilder from source against a stand-in AITER; "
                   "bad when the Q dtype it sizes metadata for changes AITER's tiling")
    needs_build = False
    option_defaults = {"heads": "128", "kv_cache_dtype": "fp8", "arch": "gfx942", "cu_num": "",
                       "max_num_seqs": "16"}

    def __init__(self, options=None):
        super().__init__(options)
        self.config = ProbeConfig.from_options(self.options)

    def environment(self, python: str) -> dict:
        """The probe runs the checkout's Python against torch in the --python environment."""
        return python_environment(python, ("torch",))

    def run(self, ctx: StepContext) -> Outcome:
        log = str(ctx.log_path)
        python = ctx.python or sys.executable
        argv = [python, "-m", "scenarios.aiter_mla_probe.child", str(Path(ctx.checkout).resolve()),
                json.dumps(self.config.as_dict())]
        inherited = ctx.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
        env = {**ctx.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), inherited]))}
        timeout = ctx.timeout or DEFAULT_TIMEOUT
        try:
            result = run_process(argv, ctx.checkout, ctx.log_path, timeout, env)
        except OSError as exc:
            return Outcome(Verdict.SKIP, f"cannot start {python}: {exc.strerror}", log)
        if result.timed_out:
            return Outcome(Verdict.SKIP, f"probe timed out after {timeout:g}s", log)
        reported = [line for line in result.output.splitlines() if line.startswith(RESULT_PREFIX)]
        if not reported:
            last = result.output.strip().splitlines()[-1:] or ["no output"]
            return Outcome(Verdict.SKIP, f"probe exited {result.returncode} without a result: {last[0]}", log)
        found = json.loads(reported[-1][len(RESULT_PREFIX):])
        details = {**found["details"], "seconds": round(result.seconds, 3)}
        return Outcome(Verdict(found["verdict"]), found["reason"], log, details)
