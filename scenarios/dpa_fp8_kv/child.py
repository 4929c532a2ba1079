"""Engine child: builds vLLM from the checkout on a tiny DeepSeek-V3, captures graphs, decodes once.

Runs in the user's python with the checkout on PYTHONPATH; stdlib and vllm only. With data parallel,
vLLM itself reads VLLM_DP_* from the environment. Prints READY_MARKER once the engine is built (graphs
captured) and OK_MARKER after the decode step; anything else ends in a traceback or a signal.
With --numerics-tokens N it decodes N greedy tokens per prompt instead and, before OK_MARKER, prints
NUMERICS_MARKER and one JSON object: per prompt the tokens and, per position, the top-k (token, logprob).
With --perf-repeats R it measures instead, R times after one warm-up, and prints PERF_MARKER and a JSON
object per repeat: decode throughput and time to first token (one prompt, one token). The batch of
--perf-batch sequences is driven step by step through the engine (llm.llm_engine.add_request/step), each
step timed: decode tok/s is the batch over the median step time, the prefill's and the warm-up's steps left
out; the median and interquartile range of the step times say how noisy the repeat was, and the CPU time per
step (this process and the engine core), the machine's steal time and the GPU's SM clock (nvidia-smi, read
once while it decodes) what the machine did meanwhile. An engine without step() (older vLLM) is measured as
the difference of two generates --perf-tokens steps apart instead.
With --start-gate PATH it waits, once vLLM is imported, until no other engine start compiles (pass_start_gate).
With --timing-gate PATH (a performance check on a GPU other steps share) it holds that lock shared while its engine
starts (other steps' engines may start beside it, none measures) and alone while it measures (hold_timing_gate):
its measurements run with no other engine starting or measuring on the GPU, while the other steps' imports and
shutdowns go on beside them.
At the end of each of its parts it prints PHASE_MARKER, the part's name and the wall clock (mark_phase): child_start,
import_torch, import (vLLM's own, torch loaded), start_gate, timing_gate, engine, then measure_gate and measure,
or decode.
"""
import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

READY_MARKER = "BISECTOR-ENGINE-READY"
OK_MARKER = "BISECTOR-SCENARIO-OK"
NUMERICS_MARKER = "BISECTOR-NUMERICS"
PERF_MARKER = "BISECTOR-PERF"
PHASE_MARKER = "BISECTOR-PHASE"
MAX_TOKENS = 2  # the prefill's token, then one decode step
UNTIMED_STEPS = 2  # of each timed batch: the prefill's step and one warm-up decode step
CLOCK_AFTER_STEPS = 8  # the GPU's clock is read once this many timed steps have run


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--kv-cache-dtype", required=True)
    parser.add_argument("--cudagraph-mode", required=True)
    parser.add_argument("--max-num-seqs", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--gpu-memory-utilization", type=float, required=True)
    parser.add_argument("--attention-backend", required=True)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=0)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--numerics-tokens", type=int, default=0)
    parser.add_argument("--numerics-topk", type=int, default=20)
    parser.add_argument("--perf-repeats", type=int, default=0)
    parser.add_argument("--perf-tokens", type=int, default=64)
    parser.add_argument("--perf-batch", type=int, default=32)
    parser.add_argument("--perf-prompt-tokens", type=int, default=8)
    parser.add_argument("--start-gate", default="")
    parser.add_argument("--timing-gate", default="")
    return parser.parse_args(argv)


