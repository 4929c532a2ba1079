"""The fake vLLM's `vllm/__init__.py`: tests/fakes/vllm.py copies this file into a fake package, beside
the knobs it was given (vllm/fake_knobs.py: a module, as a held vLLM tree keeps only its Python sources). It runs in
a scenario's child process, never in the tests.

Where the GPU scenario depends on vLLM it behaves as the real one does: LLM(**kwargs) checks the backend and
the checkpoint, logs the backend it selected (and its compile-cache lines, keyed like vLLM's by the model path,
under VLLM_CACHE_ROOT), then generate() decodes greedy tokens with top-k logprobs from the prompts (wrongly on
the backend named by $FAKE_BUG or a BUG_<backend> file in the working directory: the planted numerics bug);
llm.llm_engine has vLLM's step API (add_request/has_unfinished_requests/step). Each engine and each generate
is recorded as a JSON line in $FAKE_VLLM_RECORD, when set.
"""
import hashlib
import importlib
import json
import os
import sys
import time

from vllm.fake_knobs import KNOBS

time.sleep(KNOBS["start_pause"])  # a slow import


def _record(entry):
    if "FAKE_VLLM_RECORD" in os.environ:
        with open(os.environ["FAKE_VLLM_RECORD"], "a") as f:
            f.write(json.dumps(entry) + "\n")


def _aiter_says(flag):
    """The flag of the AITER this vLLM imports."""
    return getattr(importlib.import_module("aiter"), flag)


def _spend(seconds):
    """A planted time: slept, or with the busy knob spun on the CPU (as a CPU-bound decode does)."""
    if KNOBS["busy"]:
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    else:
        time.sleep(seconds)


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class Logprob:
    def __init__(self, logprob):
        self.logprob = logprob


class _Completion:
    def __init__(self, tokens, logprobs):
        self.token_ids, self.logprobs = tokens, logprobs


class _Output:
    def __init__(self, completion):
        self.outputs = [completion]


class _Engine:
    """The step API of vLLM's LLMEngine: a step makes one token of every unfinished request, in the planted
    time (every spike_every-th step spike_factor times as long)."""

    def __init__(self, seconds):
        self.seconds, self.remaining, self.steps = seconds, {}, 0

    def add_request(self, request_id, prompt, params):
        if KNOBS["prompt_log"]:
            with open(KNOBS["prompt_log"], "a") as f:
                f.write(f"{len(prompt['prompt_token_ids'])}\n")
        self.remaining[request_id] = params.kwargs["max_tokens"]

    def has_unfinished_requests(self):
        return bool(self.remaining)

    def step(self):
        self.steps += 1
        spike = KNOBS["spike_every"] and self.steps % KNOBS["spike_every"] == 0
        _spend(self.seconds * (KNOBS["spike_factor"] if spike else 1))
        self.remaining = {request: left - 1 for request, left in self.remaining.items() if left > 1}
        return []


class LLM:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
        backend = kwargs.get("attention_backend", "")
        if kwargs["load_format"] == "safetensors" and not os.path.exists(
                os.path.join(kwargs["model"], "model.safetensors")):
            raise ValueError("Following weights were not initialized from checkpoint: {...}")
        if KNOBS["backends"] is not None and backend not in KNOBS["backends"]:
            raise ValueError(f"Invalid attention backend: '{backend}'")
        print(KNOBS["selected"].replace("{backend}", backend), flush=True)
        for line in KNOBS["stderr"]:
            print(line, file=sys.stderr, flush=True)
        if KNOBS["fault"]:  # the graph capture faults
            print(KNOBS["fault"], file=sys.stderr, flush=True)
            os.abort()
        if KNOBS["on_start"]:
            module, function = KNOBS["on_start"].split(":")
            getattr(importlib.import_module(module), function)(*KNOBS["on_start_args"])
        slow = KNOBS["slowdown_if_aiter"] is None or _aiter_says(KNOBS["slowdown_if_aiter"])
        seconds = KNOBS["step_seconds"] * (KNOBS["slowdown"] if slow else 1)
        if KNOBS["step_api"]:
            self.llm_engine = _Engine(seconds)
        self.seconds = seconds
        time.sleep(KNOBS["start_pause"])  # a slow engine start
        if KNOBS["compiles"] and not kwargs["enforce_eager"]:
            self._compile()
        _record({"kwargs": kwargs, "env": {k: v for k, v in os.environ.items()
                                           if k.startswith(("VLLM_", "TRITON_", "TORCHINDUCTOR_"))}})

    def _compile(self):
        key = hashlib.sha256(self.kwargs["model"].encode()).hexdigest()
        path = os.path.join(os.environ["VLLM_CACHE_ROOT"], "torch_compile_cache", "torch_aot_compile", key,
                            "rank_0_0", "model")
        if os.path.exists(path) and os.environ.get("VLLM_DISABLE_COMPILE_CACHE") != "1":
            print(f"INFO [decorators.py:312] Directly load AOT compilation from path {path}")
            seconds = 0.81
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").write("compiled")
            print("INFO [backends.py:393] Compiling a graph for compile range (1, 16384) takes 8.22 s")
            print(f"INFO [decorators.py:708] saved AOT compiled function to {path}")
            seconds = 10.03
        print(f"INFO [monitor.py:53] torch.compile took {seconds:.2f} s in total")
        print(f"INFO [core.py:337] init engine (profile, create kv cache, warmup model) took "
              f"28.33 s (compilation: {seconds:.2f} s)", flush=True)

    def generate(self, prompts, params, use_tqdm=True):
        _record({"prompts": prompts, "params": params.kwargs})
        time.sleep(self.seconds * params.kwargs["max_tokens"])
        backend = self.kwargs.get("attention_backend", "")
        buggy = (os.environ.get("FAKE_BUG") == backend or os.path.exists("BUG_" + backend)) \
            and not self.kwargs["enforce_eager"]
        results = []
        for n, prompt in enumerate(prompts):
            seed = sum(prompt["prompt_token_ids"])
            tokens = [(seed + 31 * t + (7 * t if buggy and t and n % 2 == 0 else 0)) % 4000 + 2
                      for t in range(params.kwargs["max_tokens"])]
            logprobs = None
            if params.kwargs.get("logprobs"):
                logprobs = [{(token + r * (3 if buggy and n % 2 == 0 else 1)) % 4096:
                             Logprob(-1.0 - 0.5 * r) for r in range(params.kwargs["logprobs"])}
                            for token in tokens]
            results.append(_Output(_Completion(tokens, logprobs)))
        return results
