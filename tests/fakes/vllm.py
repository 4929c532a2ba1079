"""The one fake vLLM of the GPU scenario's tests, and the fake torch beside it.

fake_vllm(...) gives the files of a `vllm` package (relative path -> text) for a checkout, an image's site dir
or a commit: vllm_package.py as vllm/__init__.py, an EngineArgs with the fields the child asks for, and
the knobs below as vllm/fake_knobs.py. write_files puts such files under a directory.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).with_name("vllm_package.py")
ARG_UTILS = '''from dataclasses import dataclass


@dataclass
class EngineArgs:
    model: str = ""
    attention_backend: str = ""
    kv_cache_memory_bytes: int = 0
'''
# A torch as the environment probe sees it: its metadata and torch/version.py, nothing to import.
ROCM_TORCH_FILES = {
    "torch/__init__.py": "",
    "torch/version.py": "__version__ = '2.9.0+rocm7.0'\nhip: Optional[str] = '7.0.51831'\ncuda = None\n",
    "torch-2.9.0+rocm7.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0+rocm7.0\n",
}
CUDA_TORCH_FILES = {
    "torch/__init__.py": "",
    "torch/version.py": "__version__ = '2.11.0+cu130'\nhip = None\ncuda: Optional[str] = '13.0'\n",
    "torch-2.11.0+cu130.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cu130\n",
}


def fake_vllm(*, selected: str = "INFO Using AttentionBackendEnum.{backend} backend.", stderr: tuple[str, ...] = (),
              fault: str | None = None, backends: tuple[str, ...] | None = None, compiles: bool = False,
              on_start: str | None = None, on_start_args: tuple = (), step_api: bool = True,
              step_seconds: float = 0.0, slowdown: float = 1.0, slowdown_if_aiter: str | None = None,
              spike_every: int = 0, spike_factor: float = 1.0, busy: bool = False, prompt_log: Path | None = None,
              start_pause: float = 0.0) -> dict[str, str]:
    """The fake vLLM package's files. Its engine start prints `selected` ({backend}: the attention backend asked
    for) and then the `stderr` lines; with `fault` it prints that on stderr and aborts (a graph capture fault);
    `backends`: the only backends it accepts (else all); `compiles`: it logs compile-cache lines as vLLM does
    (unless eager); `on_start` ("module:function"): called with on_start_args once the backend line is out.
    Decode: each engine step (and each token of a generate) takes step_seconds, `slowdown` times that (where the
    AITER it imports has the flag `slowdown_if_aiter` true, when named), every spike_every-th step spike_factor
    times as long, spun on the CPU when `busy`; without step_api, LLM has no llm_engine (an older vLLM).
    prompt_log: a file add_request appends each prompt's length to. start_pause: what its import and its engine
    start each sleep."""
    knobs = {"selected": selected, "stderr": list(stderr), "fault": fault,
             "backends": None if backends is None else list(backends), "compiles": compiles, "on_start": on_start,
             "on_start_args": list(on_start_args), "step_api": step_api, "step_seconds": step_seconds,
             "slowdown": slowdown, "slowdown_if_aiter": slowdown_if_aiter, "spike_every": spike_every,
             "spike_factor": spike_factor, "busy": busy, "prompt_log": prompt_log and str(prompt_log),
             "start_pause": start_pause}
    return {"vllm/__init__.py": PACKAGE.read_text(), "vllm/fake_knobs.py": f"KNOBS = {knobs!r}\n",
            "vllm/engine/__init__.py": "", "vllm/engine/arg_utils.py": ARG_UTILS}


def write_files(root: Path, files: dict[str, str]) -> Path:
    """Each file (relative path -> text) written under root; root."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root
