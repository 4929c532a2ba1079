"""The child launches for one step: argv, environment and timeout per data-parallel rank. Pure."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from bisector.machine.gpus import env_gpus
from scenarios.dpa_fp8_kv.options import Options

DEFAULT_TIMEOUT = 3600.0  # first run on a commit may compile graphs and AITER kernels
# What narrows a child to its GPUs, per platform (ROCR_VISIBLE_DEVICES is read, never passed on).
DEVICE_VARS = {"rocm": ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"), "cuda": ("CUDA_VISIBLE_DEVICES",)}
DP_VARS = ("VLLM_DP_RANK", "VLLM_DP_RANK_LOCAL", "VLLM_DP_SIZE", "VLLM_DP_MASTER_IP",
           "VLLM_DP_MASTER_PORT")
# CUDA: no flashinfer needed for one greedy decode step (and the device payload has none). AITER switches
# stay away: VLLM_ROCM_USE_AITER=1 makes vLLM pick ROCm AITER MoE on NVIDIA too, which then fails.
CUDA_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}


@dataclass(frozen=True)
class Launch:
    rank: int
    argv: list[str]
    env: dict[str, str]  # the complete environment of the child
    timeout: float


def step_devices(env: Mapping[str, str], detected: int) -> list[str]:
    """Physical GPU ids the step may use, by bisector's one rule (bisector.machine.gpus.env_gpus): what
    the GPU variables grant (set but empty = none), else every detected GPU. ValueError on a bad list."""
    granted = env_gpus(env)
    return [str(i) for i in (range(detected) if granted is None else granted)]


def child_argv(python: str, child_script: Path, model_dir: Path, options: Options,
               platform: str, load_format: str = "dummy") -> list[str]:
    """The child's command line; check=numerics adds the decode's length, top-k and the weights' format;
    check=perf the measurements' count and size."""
    numerics = ["--load-format", load_format, "--numerics-tokens", str(options.numerics_tokens),
                "--numerics-topk", str(options.numerics_topk)] if options.check == "numerics" else \
        ["--perf-repeats", str(options.perf_repeats), "--perf-tokens", str(options.perf_tokens),
         "--perf-batch", str(options.perf_batch), "--perf-prompt-tokens", str(options.perf_prompt_tokens)] \
        if options.check == "perf" else []
    return [python, str(child_script),
            "--model", str(model_dir),
            "--tp", str(options.tp),
            "--kv-cache-dtype", options.kv_cache_dtype,
            "--cudagraph-mode", options.cudagraph_mode,
            "--max-num-seqs", str(options.max_num_seqs),
            "--max-model-len", str(options.max_model_len),
            "--gpu-memory-utilization", f"{options.gpu_memory_utilization:g}",
            "--attention-backend", options.backend_for(platform),
            "--kv-cache-memory-bytes", str(options.kv_cache_memory_bytes),
            *numerics, *(["--enforce-eager"] if options.enforce_eager else [])]


def build_plan(options: Options, *, platform: str, platform_env: Mapping[str, str], python: str,
               child_script: Path, model_dir: Path, checkout: Path | None, devices: list[str],
               base_env: Mapping[str, str], master_port: int, timeout: float | None,
               load_format: str = "dummy", first_rank: int = 0) -> list[Launch]:
    """One launch per DP rank on platform ("rocm" or "cuda"), each with platform_env on top of base_env
    (the ROCm AITER switches, or CUDA_ENV); rank r sees devices[r*tp:(r+1)*tp] and nothing else.

    checkout None: vLLM is the environment's own (an image's build), nothing is put before PYTHONPATH.
    Each rank sees only its own GPUs, so VLLM_DP_RANK_LOCAL is 0 everywhere: vLLM offsets device
    indices by local rank * world size, which must stay inside the rank's own subset. The subset is
    given as physical ids in CUDA_VISIBLE_DEVICES, on ROCm also HIP_VISIBLE_DEVICES (vLLM maps
    CUDA_VISIBLE_DEVICES to amdsmi's physical devices); ROCR_VISIBLE_DEVICES is dropped, since HIP
    would index into what it leaves. Switches of the other platform in base_env are dropped too.
    first_rank numbers the launches (the reference run of check=numerics follows the run under test).
    """
    if len(devices) < options.gpus:
        raise ValueError(f"{options.gpus} GPUs needed, {len(devices)} given")
    argv = child_argv(python, child_script, model_dir, options, platform, load_format)
    pythonpath = os.pathsep.join(filter(None, [str(checkout) if checkout else None, base_env.get("PYTHONPATH")]))
    common = {key: value for key, value in base_env.items()
              if key not in DP_VARS and key != "ROCR_VISIBLE_DEVICES"
              and not (platform == "cuda" and key.startswith(("VLLM_ROCM_USE_AITER", "HIP_VISIBLE")))}
    common.update(platform_env, **({"PYTHONPATH": pythonpath} if pythonpath else {}))
    launches = []
    for rank in range(options.dp):
        visible = ",".join(devices[rank * options.tp:(rank + 1) * options.tp])
        env = {**common, **{var: visible for var in DEVICE_VARS[platform]}}
        if options.dp > 1:
            env.update(VLLM_DP_RANK=str(rank), VLLM_DP_RANK_LOCAL="0", VLLM_DP_SIZE=str(options.dp),
                       VLLM_DP_MASTER_IP="127.0.0.1", VLLM_DP_MASTER_PORT=str(master_port))
        launches.append(Launch(first_rank + rank, list(argv), env, timeout or DEFAULT_TIMEOUT))
    return launches
