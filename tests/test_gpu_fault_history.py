"""bench/gpu_fault_history.py on real vLLM 0.24.0 source: the commits apply, stay Python-only, break
and fix the import where they say, and plant the split-buffer sizing. (The fault itself needs a GPU:
tests/records/ holds what the H200 run printed.)"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def history(tmp_path_factory, git, vllm_sources):
    tmp = tmp_path_factory.mktemp("history")
    release = tmp / "release"
    subprocess.run(["cp", "-r", str(vllm_sources("0.24.0")), str(release)], check=True)
    git(release, "init", "-q", "-b", "main")
    git(release, "add", "-A")
    git(release, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "v0.24.0")
    git(release, "tag", "v0.24.0")
    out, summary = tmp / "out", tmp / "history.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu_fault_history.py"), "--release-repo",
                           str(release), "--out", str(out), "--json", str(summary)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out, json.loads(summary.read_text())


def show(repo: Path, sha: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"{sha}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def imported_names(source: str, module: str) -> set[str]:
    return {alias.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)
            and node.module == module for alias in node.names}


def defined_names(source: str) -> set[str]:
    return {node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


def test_twelve_python_only_commits_with_their_roles(history, git):
    repo, commits = history
    assert len(commits) == 13 and commits[0]["role"] == "base"
    assert [c["n"] for c in commits if c["role"] == "planted-fault"] == [8]
    assert [c["role"] for c in commits[5:8]] == ["import-break", "import-broken", "import-fix"]
    changed = git(repo, "diff", "--name-only", "v0.24.0", commits[-1]["sha"]).split()
    assert changed and all(path.startswith("vllm/") and path.endswith(".py") for path in changed)


def test_the_import_breaks_at_c5_and_is_fixed_at_c7(history):
    repo, commits = history
    for n in range(13):
        sha = commits[n]["sha"]
        wanted = imported_names(show(repo, sha, "vllm/model_executor/layers/attention/mla_attention.py"),
                                "vllm.utils.math_utils")
        missing = wanted - defined_names(show(repo, sha, "vllm/utils/math_utils.py"))
        assert bool(missing) == (n in (5, 6)), (n, missing)


def test_c8_sizes_the_fp8_split_buffer_with_zero_splits_for_short_sequences(history):
    repo, commits = history
    before = show(repo, commits[7]["sha"], "vllm/v1/attention/backends/mla/triton_mla.py")
    after = show(repo, commits[8]["sha"], "vllm/v1/attention/backends/mla/triton_mla.py")
    assert "buffer_splits" not in before
    assert "num_kv_splits, attn_metadata.max_seq_len // min_work_per_split" in after
    assert "                buffer_splits,\n" in after
    ops = show(repo, commits[8]["sha"], "vllm/v1/attention/ops/triton_decode_attention.py")
    assert "assert attn_logits.shape[2] <= num_kv_splits" in ops
    for n in (8, 12):  # every later commit still compiles
        for path in ("vllm/v1/attention/backends/mla/triton_mla.py",
                     "vllm/v1/attention/ops/triton_decode_attention.py"):
            compile(show(repo, commits[n]["sha"], path), path, "exec")


def test_the_same_release_gives_the_same_shas(history, tmp_path, git):
    repo, commits = history
    again = tmp_path / "again"
    subprocess.run([sys.executable, str(ROOT / "bench/gpu_fault_history.py"), "--release-repo",
                    str(repo.parent / "release"), "--out", str(again)], check=True, capture_output=True)
    assert git(again, "rev-parse", "history") == commits[-1]["sha"]


def test_the_silent_variant_tells_stage_two_half_the_splits_and_stays_python_only(history, tmp_path, git):
    repo, _ = history
    out, summary = tmp_path / "silent", tmp_path / "silent.json"
    subprocess.run([sys.executable, str(ROOT / "bench/gpu_fault_history.py"), "--release-repo",
                    str(repo.parent / "release"), "--out", str(out), "--json", str(summary), "--variant", "silent"],
                   check=True, capture_output=True)
    commits = json.loads(summary.read_text())
    assert [c["role"] for c in commits] == ["base"] + ["harmless"] * 4 + ["silent-bug"] + ["harmless"] * 3
    ops = "vllm/v1/attention/ops/triton_decode_attention.py"
    before, after = show(out, commits[4]["sha"], ops), show(out, commits[5]["sha"], ops)
    grouped = after[after.index("def decode_attention_fwd_grouped("):after.index("def decode_attention_fwd(")]
    assert "merge_splits = max(1, num_kv_splits // 2)" in grouped
    assert "attn_logits, q, o, lse, v_buffer, b_seq_len, merge_splits" in grouped
    normal = after[after.index("def decode_attention_fwd_normal("):after.index("def decode_attention_fwd_grouped(")]
    assert "merge_splits" not in normal and "merge_splits" not in before
    assert "assert num_kv_splits == attn_logits.shape[2]" in after  # the buffer is sized as stage 1 writes it
    for n in (5, 8):
        compile(show(out, commits[n]["sha"], ops), ops, "exec")
    changed = git(out, "diff", "--name-only", "v0.24.0", commits[-1]["sha"]).split()
    assert changed and all(path.startswith("vllm/") and path.endswith(".py") for path in changed)
