"""Classification of child outputs (public quotes here; real records in test_dpa_fp8_kv_records.py),
and the verdict across DP ranks. Pure."""
import time

import pytest
from dpa_fp8_kv_records import APERTURE, ENGINE_FAILED, FAULT, FAULT_READ_ONLY, HSA, OK, PREFIX, RECORDS

from bisector.process import ProcessResult
from scenarios.base import Verdict
from scenarios.dpa_fp8_kv.classify import classify, combine, details, skip_cause, strip_prefix

pytestmark = pytest.mark.unit


def result(record, returncode=1, timed_out=False, seconds=12.0):
    return ProcessResult(returncode, timed_out, seconds, RECORDS[record])


def test_fault_during_capture_is_bad_quoting_the_lines():
    verdict, reason = classify(result("fault-in-capture", returncode=-6))
    assert verdict is Verdict.BAD
    assert reason == f"GPU memory fault during engine start-up/graph capture: {FAULT}"  # the bar cut off


def test_fault_behind_engine_core_failure_is_bad_with_all_fault_lines():
    verdict, reason = classify(result("fault-then-engine-failed", returncode=1))
    assert verdict is Verdict.BAD
    assert reason == f"GPU memory fault during engine start-up/graph capture: {FAULT} | {FAULT_READ_ONLY}"


def test_aperture_violation_is_a_memory_fault():
    verdict, reason = classify(result("aperture", returncode=1))
    assert (verdict, reason) == (Verdict.BAD, f"GPU memory fault during engine start-up/graph capture: {APERTURE}")


def test_lone_0x1016_exception_is_skip_even_with_sigabrt():
    verdict, reason = classify(result("lone-0x1016", returncode=-6))
    assert (verdict, reason) == (Verdict.SKIP, f"hardware exception, not a memory fault: {HSA}")


def test_ok_marker_then_teardown_fault_and_abort_is_good():
    verdict, reason = classify(result("ok-then-teardown-abort", returncode=-6))
    assert verdict is Verdict.GOOD
    assert reason.endswith(OK)


def test_the_non_default_args_line_is_no_selection():
    """vLLM echoes the requested backend in `non-default args: {…}`; only its selection line counts."""
    verdict, reason = classify(result("ok-without-aiter", returncode=0))
    assert verdict is Verdict.SKIP
    assert "never says vLLM selected ROCM_AITER_MLA" in reason


def test_prefixes_are_stripped_before_matching():
    assert strip_prefix("(EngineCore_DP3 pid=91) (Worker_TP0 pid=92) ImportError: x") == "ImportError: x"
    assert strip_prefix("(EngineCore pid=7) INFO") == "INFO"
    assert strip_prefix("x (EngineCore pid=7) INFO") == "x (EngineCore pid=7) INFO"


def test_cuda_signatures_only_on_cuda():
    line = PREFIX + "torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    assert classify(ProcessResult(1, False, 1.0, line), ("cuda",), ("TRITON_MLA",))[0] is Verdict.BAD
    assert classify(ProcessResult(1, False, 1.0, line), ("rocm",), ("ROCM_AITER_MLA",))[0] is Verdict.SKIP


def test_cudagraph_downgrade_is_reported_and_no_full_decode_graph_is_skip():
    downgrade = ("WARNING 05-20 10:00:02 [compilation.py:1358] CUDAGraphMode.FULL is not supported with "
                 "TritonMLABackend backend (support: AttentionCGSupport.UNIFORM_BATCH); setting "
                 "cudagraph_mode=FULL_AND_PIECEWISE")
    selected = "INFO 05-20 10:00:01 [cuda.py:420] Using AttentionBackendEnum.TRITON_MLA backend."
    output = "\n".join([PREFIX + selected, PREFIX + downgrade, OK])
    assert details(output, ("TRITON_MLA",)) == {"backend_selected": selected, "cudagraph_downgrade": downgrade}
    assert classify(ProcessResult(0, False, 1.0, output), ("cuda",), ("TRITON_MLA",))[0] is Verdict.GOOD
    to_none = output.replace("FULL_AND_PIECEWISE", "NONE")
    verdict, reason = classify(ProcessResult(0, False, 1.0, to_none), ("cuda",), ("TRITON_MLA",))
    assert verdict is Verdict.SKIP and reason.startswith("decode finished without full decode graphs: ")


def test_scanning_is_linear_in_the_log_size():
    """Long lines without a match (a progress bar without newlines) cost no backtracking."""
    line = "Capturing CUDA graphs (decode, FULL): " + "█" * 200_000 + "(" * 100_000
    start = time.monotonic()
    classify(ProcessResult(1, False, 1.0, (line + "\n") * 20))
    assert time.monotonic() - start < 30  # 0.4 s on a loaded machine; backtracking takes hours


def test_fault_after_the_engine_was_ready_is_a_decode_fault():
    verdict, reason = classify(result("fault-in-decode", returncode=134))
    assert verdict is Verdict.BAD
    assert reason.startswith("GPU memory fault during decode: Memory access fault by GPU node-2")


