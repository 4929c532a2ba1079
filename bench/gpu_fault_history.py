"""A vLLM history with a real GPU memory fault planted, for bisecting on an NVIDIA GPU.

Twelve Python-only commits on top of real vLLM 0.24.0 source (from ../shared/tools/vllm-release-repo),
so one set of compiled extensions (the 0.24.0 wheel's) serves every commit:

- c1–c4, c6, c9–c12: harmless (comments and docstrings in the files around the MLA decode path);
- c5 breaks an import that every DeepSeek engine start needs (`ImportError: cannot import name
  'next_power_of_2_splits' from 'vllm.utils.math_utils'`), c6 keeps it broken, c7 fixes it: a
  different crash than the planted one, so a bisector that blames any failure names c5;
- c8 plants the fault: Triton MLA sizes its decode split buffer (attn_logits, the partial outputs and
  LSEs of the split-KV stage) from the splits that carry `min_work_per_split` tokens, without the
  max(1, …) the kernel's split count has. For sequences shorter than 512 tokens the buffer has 0
  splits, i.e. no storage (data pointer 0), while the kernel still runs 1 split and stores its partial
  output there: the GPU raises an illegal memory access. Under full CUDA graphs this happens in the
  eager warm-up of the first decode graph (seq_lens are 1 there), with FP8 KV cache only (the sizing
  sits in the quantized-KV branch). The commit also relaxes decode_attention_fwd's assert to
  "buffer splits <= kernel splits", as a change meant to allow smaller buffers would.

--variant silent builds eight commits instead, one of which plants a bug that does not crash:

- s5 tells the decode's stage-2 merge half the split count stage 1 wrote ("the upper half only pads the
  power of 2"). Stage 2 then splits each sequence into half as many, twice as long ranges and merges
  only the first half of stage 1's partial outputs: attention over the first half of the context. Every
  access stays inside the buffer, nothing raises. Only a decode with two or more KV splits shows it:
  full CUDA graphs are captured with max_seq_len = max_model_len (1024 // 512 = 2 splits), eager
  decodes of short sequences use 1 split. The greedy tokens and logprobs change; a crash check sees
  nothing.
- s1–s4, s6–s8: harmless (comments).

--variant perf builds eight commits, one of which plants a slowdown: p5 makes the sampler sleep --pause-us
(300) microseconds per step "to give the output thread the GIL" (outside the CUDA graphs, so each decode step
pays it; tests/records/h200-scripts/perf.sh sizes it from the measured step time); p1–p4, p6–p8 harmless.
With --pause-kind busy the sampler spins through the pause on the CPU instead of sleeping, as a Python
regression does: check=perf's cpu_ms_per_step then shows it too, which a machine that drifts in wall time
(the H200's VM, round 6) may not hide. With --pause-kind gpu the pause is GPU work instead: the sampler
enqueues torch.cuda._sleep for --pause-us at --gpu-clock-mhz (1980, the H200's SM clock) on the decode's stream,
so a GPU-bound decode (check=perf with long prompts, scenarios/dpa_fp8_kv/options.py) is that much slower while
its CPU work is unchanged.

    python bench/gpu_fault_history.py --release-repo /tmp/vllm-024 --out /tmp/history [--json FILE]
                                      [--variant crash|silent|perf [--pause-us N] [--pause-kind sleep|busy|gpu]
                                       [--gpu-clock-mhz MHZ]]

Prints (and with --json writes) the commits with their roles. Commits have fixed authors and dates,
so the same release repo gives the same shas.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TRITON_MLA = "vllm/v1/attention/backends/mla/triton_mla.py"
DECODE_OPS = "vllm/v1/attention/ops/triton_decode_attention.py"
MLA_LAYER = "vllm/model_executor/layers/attention/mla_attention.py"
MATH_UTILS = "vllm/utils/math_utils.py"

HELPER = '''

def next_power_of_2_splits(work: int, min_work_per_split: int) -> int:
    """Split-KV count for `work` tokens: a power of 2, at least 1."""
    return next_power_of_2(max(1, work // min_work_per_split))
'''

# (role, message, [(path, old, new)]): each old text must occur exactly once.
COMMITS = [
    ("harmless", "[Doc] Triton MLA: say where FP8 KV is dequantized", [
        (TRITON_MLA, "        # to FP8 — we handle FP8 KV cache with BF16 queries (Mode 1).\n",
         "        # to FP8 — we handle FP8 KV cache with BF16 queries (Mode 1).\n"
         "        # (The dequantization happens per loaded tile in the stage-1 kernel.)\n")]),
    ("harmless", "[Doc] decode attention: name the two stages", [
        (DECODE_OPS, "def _decode_softmax_reducev_fwd(",
         "# Stage 2: merge the per-split partial outputs with their log-sum-exps.\n"
         "def _decode_softmax_reducev_fwd(")]),
    ("harmless", "[Misc] math utils: document next_power_of_2", [
        (MATH_UTILS, "def next_power_of_2(n: int) -> int:\n",
         "def next_power_of_2(n: int) -> int:\n    # Used for split-KV counts and graph sizes.\n")]),
    ("harmless", "[Doc] Triton MLA: the split count is hardware dependent", [
        (TRITON_MLA, "            # Minimum work per split\n",
         "            # Minimum work per split (tokens per split-KV program)\n")]),
    ("import-break", "[Refactor] MLA: share the split-count helper (import only)", [
        (MLA_LAYER, "import torch\n",
         "import torch\n\nfrom vllm.utils.math_utils import next_power_of_2_splits  # noqa: F401\n")]),
    ("import-broken", "[Doc] MLA layer: comment on query quantization", [
        (MLA_LAYER, "import torch\n", "import torch  # decode queries may be quantized to FP8\n")]),
    ("import-fix", "[Refactor] math utils: add next_power_of_2_splits", [
        (MATH_UTILS, None, HELPER)]),  # no anchor: appended
    ("planted-fault", "[Perf] Triton MLA: size the FP8 split buffer by the splits that carry work", [
        (TRITON_MLA,
         "        # TODO(lucas) Allocate ahead of time\n"
         "        attn_logits = torch.empty(\n"
         "            (\n"
         "                B,\n"
         "                q_num_heads,\n"
         "                num_kv_splits,\n",
         "        # FP8 KV: only splits with at least min_work_per_split tokens produce a\n"
         "        # partial output worth merging, so the buffer holds just those.\n"
         "        buffer_splits = num_kv_splits\n"
         "        if is_quantized_kv_cache(self.kv_cache_dtype) and not envs.VLLM_BATCH_INVARIANT:\n"
         "            buffer_splits = min(\n"
         "                num_kv_splits, attn_metadata.max_seq_len // min_work_per_split\n"
         "            )\n"
         "        attn_logits = torch.empty(\n"
         "            (\n"
         "                B,\n"
         "                q_num_heads,\n"
         "                buffer_splits,\n"),
        (DECODE_OPS, "    assert num_kv_splits == attn_logits.shape[2]\n",
         "    # The buffer may hold fewer splits than the kernel runs (empty splits store nothing).\n"
         "    assert attn_logits.shape[2] <= num_kv_splits\n")]),
    ("harmless", "[Doc] Triton MLA: note on batch invariance", [
        (TRITON_MLA, "        # For batch invariance, use only 1 split to ensure deterministic reduction\n",
         "        # For batch invariance, use only 1 split to ensure deterministic reduction\n"
         "        # (VLLM_BATCH_INVARIANT=1)\n")]),
    ("harmless", "[Doc] decode attention: stage 1 comment", [
        (DECODE_OPS, "def _decode_grouped_att_m_fwd(",
         "# Stage 1 (grouped heads): one program per (batch, head block, split).\n"
         "def _decode_grouped_att_m_fwd(")]),
    ("harmless", "[Doc] Triton MLA: page size comment", [
        (TRITON_MLA, "        PAGE_SIZE = kv_c_and_k_pe_cache.size(1)\n",
         "        PAGE_SIZE = kv_c_and_k_pe_cache.size(1)  # tokens per KV block\n")]),
    ("harmless", "[Misc] MLA layer: trailing comment", [
        (MLA_LAYER, "import torch  # decode queries may be quantized to FP8\n",
         "import torch  # decode queries may be quantized to FP8 (see forward_impl)\n")]),
]

SILENT_BUG = ("silent-bug", "[Perf] decode attention: merge only the splits that carry work", [
    (DECODE_OPS,
     "        is_mla=is_mla,\n"
     "    )\n"
     "    _decode_softmax_reducev_fwd(\n"
     "        attn_logits, q, o, lse, v_buffer, b_seq_len, num_kv_splits\n"
     "    )\n",
     "        is_mla=is_mla,\n"
     "    )\n"
     "    # num_kv_splits is rounded up to a power of 2: the upper half of the splits\n"
     "    # only pads it, so the merge reads the lower half.\n"
     "    merge_splits = max(1, num_kv_splits // 2)\n"
     "    _decode_softmax_reducev_fwd(\n"
     "        attn_logits, q, o, lse, v_buffer, b_seq_len, merge_splits\n"
     "    )\n")])
SILENT_COMMITS = [*COMMITS[:4], SILENT_BUG, *COMMITS[8:11]]  # the crash history's harmless edits
VARIANTS = {"crash": COMMITS, "silent": SILENT_COMMITS}
SAMPLER = "vllm/v1/sample/sampler.py"


def perf_commits(pause_us: int, kind: str = "sleep", gpu_clock_mhz: int = 1980) -> list:
    """--variant perf: the silent history's harmless edits around a planted slowdown (p5): the sampler pauses
    pause_us microseconds each step, asleep (kind "sleep": wall time only), spinning on the CPU (kind
    "busy": CPU time too, as a Python regression costs) or spinning on the GPU (kind "gpu": a kernel of
    pause_us at gpu_clock_mhz on the decode's stream, GPU time only). Sampling runs outside the CUDA graphs,
    so every decode step pays it."""
    seconds = pause_us / 1e6
    pause = {"sleep": f"        time.sleep({seconds!r})\n",
             "busy": f"        until = time.perf_counter() + {seconds!r}\n"
                     "        while time.perf_counter() < until:\n"
                     "            pass\n",
             "gpu": f"        torch.cuda._sleep({pause_us * gpu_clock_mhz})\n"}[kind]
    slowdown = ("perf-slowdown", "[Core] sampler: let the output thread run before the next step", [
        (SAMPLER, "import torch\nimport torch.nn as nn\n", "import time\n\nimport torch\nimport torch.nn as nn\n"),
        (SAMPLER, "        sampled, processed_logprobs = self.sample(logits, sampling_metadata)\n",
         "        sampled, processed_logprobs = self.sample(logits, sampling_metadata)\n"
         "        # Give the output-processing thread the GIL before the next step is scheduled.\n" + pause)])
    return [*COMMITS[:4], slowdown, *COMMITS[8:11]]


def git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def apply(repo: Path, path: str, old: str, new: str) -> None:
    target = repo / path
    text = target.read_text()
    if text.count(old) != 1:
        raise SystemExit(f"gpu_fault_history: {path}: anchor found {text.count(old)} times: {old[:60]!r}")
    target.write_text(text.replace(old, new))


def build(release_repo: Path, out: Path, base: str, planned: list = COMMITS) -> list[dict]:
    if out.exists():
        raise SystemExit(f"gpu_fault_history: {out} exists")
    subprocess.run(["git", "clone", "--quiet", str(release_repo), str(out)], check=True)
    git(out, "checkout", "--quiet", "-b", "history", base)
    commits = [{"n": 0, "sha": git(out, "rev-parse", "HEAD"), "role": "base", "message": base}]
    for n, (role, message, edits) in enumerate(planned, 1):
        for path, old, new in edits:
            if old is None:
                (out / path).write_text((out / path).read_text().rstrip("\n") + "\n" + new)
            else:
                apply(out, path, old, new)
            git(out, "add", path)
        date = f"2026-06-{n:02d}T12:00:00+00:00"
        env = {**os.environ, "GIT_AUTHOR_NAME": "history", "GIT_AUTHOR_EMAIL": "history@example.com",
               "GIT_COMMITTER_NAME": "history", "GIT_COMMITTER_EMAIL": "history@example.com",
               "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        git(out, "commit", "--quiet", "-m", message, env=env)
        commits.append({"n": n, "sha": git(out, "rev-parse", "HEAD"), "role": role, "message": message})
    changed = git(out, "diff", "--name-only", f"{base}..history").split()
    native = [path for path in changed if not path.startswith("vllm/") or not path.endswith(".py")]
    if native:
        raise SystemExit(f"gpu_fault_history: not Python-only: {native}")
    return commits


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--release-repo", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--base", default="v0.24.0")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--variant", choices=sorted([*VARIANTS, "perf"]), default="crash")
    parser.add_argument("--pause-us", type=int, default=300, help="--variant perf: the planted pause per step")
    parser.add_argument("--pause-kind", choices=("sleep", "busy", "gpu"), default="sleep",
                        help="--variant perf: the pause asleep (wall time only), spinning on the CPU or on the GPU")
    parser.add_argument("--gpu-clock-mhz", type=int, default=1980,
                        help="--pause-kind gpu: the SM clock that turns --pause-us into GPU cycles")
    args = parser.parse_args(argv)
    planned = (perf_commits(args.pause_us, args.pause_kind, args.gpu_clock_mhz) if args.variant == "perf"
               else VARIANTS[args.variant])
    commits = build(args.release_repo, args.out, args.base, planned)
    for commit in commits:
        print(f"c{commit['n']:<2} {commit['sha'][:12]} {commit['role']:<14} {commit['message']}")
    if args.json:
        args.json.write_text(json.dumps(commits, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
