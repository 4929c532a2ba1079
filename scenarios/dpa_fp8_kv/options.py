"""The scenario's options, parsed and validated once."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Mapping

from bisector.errors import ScenarioError

# The reported fault came at decode graph 47 of 51: vLLM captures 51 decode sizes (1, 2, 4, 8..248 by 8,
# 256..512 by 16) when max_num_seqs is 512, 35 when it is 256. The KV cache is bounded so that a step
# does not depend on how much GPU memory happens to be free (and starts faster); 1 GiB holds about
# 1.8M FP8 MLA tokens for the one-layer model, far more than the decode step needs.
OPTION_DEFAULTS = {
    "platform": "auto",
    "attention_backend": "",  # empty: ROCM_AITER_MLA on ROCm, TRITON_MLA on CUDA
    "dp": "1",
    "tp": "1",
    "heads": "128",
    "layers": "1",
    "kv_cache_dtype": "fp8",
    "cudagraph_mode": "FULL_DECODE_ONLY",
    "max_num_seqs": "512",
    "max_model_len": "1024",
    "gpu_memory_utilization": "0.5",
    "kv_cache_memory_bytes": "1G",
    "check": "crash",  # crash: a GPU fault is bad | numerics: also compare the decode with a reference run
    # | perf: measure decode tok/s and time to first token (run --metric; scenarios/dpa_fp8_kv/perf.py)
    "reference": "",  # numerics: a backend, eager or bf16_kv; empty: another MLA backend (REFERENCE_BACKENDS)
    "numerics_tokens": "4",  # greedy tokens per prompt under check=numerics
    "numerics_topk": "20",  # logprobs per position compared
    # Bounds below which the pair disagrees, from the noisiest clean default pair on the H200 (TRITON_MLA
    # against FLASHMLA on 0.24.0: 0.883 / 0.955) by calibrate's rule; `scenario calibrate` learns others.
    "min_token_agreement": "0.75",
    "min_topk_overlap": "0.9",
    "compile_cache": "on",  # off: a private, empty vLLM/Triton/Inductor cache per step
    "perf_repeats": "5",  # check=perf: measurements inside one engine start (the run reports their medians)
    "perf_tokens": "64",  # check=perf: decode steps timed per measurement
    "perf_batch": "32",  # check=perf: sequences decoded together
    # check=perf: prompt n holds perf_prompt_tokens + n tokens; long prompts make each decode step read a long
    # KV cache, a GPU-bound step (with more layers) where the tiny model's short decode is CPU-bound
    "perf_prompt_tokens": "8",
    # A level inside AITER (run --follow-pins): vLLM held at this commit of this repository, the repository
    # bisected being AITER (each step's AITER commit installed by the world, bisector.world.world.for_level).
    "vllm_repo": "",
    "vllm_ref": "",
}
MAX_LAYERS = 64  # the last layer is the MoE one, the others dense (config.deepseek_v3_config)
PLATFORMS = ("auto", "rocm", "cuda")
DEFAULT_BACKENDS = {"rocm": "ROCM_AITER_MLA", "cuda": "TRITON_MLA"}
KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2", "auto", "bfloat16")
CUDAGRAPH_MODES = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "FULL")
CHECKS = ("crash", "numerics", "perf")
# check=numerics without --option reference: the backend compared with the one under test.
REFERENCE_BACKENDS = {"TRITON_MLA": {"cuda": "FLASHMLA", "rocm": "ROCM_AITER_MLA"}}
DEFAULT_REFERENCE = "TRITON_MLA"  # for any other backend under test
REFERENCE_MODES = ("eager", "bf16_kv")  # the backend under test itself, without graphs / with a BF16 KV cache


@dataclass(frozen=True)
class Options:
    """heads is the model's attention-head count; each TP rank holds heads // tp of them."""

    platform: str  # auto | rocm | cuda, as asked
    attention_backend: str  # as asked; empty means the platform's default (backend_for)
    dp: int
    tp: int
    heads: int
    layers: int
    kv_cache_dtype: str
    cudagraph_mode: str
    max_num_seqs: int
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int
    check: str = "crash"
    reference: str = ""
    numerics_tokens: int = 4
    numerics_topk: int = 20
    min_token_agreement: float = 0.75
    min_topk_overlap: float = 0.9
    compile_cache: bool = True
    perf_repeats: int = 5
    perf_tokens: int = 64
    perf_batch: int = 32
    perf_prompt_tokens: int = 8
    enforce_eager: bool = False  # never an option: the eager reference run sets it

    def backend_for(self, platform: str) -> str:
        """The attention backend a run on platform ("rocm" or "cuda") asks vLLM for."""
        return self.attention_backend or DEFAULT_BACKENDS[platform]

    def reference_for(self, platform: str) -> tuple["Options", str]:
        """The reference run's options under check=numerics on platform, and its name in reports."""
        backend = self.backend_for(platform)
        if self.reference == "eager":
            return replace(self, enforce_eager=True), f"{backend} eager"
        if self.reference == "bf16_kv":
            return replace(self, kv_cache_dtype="auto"), f"{backend} with a BF16 KV cache"
        other = self.reference or REFERENCE_BACKENDS.get(backend, {}).get(platform, DEFAULT_REFERENCE)
        return replace(self, attention_backend=other), other

    def within_share(self, share: float) -> "Options":
        """The options of an engine on a slot that shares its GPUs (bisector.machine.gpus.SHARE_ENV): vLLM's memory
        fraction and the KV cache's bytes scaled by the slot's share, so that the slots' engines together
        take what one engine would, and none starves another; share 1 leaves them as they are."""
        if share >= 1:
            return self
        return replace(self, gpu_memory_utilization=self.gpu_memory_utilization * share,
                       kv_cache_memory_bytes=int(self.kv_cache_memory_bytes * share))

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.tp

    @property
    def gpus(self) -> int:
        return self.dp * self.tp


