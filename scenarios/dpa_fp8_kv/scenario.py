"""The dpa-fp8-kv-graph-capture scenario: check for a GPU, write the model, run the ranks, judge."""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

from bisector.process import ProcessResult
from scenarios.base import BaseScenario, Outcome, StepContext, Verdict
from scenarios.dpa_fp8_kv import child
from scenarios.dpa_fp8_kv.classify import classify, combine
from scenarios.dpa_fp8_kv.config import write_model_dir
from scenarios.dpa_fp8_kv.gpu import probe_rocm_gpus
from scenarios.dpa_fp8_kv.launch import run_ranks
from scenarios.dpa_fp8_kv.options import OPTION_DEFAULTS, parse_options
from scenarios.dpa_fp8_kv.plan import Launch, build_plan, step_devices


class DpaFp8KvScenario(BaseScenario):
    """vLLM on a tiny DeepSeek-V3 with AITER MLA, FP8 KV cache and full decode CUDA graphs.

    Default: one GPU, 128 heads per rank (the data-parallel-attention layout). tp=8 spreads the
    128 heads to 16 per rank, the control that hides the bug; dp=N runs N real data-parallel ranks.
    """

    name = "dpa-fp8-kv-graph-capture"
    version = "1"
    description = ("tiny DeepSeek-V3 on AITER MLA with FP8 KV cache and full decode graphs; "
                   "GPU memory fault or SIGABRT is bad")
    option_defaults = OPTION_DEFAULTS
    # what a step's JSON records of its environment (--env per-commit)
    env_versions = ("torch", "pytorch-triton-rocm", "triton", "amd-aiter", "transformers", "numba")
    system_root = Path("/")  # where /dev/kfd and /sys are looked up; tests point it at a fake tree

    def __init__(self, options=None):
        super().__init__(options)
        self.settings = parse_options(self.options)

    @property
    def gpus_per_run(self) -> int:
        return self.settings.gpus

    def run(self, ctx: StepContext) -> Outcome:
        probe = probe_rocm_gpus(self.system_root)
        if probe.problem:
            return self._unrun(ctx, f"no ROCm GPU visible on this machine ({probe.problem})")
        env = {**os.environ, **ctx.env}
        devices = step_devices(env, len(probe.targets))
        if len(devices) < self.gpus_per_run:
            return self._unrun(ctx, f"needs {self.gpus_per_run} GPUs (dp={self.settings.dp} x "
                                    f"tp={self.settings.tp}), this step has {len(devices)}")
        with tempfile.TemporaryDirectory(prefix="bisector-dpa-fp8-kv-") as tmp:
            work = Path(tmp)
            write_model_dir(work / "model", self.settings)
            # A private copy, so the child's sys.path[0] holds nothing but itself.
            child_script = Path(shutil.copy(child.__file__, work / "child.py"))
            launches = build_plan(self.settings, python=ctx.python, child_script=child_script,
                                  model_dir=work / "model", checkout=ctx.checkout, devices=devices,
                                  base_env=env, master_port=_free_port(), timeout=ctx.timeout)
            try:
                results = run_ranks(launches, ctx.checkout, work, ctx.cancel)
            except OSError as exc:
                return self._unrun(ctx, f"cannot start {ctx.python}: {exc.strerror}")
        _write_log(ctx.log_path, _merged_log(launches, results))
        judged = [classify(result) for result in results]
        verdict, reason = combine(results, judged)
        ranks = [{"rank": launch.rank, "devices": launch.env["HIP_VISIBLE_DEVICES"],
                  "verdict": rank_verdict.value, "returncode": result.returncode,
                  "timed_out": result.timed_out}
                 for launch, result, (rank_verdict, _) in zip(launches, results, judged)]
        timed_out = verdict is Verdict.SKIP and any(result.timed_out for result in results)
        return Outcome(verdict, reason, str(ctx.log_path),
                       {"gpu_targets": list(probe.targets), "heads_per_rank": self.settings.heads_per_rank,
                        "seconds": round(results[0].seconds, 1), "ranks": ranks, "timed_out": timed_out})

    def _unrun(self, ctx: StepContext, reason: str) -> Outcome:
        """Skip without running anything; the log says why in one line."""
        _write_log(ctx.log_path, reason + "\n")
        return Outcome(Verdict.SKIP, reason, str(ctx.log_path))


def _merged_log(launches: list[Launch], results: list[ProcessResult]) -> str:
    sections = []
    for launch, result in zip(launches, results):
        dp_env = " ".join(f"{key}={value}" for key, value in sorted(launch.env.items())
                          if key.startswith(("VLLM_DP_", "VLLM_ROCM_USE_AITER", "HIP_VISIBLE")))
        sections.append(f"===== rank {launch.rank}: {dp_env}\n===== argv: {launch.argv}\n{result.output}")
    return "\n".join(sections)


def _write_log(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
