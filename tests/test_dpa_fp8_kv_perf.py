"""dpa-fp8-kv-graph-capture --option check=perf, end to end with the real child.py against the fake vllm of
test_dpa_fp8_kv_numerics.py, whose decode here takes FAKE_STEP_SECONDS per decode step (a planted speed)."""
import sys
import textwrap

import pytest
from test_dpa_fp8_kv_numerics import FAKE_TORCH, FAKE_VLLM, NAME, SMALL, nvidia_root  # noqa: F401

from bisector.errors import ScenarioError
from scenarios import create
from scenarios.base import StepContext, Verdict
from scenarios.dpa_fp8_kv import perf

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]

PERF = {**SMALL, "check": "perf", "perf_repeats": "3", "perf_tokens": "16", "perf_batch": "4"}
TIMED = ("    def generate(self, prompts, params, use_tqdm=True):\n",
         "    def generate(self, prompts, params, use_tqdm=True):\n"
         "        import time\n"
         "        time.sleep(float(os.environ.get('FAKE_STEP_SECONDS', '0')) * params.kwargs['max_tokens'])\n")


def measured(tmp_path, root, seconds_per_step: str, name: str):
    site = tmp_path / "site"
    for rel, text in FAKE_TORCH.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    checkout = tmp_path / name / "tree"
    assert TIMED[0] in textwrap.dedent(FAKE_VLLM["vllm/__init__.py"])
    for rel, text in FAKE_VLLM.items():
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text(textwrap.dedent(text).replace(*TIMED))
    scenario = create(NAME, PERF)
    scenario.system_root = root
    return scenario.run(StepContext(checkout=checkout, log_path=tmp_path / "logs" / f"{name}.log", timeout=120,
                                    python=sys.executable,
                                    env={"PYTHONPATH": str(site), "FAKE_VLLM_RECORD": str(tmp_path / "vllm.jsonl"),
                                         "BISECTOR_CACHE_DIR": str(tmp_path / "cache"),
                                         "FAKE_STEP_SECONDS": seconds_per_step}))


def test_check_perf_reports_decode_throughput_and_time_to_first_token(tmp_path, nvidia_root):  # noqa: F811
    fast = measured(tmp_path, nvidia_root, "0.002", "fast")
    assert fast.verdict is Verdict.GOOD, fast.reason
    assert set(fast.metrics) == {"decode_tok_s", "ttft_ms"}
    # 4 sequences x 16 decode steps in 16 x 2 ms (two generates 16 steps apart): about 2,000 tokens/s
    assert 800 < fast.metrics["decode_tok_s"] < 2400
    assert 2 <= fast.metrics["ttft_ms"] < 50
    assert len(fast.details["perf"]["measurements"]) == 3  # three measurements inside one engine start
    slow = measured(tmp_path, nvidia_root, "0.004", "slow")
    assert slow.metrics["decode_tok_s"] < 0.75 * fast.metrics["decode_tok_s"]


def test_check_perf_options_are_checked():
    with pytest.raises(ScenarioError, match="check=perf measures one engine: it needs dp=1"):
        create(NAME, {**PERF, "dp": "2"})
    with pytest.raises(ScenarioError, match="perf_batch=8: more than max_num_seqs=6"):
        create(NAME, {**PERF, "perf_batch": "8"})
    with pytest.raises(ScenarioError, match="needs max_model_len >= 1113"):
        create(NAME, {**PERF, "perf_tokens": "550"})


def test_measurements_are_read_from_the_childs_lines_and_their_medians_reported():
    output = ('BISECTOR-PERF {"repeat": 0, "decode_tok_s": 900, "ttft_ms": 30}\nnoise\n'
              'BISECTOR-PERF {"repeat": 1, "decode_tok_s": 1100, "ttft_ms": 10}\nBISECTOR-PERF {broken\n'
              'BISECTOR-PERF {"repeat": 2, "decode_tok_s": 1000, "ttft_ms": 20}\n')
    values, details = perf.metrics(output)
    assert values == {"decode_tok_s": 1000.0, "ttft_ms": 20.0}
    assert len(details["perf"]["measurements"]) == 3
    assert perf.metrics("no measurement\n") == ({}, {})


@pytest.mark.unit
def test_a_repeat_without_a_decode_figure_keeps_its_time_to_first_token():
    """The child prints no decode_tok_s for a repeat whose longer generate was not slower (seen on the H200:
    a 1-token baseline gave 2e12 tokens/s): that repeat is left out of the decode median, not the TTFT's."""
    output = ('BISECTOR-PERF {"repeat": 0, "ttft_ms": 30}\n'
              'BISECTOR-PERF {"repeat": 1, "decode_tok_s": 1100, "ttft_ms": 10}\n'
              'BISECTOR-PERF {"repeat": 2, "decode_tok_s": 1000, "ttft_ms": 20}\n')
    values, details = perf.metrics(output)
    assert values == {"decode_tok_s": 1050.0, "ttft_ms": 20.0}
    assert details["perf"]["measurements"][0] == {"ttft_ms": 30.0}