def warm_key(options: Options, platform: str, python: str) -> str:
    """The engine configuration a first start warms the compile cache for (compile_cache.first_start): the
    options as asked (a slot's share aside), the platform and the interpreter; not the commit, since the
    slots of a round test different ones and vLLM's own cache keys tell their compiles apart."""
    return hashlib.sha256(repr((options, platform, python)).encode()).hexdigest()[:16]


def parse_options(raw: Mapping[str, str]) -> Options:
    """Options from KEY=VALUE strings; ScenarioError names the first bad one."""
    backend = raw["attention_backend"]
    if backend and not backend.replace("_", "").isalnum():
        raise ScenarioError(f"option attention_backend={backend!r}: not a backend name (e.g. TRITON_MLA)")
    options = Options(
        platform=_choice(raw, "platform", PLATFORMS),
        attention_backend=backend.upper(),
        dp=_int(raw, "dp", 1),
        tp=_int(raw, "tp", 1),
        heads=_int(raw, "heads", 1),
        layers=_int(raw, "layers", 1),
        kv_cache_dtype=_choice(raw, "kv_cache_dtype", KV_CACHE_DTYPES),
        cudagraph_mode=_choice(raw, "cudagraph_mode", CUDAGRAPH_MODES),
        max_num_seqs=_int(raw, "max_num_seqs", 1),
        max_model_len=_int(raw, "max_model_len", 64),
        gpu_memory_utilization=_fraction(raw, "gpu_memory_utilization"),
        kv_cache_memory_bytes=_size(raw, "kv_cache_memory_bytes"),
        check=_choice(raw, "check", CHECKS),
        reference=_reference(raw["reference"]),
        numerics_tokens=_int(raw, "numerics_tokens", 1),
        numerics_topk=_int(raw, "numerics_topk", 1),
        min_token_agreement=_fraction(raw, "min_token_agreement", zero=True),
        min_topk_overlap=_fraction(raw, "min_topk_overlap", zero=True),
        compile_cache=_choice(raw, "compile_cache", ("on", "off")) == "on",
        perf_repeats=_int(raw, "perf_repeats", 1),
        perf_tokens=_int(raw, "perf_tokens", 1),
        perf_batch=_int(raw, "perf_batch", 1),
        perf_prompt_tokens=_int(raw, "perf_prompt_tokens", 1),
    )
    if options.layers > MAX_LAYERS:
        raise ScenarioError(f"option layers={options.layers}: must be at most {MAX_LAYERS}")
    if options.check == "numerics" and options.dp > 1:
        raise ScenarioError("option check=numerics compares one engine with another: it needs dp=1")
    if options.check == "perf" and options.dp > 1:
        raise ScenarioError("option check=perf measures one engine: it needs dp=1")
    if options.check == "perf" and options.perf_batch > options.max_num_seqs:
        raise ScenarioError(f"option perf_batch={options.perf_batch}: more than max_num_seqs={options.max_num_seqs}")
    # the longest prompt and its longer timed decode
    longest = options.perf_prompt_tokens + options.perf_batch + 2 * options.perf_tokens + 1
    if options.check == "perf" and longest > options.max_model_len:
        raise ScenarioError(f"option perf_tokens={options.perf_tokens} with perf_batch={options.perf_batch} and "
                            f"perf_prompt_tokens={options.perf_prompt_tokens} needs max_model_len >= {longest}")
    if options.reference and options.check != "numerics":
        raise ScenarioError("option reference is for check=numerics")
    if options.heads % options.tp:
        raise ScenarioError(f"option heads={options.heads} is not divisible by tp={options.tp}")
    return options


def _int(raw: Mapping[str, str], key: str, minimum: int) -> int:
    try:
        value = int(raw[key])
    except ValueError:
        raise ScenarioError(f"option {key}={raw[key]!r}: not an integer") from None
    if value < minimum:
        raise ScenarioError(f"option {key}={value}: must be at least {minimum}")
    return value


def _choice(raw: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str:
    if raw[key] not in choices:
        raise ScenarioError(f"option {key}={raw[key]!r}: must be one of {', '.join(choices)}")
    return raw[key]


def _fraction(raw: Mapping[str, str], key: str, zero: bool = False) -> float:
    try:
        value = float(raw[key])
    except ValueError:
        raise ScenarioError(f"option {key}={raw[key]!r}: not a number") from None
    if not (0 <= value if zero else 0 < value) or value > 1:
        raise ScenarioError(f"option {key}={value}: must be in {'[' if zero else '('}0, 1]")
    return value


def _reference(text: str) -> str:
    """eager, bf16_kv, a backend name (upper-cased), or empty."""
    if text.lower() in REFERENCE_MODES:
        return text.lower()
    if text and not text.replace("_", "").isalnum():
        raise ScenarioError(f"option reference={text!r}: not a backend name, eager or bf16_kv")
    return text.upper()


def _size(raw: Mapping[str, str], key: str) -> int:
    """Bytes from '1G', '512M' or a plain number; 0 leaves the KV cache to gpu_memory_utilization."""
    text = raw[key].strip().upper().removesuffix("B").removesuffix("I")
    scale = 1024 ** ("KMGT".index(text[-1]) + 1) if text[-1:] in ("K", "M", "G", "T") else 1
    try:
        value = int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise ScenarioError(f"option {key}={raw[key]!r}: not a size (e.g. 1G, 512M)") from None
    if value < 0:
        raise ScenarioError(f"option {key}={raw[key]!r}: must not be negative")
    return value