def engine_kwargs(args, engine_fields):
    """LLM(...) keyword arguments; attention_backend and kv_cache_memory_bytes only where this vLLM has
    them (older ROCm ones pick AITER MLA from VLLM_ROCM_USE_AITER, which the launch sets)."""
    kwargs = {
        "model": args.model,
        "load_format": args.load_format,
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "kv_cache_dtype": args.kv_cache_dtype,
        "tensor_parallel_size": args.tp,
        "max_num_seqs": args.max_num_seqs,
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enforce_eager": args.enforce_eager,
        "compilation_config": {"cudagraph_mode": args.cudagraph_mode},
        "seed": 0,
    }
    if "attention_backend" in engine_fields:
        kwargs["attention_backend"] = args.attention_backend
    if args.numerics_tokens and args.numerics_topk > 20 and "max_logprobs" in engine_fields:
        kwargs["max_logprobs"] = args.numerics_topk  # vLLM's default allows 20
    if args.kv_cache_memory_bytes and "kv_cache_memory_bytes" in engine_fields:
        kwargs["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
    return kwargs


def token_prompts(count, vocab_size, shortest=8):
    """count prompts of distinct lengths from `shortest` tokens up, as token ids (there is no tokenizer)."""
    return [{"prompt_token_ids": [(7 * i + j) % (vocab_size - 2) + 2 for j in range(shortest + i)]}
            for i in range(count)]


def numerics_record(outputs, topk):
    """{"sequences": [{"tokens": [...], "top": [[[token, logprob], ...] per position]}]}, in prompt order;
    logprobs rounded to 1e-5, a position's list sorted by logprob, highest first."""
    sequences = []
    for output in outputs:
        completion = output.outputs[0]
        top = []
        for position in completion.logprobs or []:
            ranked = sorted(position.items(), key=lambda item: -item[1].logprob)[:topk]
            top.append([[int(token), round(float(entry.logprob), 5)] for token, entry in ranked])
        sequences.append({"tokens": [int(token) for token in completion.token_ids], "top": top})
    return {"sequences": sequences}


def measure(llm, sampling_params, args, vocab_size):
    """One warm-up, then per repeat {"decode_tok_s", "ttft_ms", how the decode was measured} (prints each as it
    is measured)."""
    batch = token_prompts(args.perf_batch, vocab_size, args.perf_prompt_tokens)
    engine = getattr(llm, "llm_engine", None)
    stepped = all(callable(getattr(engine, name, None)) for name in ("add_request", "step", "has_unfinished_requests"))

    def params(tokens):
        return sampling_params(max_tokens=tokens, temperature=0.0, ignore_eos=True, detokenize=False)

    def timed(prompts, tokens):
        start = time.perf_counter()
        llm.generate(prompts, params(tokens), use_tqdm=False)
        return time.perf_counter() - start

    timed(batch, args.perf_tokens)  # warm-up: the first generate pays for what is lazily set up
    for repeat in range(args.perf_repeats):
        measured = {"repeat": repeat, "ttft_ms": timed(batch[:1], 1) * 1e3}
        if stepped:
            measured.update(stepped_decode(engine, batch, params(args.perf_tokens + 1), f"perf{repeat}-"))
        else:
            measured.update(generates_decode(timed, batch, args.perf_tokens))
        print(f"{PERF_MARKER} " + json.dumps(measured), flush=True)


def stepped_decode(engine, batch, params, prefix):
    """The batch's decode timed step by step: {"method", "steps", "step_ms_median", "step_ms_iqr",
    "step_ms_mean", "decode_tok_s"} (no figures when too few steps were timed), and what else the machine did
    meanwhile (machine_figures). A step's time is the interval between two returns of engine.step(), so
    whatever the engine does between them counts."""
    try:
        from vllm.sampling_params import RequestOutputKind
        params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate has it: an output when a request ends
    except ImportError:
        pass
    for n, prompt in enumerate(batch):
        engine.add_request(f"{prefix}{n}", prompt, params)
    returned = [time.perf_counter()]
    before, clock = None, None
    while engine.has_unfinished_requests():
        engine.step()
        returned.append(time.perf_counter())
        if len(returned) == UNTIMED_STEPS + 1:  # the timed steps start
            before = machine_counters()
        elif len(returned) == UNTIMED_STEPS + CLOCK_AFTER_STEPS + 1:
            clock = SmClockSampler()  # while the GPU decodes, in a thread of its own
    steps = [after - start for start, after in zip(returned, returned[1:])][UNTIMED_STEPS:]
    measured = {"method": "engine-steps", "steps": len(steps)}
    if len(steps) >= 2:
        q1, median, q3 = statistics.quantiles(steps, n=4)
        measured.update(step_ms_median=round(median * 1e3, 4), step_ms_iqr=round((q3 - q1) * 1e3, 4),
                        step_ms_mean=round(statistics.fmean(steps) * 1e3, 4), decode_tok_s=len(batch) / median)
        if before is not None:
            measured.update(machine_figures(before, machine_counters(), len(steps)))
    if clock is not None:
        clock.join(10)
        if clock.mhz is not None:
            measured["sm_clock_mhz"] = clock.mhz
    return measured


def machine_counters():
    """(CPU seconds of this process and its descendants (the engine core), the machine's steal seconds (time
    a VM's CPUs waited for the host), from /proc; None where /proc cannot say."""
    return _tree_cpu_seconds(os.getpid()), _steal_seconds()


def machine_figures(before, after, steps):
    """What the timed steps cost besides wall time: {"cpu_ms_per_step", "steal_ms"} where /proc said. A
    CPU-bound decode whose wall time drifts while its CPU time per step does not is waiting on the machine."""
    figures = {}
    if before[0] is not None and after[0] is not None:
        figures["cpu_ms_per_step"] = round((after[0] - before[0]) * 1e3 / steps, 4)
    if before[1] is not None and after[1] is not None:
        figures["steal_ms"] = round((after[1] - before[1]) * 1e3, 1)
    return figures


def _tree_cpu_seconds(pid):
    """User and system CPU seconds of pid and its live descendants (/proc/PID/task/*/children), or None where
    /proc cannot say (no stat for pid, or a kernel without the children files)."""
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    total, pending, seen = 0.0, [pid], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            with open(f"/proc/{current}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
        except (OSError, ValueError, IndexError):
            if current == pid:
                return None
            continue  # a descendant that ended meanwhile
        pending.extend(_child_pids(current))
    return total


def _child_pids(pid):
    """The children of pid's threads; a thread that ends while they are read has none (not an error)."""
    children: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return children
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            continue
    return children


def _steal_seconds():
    """The machine's steal time so far (/proc/stat's cpu line, 8th value), or None."""
    try:
        with open("/proc/stat") as f:
            values = f.readline().split()
        return int(values[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class SmClockSampler:
    """The first visible NVIDIA GPU's SM clock in MHz, read once by nvidia-smi in a thread (`mhz`: None where
    there is no nvidia-smi or it says nothing usable). A GPU that has clocked down makes a short decode slower."""

    def __init__(self):
        import threading
        self.mhz = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        import subprocess
        device = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        try:
            out = subprocess.run(["nvidia-smi", "-i", device, "--query-gpu=clocks.sm",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10).stdout
            self.mhz = int(out.split()[0])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass

    def join(self, timeout):
        self.thread.join(timeout)


def generates_decode(timed, batch, tokens):
    """The older way, for engines without step(): two generates of the same (prefix-cached) prompts, `tokens`
    decode steps apart; their difference is those steps alone (a 1-token generate is no baseline: on vLLM
    0.24 it can take as long as 65 tokens). Noisy: ±30 % between repeats on the H200."""
    short = timed(batch, tokens + 1)
    long = timed(batch, 2 * tokens + 1)
    measured = {"method": "two-generates"}
    if long > short:  # else no decode figure from this repeat
        measured["decode_tok_s"] = len(batch) * tokens / (long - short)
    return measured


def pass_start_gate(path):
    """Wait while another engine of these settings compiles alone (bisector/machine/compile_cache.py first_start
    holds this lock file exclusively until its compiles are in the cache); at once when nobody holds it."""
    import fcntl
    with open(path, "rb") as gate:
        fcntl.flock(gate, fcntl.LOCK_SH)


def hold_timing_gate(path, alone):
    """Hold the lock file until the returned file is closed: alone (to measure), once no other step on this GPU
    starts an engine or measures; else shared (to start an engine), once none measures. A POSIX record lock:
    the engine processes vLLM forks do not inherit it, so closing the file here releases it while they shut
    down."""
    import fcntl
    gate = open(path, "a+b")
    fcntl.lockf(gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    return gate


def mark_phase(name):
    """The part name of this process ends now (the scenario times its parts from these lines)."""
    print(f"{PHASE_MARKER} {name} {time.time():.6f}", flush=True)


def main(argv):
    mark_phase("child_start")
    args = parse_args(argv)
    import torch  # noqa: F401  (vLLM imports it first thing: timed apart, as on the H200 the imports took 15-22 s)
    mark_phase("import_torch")
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    rank = os.environ.get("VLLM_DP_RANK", "0")
    with open(os.path.join(args.model, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    engine_fields = {field.name for field in dataclasses.fields(EngineArgs)}
    mark_phase("import")
    if args.start_gate:  # vLLM and torch are loaded: wait here, not before the imports
        pass_start_gate(args.start_gate)
        mark_phase("start_gate")
    timing = hold_timing_gate(args.timing_gate, alone=False) if args.timing_gate else None
    if timing:
        mark_phase("timing_gate")
    llm = LLM(**engine_kwargs(args, engine_fields))
    mark_phase("engine")
    print(f"{READY_MARKER} dp_rank={rank}", flush=True)
    if args.perf_repeats:
        if timing:  # let go, then taken alone: two engines waiting to measure never wait on each other
            timing.close()
            timing = hold_timing_gate(args.timing_gate, alone=True)
            mark_phase("measure_gate")
        measure(llm, SamplingParams, args, vocab_size)
        mark_phase("measure")
        if timing:
            timing.close()  # the next step's engine may start while this one shuts down
        print(f"{OK_MARKER} dp_rank={rank} perf_repeats={args.perf_repeats}", flush=True)
        return
    numerics = args.numerics_tokens > 0
    params = SamplingParams(max_tokens=args.numerics_tokens if numerics else MAX_TOKENS, temperature=0.0,
                            ignore_eos=True, detokenize=False, logprobs=args.numerics_topk if numerics else None)
    outputs = llm.generate(token_prompts(args.max_num_seqs, vocab_size), params, use_tqdm=False)
    tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    mark_phase("decode")
    if numerics:
        print(f"{NUMERICS_MARKER} " + json.dumps(numerics_record(outputs, args.numerics_topk),
                                                  separators=(",", ":")), flush=True)
    print(f"{OK_MARKER} dp_rank={rank} sequences={len(outputs)} tokens={tokens}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
