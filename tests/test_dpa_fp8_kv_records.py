"""The GPU scenario's classifier on real outputs: vLLM 0.24.0 on an NVIDIA H200 (tests/records/)."""
import json

import pytest
from dpa_fp8_kv_records import recorded

from bisector.process import ProcessResult
from scenarios.base import Verdict
from scenarios.dpa_fp8_kv.classify import classify, details

pytestmark = pytest.mark.integration

ILLEGAL = "an illegal memory access was encountered"


def judge(name, backend="TRITON_MLA"):
    provenance, output = recorded(name)
    assert {"vllm", "gpu", "date", "command", "exit"} <= set(provenance)
    return classify(ProcessResult(int(provenance["exit"]), False, 1.0, output), ("cuda",), (backend,)), output


@pytest.mark.parametrize("name, verdict, reason", [
    ("h200-v024-triton-fp8-good", Verdict.GOOD,
     "graph capture and a decode step finished on TRITON_MLA: BISECTOR-SCENARIO-OK dp_rank=0 sequences=512 "
     "tokens=1024"),
    ("h200-c8-bf16-kv-good", Verdict.GOOD,
     "graph capture and a decode step finished on TRITON_MLA: BISECTOR-SCENARIO-OK dp_rank=0 sequences=64 "
     "tokens=128"),
    ("h200-c8-planted-fault", Verdict.BAD,
     f"GPU memory fault during engine start-up/graph capture: RuntimeError: Triton Error [CUDA]: {ILLEGAL} | "
     f"what():  CUDA error: {ILLEGAL}"),
    ("h200-c5-import-error", Verdict.SKIP,
     "import error: ImportError: cannot import name 'next_power_of_2_splits' from 'vllm.utils.math_utils' "
     "(/tmp/state/worktrees/slot-0/vllm/utils/math_utils.py)"),
])
def test_real_h200_outputs(name, verdict, reason):
    assert judge(name)[0] == (verdict, reason)


def test_the_logged_traceback_is_quoted_without_prefixes():
    """The engine core logs its traceback as `(EngineCore pid=N) ERROR <time> [core.py:N] <line>`."""
    (_, reason), output = judge("h200-c8-planted-fault")
    assert "(EngineCore pid=1880) ERROR 11-30 12:47:16 [core.py:1231] RuntimeError: Triton Error" in output
    assert "pid=" not in reason and "core.py" not in reason


def test_the_generated_version_module_missing_is_no_build_problem():
    """vLLM only warns when vllm/_version.py is missing (a reused build lacks it); the cause is elsewhere."""
    (verdict, reason), output = judge("h200-c8-flashmla-reuse-import-error", "FLASHMLA")
    assert "No module named 'vllm._version'" in output
    assert (verdict, reason) == (Verdict.SKIP, "exit 1 before the marker: ValueError: Selected backend "
                                 "AttentionBackendEnum.FLASHMLA is not valid for this configuration. Reason: "
                                 "['ImportError']")


def test_the_real_downgrade_line_is_in_the_details():
    (verdict, _), output = judge("h200-v024-full-mode-downgraded")
    assert verdict is Verdict.GOOD
    assert details(output, ("TRITON_MLA",)) == {
        "backend_selected": "INFO 11-30 12:53:05 [cuda.py:420] Using AttentionBackendEnum.TRITON_MLA backend.",
        "cudagraph_downgrade": "WARNING 11-30 12:53:25 [compilation.py:1358] CUDAGraphMode.FULL is not "
                               "supported with TritonMLABackend backend (support: AttentionCGSupport."
                               "UNIFORM_BATCH); setting cudagraph_mode=FULL_AND_PIECEWISE"}


def test_classify_cli_on_the_real_fault_log(tmp_path, cli):
    _, output = recorded("h200-c8-planted-fault")
    log = tmp_path / "child.log"
    log.write_text(output)
    done = cli("scenario", "classify", "dpa-fp8-kv-graph-capture", "--option", "platform=cuda",
                    "--log", str(log), "--exit-code", "1", "--json")
    assert done.returncode == 1, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["verdict"] == "bad"
    assert outcome["details"]["matched"][0] == f"RuntimeError: Triton Error [CUDA]: {ILLEGAL}"

