"""Engine child: builds vLLM from the checkout on a tiny DeepSeek-V3, captures graphs, decodes once.

Runs in the user's python with the checkout on PYTHONPATH; stdlib and vllm only. With data parallel,
vLLM itself reads VLLM_DP_* from the environment. Prints READY_MARKER once the engine is built (graphs
captured) and OK_MARKER after the decode step; anything else ends in a traceback or a signal.
"""
import argparse
import dataclasses
import json
import os
import sys

READY_MARKER = "BISECTOR-ENGINE-READY"
OK_MARKER = "BISECTOR-SCENARIO-OK"
MAX_TOKENS = 2  # the prefill's token, then one decode step


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
    return parser.parse_args(argv)


def engine_kwargs(args, engine_fields):
    """LLM(...) keyword arguments; attention_backend and kv_cache_memory_bytes only where this vLLM has
    them (older ROCm ones pick AITER MLA from VLLM_ROCM_USE_AITER, which the launch sets)."""
    kwargs = {
        "model": args.model,
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "kv_cache_dtype": args.kv_cache_dtype,
        "tensor_parallel_size": args.tp,
        "max_num_seqs": args.max_num_seqs,
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "enforce_eager": False,
        "compilation_config": {"cudagraph_mode": args.cudagraph_mode},
        "seed": 0,
    }
    if "attention_backend" in engine_fields:
        kwargs["attention_backend"] = args.attention_backend
    if args.kv_cache_memory_bytes and "kv_cache_memory_bytes" in engine_fields:
        kwargs["kv_cache_memory_bytes"] = args.kv_cache_memory_bytes
    return kwargs


def token_prompts(count, vocab_size):
    """count prompts of distinct lengths, as token ids (there is no tokenizer)."""
    return [{"prompt_token_ids": [(7 * i + j) % (vocab_size - 2) + 2 for j in range(8 + i)]}
            for i in range(count)]


def main(argv):
    args = parse_args(argv)
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    rank = os.environ.get("VLLM_DP_RANK", "0")
    with open(os.path.join(args.model, "config.json")) as f:
        vocab_size = json.load(f)["vocab_size"]
    engine_fields = {field.name for field in dataclasses.fields(EngineArgs)}
    llm = LLM(**engine_kwargs(args, engine_fields))
    print(f"{READY_MARKER} dp_rank={rank}", flush=True)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, detokenize=False)
    outputs = llm.generate(token_prompts(args.max_num_seqs, vocab_size), params, use_tqdm=False)
    tokens = sum(len(output.outputs[0].token_ids) for output in outputs)
    print(f"{OK_MARKER} dp_rank={rank} sequences={len(outputs)} tokens={tokens}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