def test_engine_core_sigabrt_without_fault_lines_is_bad():
    verdict, reason = classify(result("core-abort", returncode=1))
    assert verdict is Verdict.BAD
    assert reason == ("SIGABRT during engine start-up/graph capture: "
                      "Failed core proc(s): {'EngineCore_DP0': -6}")
    assert classify(result("core-abort", returncode=1), ("cuda",), ("TRITON_MLA",))[0] is Verdict.SKIP
    assert ENGINE_FAILED.endswith(reason.split(": ", 1)[1])


@pytest.mark.parametrize("returncode", [-6, 134])
def test_child_sigabrt_is_bad(returncode):
    verdict, reason = classify(ProcessResult(returncode, False, 3.0, RECORDS["ok-without-aiter"][:20]))
    assert verdict is Verdict.BAD
    assert reason == f"SIGABRT during engine start-up/graph capture: exit {returncode}"


def test_marker_on_aiter_mla_is_good():
    verdict, reason = classify(result("ok", returncode=0))
    assert verdict is Verdict.GOOD
    assert reason.endswith(OK)


def test_marker_is_good_even_when_teardown_is_killed():
    assert classify(result("ok", returncode=None))[0] is Verdict.GOOD


@pytest.mark.parametrize("record, expected", [
    ("import-error", "import error: ModuleNotFoundError: No module named 'aiter'"),
    ("undefined-symbol", "build problem: ImportError: /src/vllm/vllm/_C.abi3.so: undefined symbol: "
                         "_ZN3c104cuda9SetDeviceEa"),
    ("oom", "out of GPU memory: torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total capacity of 191.98 GiB"),
    ("no-gpu", "no GPU: RuntimeError: No HIP GPUs are available"),
    ("other-error", "exit 1 before the marker: ValueError: unsupported cudagraph_mode FULL"),
])
def test_failures_before_the_marker_are_skips_with_precise_reasons(record, expected):
    assert classify(result(record)) == (Verdict.SKIP, expected)


def test_timeout_is_skip():
    verdict, reason = classify(ProcessResult(None, True, 3600.4, RECORDS["ok"].split("BISECTOR")[0]))
    assert (verdict, reason) == (Verdict.SKIP, "timed out after 3600s during engine start-up/graph capture")


def test_silent_exit_is_skip():
    assert classify(ProcessResult(0, False, 1.0, "")) == (Verdict.SKIP,
                                                          "exit 0 before the marker: no output")


def judge(*results):
    results = list(results)
    return combine(results, [classify(r) for r in results])


def test_one_bad_rank_makes_the_step_bad():
    stopped = ProcessResult(None, False, 40.0, "INFO waiting")
    assert judge(stopped, result("fault-in-capture", -6)) == (
        Verdict.BAD, f"DP rank 1: GPU memory fault during engine start-up/graph capture: {FAULT}")


def test_all_good_ranks():
    verdict, reason = judge(result("ok", 0), result("ok", 0))
    assert verdict is Verdict.GOOD
    assert reason.startswith("all 2 DP ranks: graph capture and a decode step finished on ROCM_AITER_MLA")


def test_skip_reason_comes_from_the_rank_that_failed_not_the_one_stopped():
    stopped = ProcessResult(None, False, 40.0, "INFO waiting")
    assert judge(stopped, result("oom")) == (
        Verdict.SKIP, "DP rank 1: out of GPU memory: torch.OutOfMemoryError: HIP out of memory. Tried "
                      "to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB")


def test_single_rank_reason_has_no_rank_prefix():
    assert judge(result("no-gpu")) == (Verdict.SKIP, "no GPU: RuntimeError: No HIP GPUs are available")


@pytest.mark.parametrize("returncode, core, last", [
    (-9, "", "RuntimeError: Engine core initialization failed"),
    (137, "", "RuntimeError: Engine core initialization failed"),
    (1, "Failed core proc(s): {'EngineCore_DP0': -9}", "Failed core proc(s): {'EngineCore_DP0': -9}")])
def test_an_engine_killed_by_sigkill_is_a_kill_from_outside(returncode, core, last):
    output = "\n".join([RECORDS["loading"], core, "RuntimeError: Engine core initialization failed"])
    judged = classify(ProcessResult(returncode, False, 3.0, output))
    assert judged == (Verdict.SKIP, "killed by SIGKILL from outside (OOM killer?) during engine start-up/graph "
                                    f"capture: no verdict; {last}")
    assert skip_cause([judged]) == "external-signal"


def test_skip_causes_the_machine_gave_and_the_commits_own():
    stopped = ProcessResult(None, False, 40.0, "INFO waiting")
    assert skip_cause([classify(stopped), classify(result("no-gpu"))]) == "machine"
    assert skip_cause([classify(result("import-error"))]) is None  # the commit's own skip: cached
    assert skip_cause([classify(result("fault-in-capture", -6))]) is None
