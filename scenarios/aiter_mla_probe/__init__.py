"""aiter-mla-probe: does the checkout's AITER MLA metadata builder size its metadata for the Q dtype the
decode kernel gets? CPU only: the builder runs from source in a child interpreter, against the AITER source
the checkout pins (its own `get_mla_metadata_info_v1`), or the hand-written tile rule where none is pinned."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import cast

from bisector.errors import ScenarioError
from bisector.machine.probe_env import python_environment
from bisector.process import no_room, run_process
from bisector.repo.pins import unsafe_git_source
from bisector.seams import FollowUp, Scenario
from scenarios.aiter_mla_probe import sources
from scenarios.aiter_mla_probe.contract import RESULT_PREFIX, ProbeConfig
from scenarios.base import BaseScenario, Outcome, StepContext, Verdict

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT = 120.0
# What the probe reads of a vLLM checkout, the backend it judges first: a culprit's report lists these first.
VLLM_PATHS = ("vllm/v1/attention/backends/mla/rocm_aiter_mla.py",
              "vllm/model_executor/layers/attention/mla_attention.py", "vllm/v1/attention/backends/mla/common.py",
              "vllm/platforms/rocm.py", "vllm/config/cache.py", "docker/Dockerfile.rocm_base")
# ... and of an AITER checkout (vllm_repo/vllm_ref hold vLLM): where get_mla_metadata_info_v1 is defined, and
# the MLA code around it.
AITER_PATHS = ("aiter/ops/attention.py", "aiter/*mla*", "csrc/*mla*")


class AiterMLAProbe(BaseScenario):
    """Builds AiterMLAMetadataBuilder for one rank's configuration and checks AITER's tiling contract."""

    name = "aiter-mla-probe"
    description = ("CPU: run the checkout's AiterMLAMetadataBuilder from source against the AITER it pins; "
                   "bad when the Q dtype it sizes metadata for changes AITER's metadata")
    needs_build = False
    option_defaults = {"heads": "128", "kv_cache_dtype": "fp8", "arch": "gfx942", "cu_num": "",
                       "max_num_seqs": "16", "aiter_repo": "", "aiter_ref": "", "vllm_repo": "", "vllm_ref": ""}

    def __init__(self, options=None):
        super().__init__(options)
        self.config = ProbeConfig.from_options(self.options)
        if bool(self.options["vllm_repo"]) != bool(self.options["vllm_ref"]):
            raise ScenarioError("options vllm_repo and vllm_ref go together: they hold vLLM at one commit "
                                "while the repository bisected is AITER")
        for key in ("aiter_ref", "vllm_ref"):
            if self.options[key].startswith("-"):
                raise ScenarioError(f"option {key}={self.options[key]!r}: a ref cannot start with '-'")
        for key in ("aiter_repo", "vllm_repo"):
            problem = unsafe_git_source(self.options[key]) if self.options[key] else None
            if problem:
                raise ScenarioError(f"option {key}={self.options[key]!r}: {problem}")

    def identity(self, python: str) -> dict:
        """The scenario's identity plus the refs of the AITER repository named or cached: a pin that could
        now resolve to another AITER commit gives another cache key."""
        repo = self.options["aiter_repo"] or sources.DEFAULT_AITER_REPO
        return {**super().identity(python), "aiter_refs": {repo: sources.refs_digest(repo)}}

    def environment(self, python: str) -> dict:
        """The probe runs the checkout's Python against torch in the --python environment."""
        return python_environment(python, ("torch",))

    def implicated_paths(self) -> tuple[str, ...]:
        """The files the probe reads of the repository bisected (AITER's with vllm_repo/vllm_ref)."""
        return AITER_PATHS if self.options["vllm_repo"] else VLLM_PATHS

    def follow_up(self, dependency: str) -> FollowUp | None:
        """A hunt inside AITER keeps this probe's options but where AITER and vLLM come from (it holds
        vLLM at the answer: vllm_repo/vllm_ref), and the AITER repository named here."""
        if dependency != "aiter":
            return None
        held = {"aiter_repo", "aiter_ref", "vllm_repo", "vllm_ref"}
        kept = {key: value for key, value in self.options.items() if value and key not in held}
        return FollowUp(repo=self.options["aiter_repo"] or None, options=kept, hold=lambda repo, commit: cast(
            Scenario, type(self)({**kept, "vllm_repo": repo, "vllm_ref": commit})))

    def run(self, ctx: StepContext) -> Outcome:
        log = str(ctx.log_path)
        try:
            vllm_tree, aiter = self._sources(Path(ctx.checkout).resolve())
        except sources.SourceUnavailable as exc:
            return Outcome(Verdict.SKIP, str(exc), log)
        python = ctx.python or sys.executable
        argv = [python, "-m", "scenarios.aiter_mla_probe.child", str(vllm_tree),
                json.dumps(self.config.as_dict()), json.dumps(aiter.as_dict())]
        inherited = ctx.env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
        env = {**ctx.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), inherited]))}
        timeout = ctx.timeout or DEFAULT_TIMEOUT
        try:
            result = run_process(argv, ctx.checkout, ctx.log_path, timeout, env, ctx.cancel)
        except OSError as exc:  # no room for its log (a full disk, `ulimit -f`): the machine's
            return Outcome(Verdict.SKIP, f"cannot start {python}: {exc.strerror}", log,
                           cause="machine" if no_room(exc) else None)
        if result.timed_out:
            return Outcome(Verdict.SKIP, f"timed out after {timeout:g}s", log, timed_out=True)
        reported = [line for line in result.output.splitlines() if line.startswith(RESULT_PREFIX)]
        if not reported:
            last = result.output.strip().splitlines()[-1:] or ["no output"]
            return Outcome(Verdict.SKIP, f"probe exited {result.returncode} without a result: {last[0]}", log)
        found = json.loads(reported[-1][len(RESULT_PREFIX):])
        details = {**found["details"], "seconds": round(result.seconds, 3)}
        masked = details.pop("masked", None)  # the probe's note that this AITER hides the bug (contract.judge)
        return Outcome(Verdict(found["verdict"]), found["reason"], log, details, masked=masked)

    def _sources(self, checkout: Path) -> tuple[Path, sources.AiterSource]:
        """(vLLM tree, AITER): the checkout and its pinned AITER, or, with vllm_repo/vllm_ref, the held vLLM
        commit and the checkout as AITER."""
        if self.options["vllm_repo"]:
            return (sources.held_vllm(self.options["vllm_repo"], self.options["vllm_ref"]),
                    sources.checkout_aiter(checkout))
        return checkout, sources.pinned_aiter(checkout, self.options["aiter_repo"], self.options["aiter_ref"])
