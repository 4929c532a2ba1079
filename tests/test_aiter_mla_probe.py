"""aiter-mla-probe on small demo trees: tile rule, options, loader, verdicts and the demo repo."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import scenarios
from bisector.errors import ScenarioError
from bisector.process import Cancelled
from scenarios.aiter_mla_probe import AiterMLAProbe
from scenarios.aiter_mla_probe.contract import ProbeConfig, judge, metadata_info, qo_tiles_per_batch
from scenarios.aiter_mla_probe.demo import make_demo_repo, write_tree
from scenarios.aiter_mla_probe.loader import Placeholder, make_permissive
from scenarios.base import StepContext, Verdict

pytestmark = pytest.mark.integration

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="torch not installed; pip install 'bisector[probe]'")


def run_probe(checkout: Path, tmp_path: Path, python: str = sys.executable, **options: str):
    ctx = StepContext(checkout=checkout, log_path=tmp_path / "probe.log", python=python)
    return AiterMLAProbe(options).run(ctx)


def demo_tree(tmp_path: Path, state: str, **kwargs) -> Path:
    root = tmp_path / state
    write_tree(root, state, **kwargs)
    return root


# --- the tile rule (shared/README.md) ---

@pytest.mark.parametrize("arch, heads, qo_len, q, kv, tiles", [
    ("gfx942", 128, 1, "fp8", "fp8", 1),    # DP attention, fp8 Q: 128-row tiles
    ("gfx942", 128, 1, "bf16", "fp8", 8),   # the bug: sized for bf16 Q
    ("gfx942", 128, 1, "bf16", "bf16", 8),
    ("gfx942", 16, 1, "bf16", "fp8", 1),    # TP8: dtype-blind
    ("gfx942", 16, 1, "fp8", "fp8", 1),
    ("gfx942", 64, 1, "fp8", "fp8", 4),
    ("gfx942", 32, 4, "fp8", "fp8", 8),
    ("gfx950", 128, 1, "fp8", "fp8", 1),
    ("gfx950", 64, 1, "fp8", "fp8", 1),
    ("gfx950", 128, 1, "bf16", "fp8", 8),
    ("gfx950", 32, 4, "fp8", "fp8", 1),
    ("gfx950", 32, 1, "fp8", "fp8", 2),
    ("gfx950", 128, 1, "bf16", "bf16", 1),  # 128 | qo_len*heads
    ("gfx950", 64, 1, "bf16", "bf16", 4),
])
def test_qo_tiles_per_batch(arch, heads, qo_len, q, kv, tiles):
    assert qo_tiles_per_batch(arch, heads, qo_len, q, kv) == tiles


def test_metadata_info_fast_mode_shapes():
    info = metadata_info("gfx942", cu_num=304, batch_size=16, qo_len=1, heads=128, q_dtype="bf16",
                         kv_dtype="fp8")
    tiles = 8
    assert info == (((2,), "uint64"), ((305,), "int32"), (((16 + 303) * tiles, 8), "int32"),
                    ((16 * tiles + 1,), "int32"), ((16 * tiles, 2), "int32"),
                    ((min(16 + 303, 303 * 2) * tiles,), "int32"))


def test_metadata_info_without_fast_mode():
    info = metadata_info("gfx942", cu_num=4, batch_size=2, qo_len=1, heads=128, q_dtype="fp8",
                         kv_dtype="fp8", fast_mode=False)
    assert info[2] == ((8, 8), "int32") and info[5] == ((8,), "int32")


def test_judge_names_dtypes_heads_and_tiles():
    call = {"num_head_qo": 128, "max_seqlen_qo": 1, "batch_size": 16, "is_sparse": False}
    names = {"sized_q_dtype": "bf16", "kernel_q_dtype": "fp8", "kv_dtype": "fp8"}
    sized = metadata_info("gfx942", 304, 16, 1, 128, "bf16", "fp8")
    kernel = metadata_info("gfx942", 304, 16, 1, 128, "fp8", "fp8")
    result = judge(ProbeConfig(), call, names, False, sized, kernel)
    assert result.verdict == "bad"
    for text in ("bf16", "fp8", "128 heads", "8 tiles per batch", "1 tile per batch"):
        assert text in result.reason
    assert result.details["sized_tiles_per_batch"] == 8 and result.details["kernel_tiles_per_batch"] == 1


def test_judge_same_metadata_for_different_dtypes_is_good():
    call = {"num_head_qo": 16, "max_seqlen_qo": 1, "batch_size": 16, "is_sparse": False}
    names = {"sized_q_dtype": "bf16", "kernel_q_dtype": "fp8", "kv_dtype": "fp8"}
    sized = metadata_info("gfx942", 304, 16, 1, 16, "bf16", "fp8")
    kernel = metadata_info("gfx942", 304, 16, 1, 16, "fp8", "fp8")
    result = judge(ProbeConfig(), call, names, False, sized, kernel)
    assert result.verdict == "good" and result.reason.startswith("q dtype mismatch without effect")
    assert result.details["masked"] == ("hand-written AITER tile rule sizes q bf16 and fp8 alike at 16 heads, "
                                        "gfx942")
    consistent = {**names, "sized_q_dtype": "fp8"}  # no mismatch: nothing is hidden
    assert "masked" not in judge(ProbeConfig(), call, consistent, True, kernel, kernel).details


# --- options ---

def test_option_defaults():
    assert AiterMLAProbe().config == ProbeConfig(heads=128, kv_cache_dtype="fp8", arch="gfx942",
                                                 cu_num=304, max_num_seqs=16)
    assert AiterMLAProbe({"arch": "gfx950"}).config.cu_num == 256
    assert AiterMLAProbe({"arch": "gfx950", "cu_num": "80"}).config.cu_num == 80


@pytest.mark.parametrize("options, message", [
    ({"heads": "many"}, "heads='many'"),
    ({"heads": "12"}, "multiple of 8"),
    ({"heads": "-8"}, "positive integer"),
    ({"arch": "gfx90a"}, "gfx942, gfx950"),
    ({"kv_cache_dtype": "int4"}, "kv_cache_dtype='int4'"),
    ({"max_num_seqs": "0"}, "max_num_seqs"),
    ({"tp": "8"}, "no option 'tp'"),
])
def test_bad_options_are_usage_errors(options, message):
    with pytest.raises(ScenarioError, match=message):
        AiterMLAProbe(options)


def test_registered():
    assert scenarios.available()["aiter-mla-probe"] is AiterMLAProbe
    assert not AiterMLAProbe.needs_build


# --- the loader's placeholders ---

def test_placeholders_are_permissive():
    module = types.ModuleType("stub")
    make_permissive(module)
    base, decorator = module.Base, module.register

    class Real(base[int]):
        pass

    @decorator
    def function():
        return 1

    assert function() == 1 and issubclass(Real, Placeholder)
    value = module.anything()
    assert not value and list(value) == [] and isinstance(value.deep.attribute(), Placeholder)
    assert module.Base is base


# --- verdicts on demo trees ---

@needs_torch
def test_buggy_tree_is_bad(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "buggy"), tmp_path)
    assert outcome.verdict is Verdict.BAD
    assert "sized for q bf16 (8 tiles per batch)" in outcome.reason
    assert "kernel gets q fp8 (1 tile per batch)" in outcome.reason and "128 heads" in outcome.reason
    assert outcome.details["calls"][0]["num_head_qo"] == 128
    assert "PROBE-RESULT" in Path(outcome.log_path).read_text()


@needs_torch
@pytest.mark.parametrize("state", ["fixed", "rewritten"])
def test_fixed_trees_are_consistent(tmp_path, state):
    outcome = run_probe(demo_tree(tmp_path, state), tmp_path)
    assert outcome.verdict is Verdict.GOOD and outcome.reason.startswith("consistent: ")


@needs_torch
def test_tp8_heads_hide_the_mismatch(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "buggy"), tmp_path, heads="16")
    assert outcome.verdict is Verdict.GOOD
    assert outcome.reason.startswith("q dtype mismatch without effect") and "16 heads" in outcome.reason


@needs_torch
def test_gfx950_buggy_tree_is_bad(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "buggy"), tmp_path, arch="gfx950")
    assert outcome.verdict is Verdict.BAD and "gfx950" in outcome.reason


@needs_torch
def test_bf16_kv_cache_is_consistent(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "buggy"), tmp_path, kv_cache_dtype="auto")
    assert outcome.verdict is Verdict.GOOD and "q bf16, the decode kernel gets q bf16" in outcome.reason


@needs_torch
def test_impl_without_query_quantization_keeps_bf16(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "buggy", impl_quantizes_query=False), tmp_path)
    assert outcome.verdict is Verdict.GOOD and outcome.details["quant_query_input"] is False
    assert outcome.details["quant_query_input_source"] == (
        "vllm/model_executor/layers/attention/mla_attention.py:34: "
        "fp8_attention and self.impl.supports_quant_query_input")


def test_absent_code_path_is_good(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "absent"), tmp_path)
    assert outcome.verdict is Verdict.GOOD and outcome.reason.startswith("code path absent")


@needs_torch
def test_unloadable_module_is_skipped_with_the_exception(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "unloadable"), tmp_path)
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason.startswith("cannot load vllm/v1/attention/backends/mla/rocm_aiter_mla.py: SyntaxError")


def rewrite_target(tree: Path, old: str, new: str) -> None:
    target = tree / "vllm/v1/attention/backends/mla/rocm_aiter_mla.py"
    source = target.read_text()
    assert source.count(old) == 1
    target.write_text(source.replace(old, new))


FIXED_LINE = "            q_dtype = dtypes.fp8\n"


@needs_torch
@pytest.mark.parametrize("replacement, verdict, reason", [
    ("            q_dtype = vllm_config.model_config.no_such_attribute\n", Verdict.SKIP,
     "get_mla_metadata_info_v1 got q_dtype=<placeholder vllm_config.model_config.no_such_attribute>"),
    ("            if vllm_config.model_config.no_such_flag:\n                q_dtype = dtypes.fp8\n", Verdict.SKIP,
     "the builder branched on vllm_config.model_config.no_such_flag"),
    ("            q_dtype = \"fp8\"\n", Verdict.SKIP, "get_mla_metadata_info_v1 got q_dtype='fp8', not a torch.dtype"),
    ("            from vllm.platforms import current_platform\n"
     "            if current_platform.supports_fp8():\n                q_dtype = dtypes.fp8\n", Verdict.GOOD,
     "consistent"),
])
def test_fix_variants_fail_closed(tmp_path, replacement, verdict, reason):
    tree = demo_tree(tmp_path, "fixed")
    rewrite_target(tree, FIXED_LINE, replacement)
    outcome = run_probe(tree, tmp_path)
    assert (outcome.verdict, outcome.reason[:len(reason)]) == (verdict, reason), outcome.reason


@needs_torch
def test_platform_is_the_checkouts_own(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "fixed"), tmp_path, arch="gfx950")
    assert outcome.details["platform"].startswith("the checkout's vllm.platforms.rocm.RocmPlatform")
    assert outcome.details["calls"][0]["q_dtype"] == "torch.float8_e4m3fn"  # OCP fp8 on gfx950
    outcome = run_probe(demo_tree(tmp_path / "942", "fixed"), tmp_path)
    assert outcome.details["calls"][0]["q_dtype"] == "torch.float8_e4m3fnuz"


@needs_torch
def test_unloadable_platform_falls_back_to_the_stand_in(tmp_path):
    tree = demo_tree(tmp_path, "buggy")
    (tree / "vllm/platforms/rocm.py").write_text("raise ImportError('no amdsmi')\n")
    outcome = run_probe(tree, tmp_path)
    assert outcome.verdict is Verdict.BAD
    assert outcome.details["platform"] == "hand-written stand-in (vllm/platforms/rocm.py defines no loadable " \
                                          "RocmPlatform)"
    assert outcome.details["modules_failed"]["vllm.platforms.rocm"] == "ImportError: no amdsmi"


@needs_torch
def test_query_flag_from_an_unknown_value_is_skipped(tmp_path):
    tree = demo_tree(tmp_path, "buggy")
    rewrite_target(tree, "        pass\n",
                   "        self.supports_quant_query_input = mla_args['kv_b_proj'].quantized\n")
    outcome = run_probe(tree, tmp_path)
    assert outcome.verdict is Verdict.SKIP
    assert "depends on kv_b_proj.quantized" in outcome.reason and "query decision" in outcome.reason


@needs_torch
def test_failed_module_on_the_sizing_path_is_skipped(tmp_path):
    tree = demo_tree(tmp_path, "buggy")
    common = tree / "vllm/model_executor/layers/attention/mla_attention.py"
    common.write_text(common.read_text() + "\nraise RuntimeError('late failure')\n")
    outcome = run_probe(tree, tmp_path)
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == ("vllm.model_executor.layers.attention.mla_attention failed to load "
                              "(RuntimeError: late failure) and lies on the sizing path")


def test_timeout_is_a_skip_like_the_command_scenario(tmp_path):
    python = tmp_path / "slow-python"
    python.write_text("#!/bin/sh\nexec sleep 30\n")
    python.chmod(0o755)
    ctx = StepContext(checkout=demo_tree(tmp_path, "buggy"), log_path=tmp_path / "probe.log", python=str(python),
                      timeout=0.5)
    outcome = AiterMLAProbe().run(ctx)
    assert (outcome.verdict, outcome.reason, outcome.details, outcome.timed_out) == \
        (Verdict.SKIP, "timed out after 0.5s", {}, True)


def test_cancel_stops_the_child(tmp_path, pid_alive, wait_for):
    python = tmp_path / "slow-python"
    pid_file = tmp_path / "pid"
    python.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    python.chmod(0o755)
    cancel = threading.Event()
    ctx = StepContext(checkout=demo_tree(tmp_path, "buggy"), log_path=tmp_path / "probe.log", python=str(python),
                      cancel=cancel)

    def cancel_once_the_child_runs():
        wait_for(lambda: pid_file.exists() and pid_file.read_text().endswith("\n"))
        cancel.set()

    threading.Thread(target=cancel_once_the_child_runs, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        AiterMLAProbe().run(ctx)
    assert time.monotonic() - started < 300  # far less than the child's 600 s
    child = int(pid_file.read_text())
    assert wait_for(lambda: not pid_alive(child))  # killed: it dies as soon as the kernel runs it


@needs_torch
def test_child_log_has_no_runpy_warning(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "absent"), tmp_path)
    log = Path(outcome.log_path).read_text()
    assert "RuntimeWarning" not in log and log.startswith("PROBE-RESULT")


def test_missing_torch_is_skipped(tmp_path):
    python = tmp_path / "python-without-torch"
    python.write_text(f"#!{sys.executable}\n"
                      "import runpy, sys\n"
                      "sys.modules['torch'] = None  # import torch fails\n"
                      "sys.argv = sys.argv[2:]\n"
                      "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")
    python.chmod(0o755)
    outcome = run_probe(demo_tree(tmp_path, "buggy"), tmp_path, python=str(python))
    assert outcome.verdict is Verdict.SKIP
    assert outcome.reason == f"torch not installed in {sys.executable}; pip install 'bisector[probe]'"


def test_probe_that_cannot_start_is_skipped(tmp_path):
    outcome = run_probe(demo_tree(tmp_path, "buggy"), tmp_path, python=str(tmp_path / "no-python"))
    assert outcome.verdict is Verdict.SKIP and outcome.reason.startswith("cannot start")


# --- the demo repository ---

@needs_torch
def test_demo_repo_culprit_is_first_bad(tmp_path):
    repo = tmp_path / "demo"
    good, bad, culprit = make_demo_repo(repo, commits=12, culprit_index=7)
    log = subprocess.run(["git", "-C", str(repo), "rev-list", "--reverse", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.split()
    assert (log[0], log[-1], log[7]) == (good, bad, culprit) and len(log) == 12
    verdicts = {}
    for name, sha in {"parent": log[6], "culprit": culprit, "bad": bad}.items():
        checkout = tmp_path / name
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(checkout), sha],
                       check=True)
        verdicts[name] = run_probe(checkout, tmp_path).verdict
    assert verdicts == {"parent": Verdict.GOOD, "culprit": Verdict.BAD, "bad": Verdict.BAD}


def test_demo_repo_rejects_culprit_outside_history(tmp_path):
    with pytest.raises(ValueError, match="culprit_index"):
        make_demo_repo(tmp_path / "demo", commits=5, culprit_index=5)
