"""check=perf on a GPU that slots share (--gpus 0:2): each step's engine start and measurements hold a timing
gate on that GPU, so two steps never time at once while their imports and shutdowns overlap; a performance
hunt may then share a GPU between steps. Real child.py against the fake vLLM of test_dpa_fp8_kv_numerics.py."""
import socket
import threading

import pytest
from test_dpa_fp8_kv_numerics import nvidia_root  # noqa: F401
from test_dpa_fp8_kv_perf import measured

from bisector.gpus import SHARE_ENV
from scenarios.base import Verdict
from scenarios.dpa_fp8_kv.child import PHASE_MARKER

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]


def marks(log_text: str) -> dict[str, float]:
    """The wall clock at the end of each part the child marked."""
    found = {}
    for line in log_text.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == PHASE_MARKER:
            found[words[1]] = float(words[2])
    return found


def test_two_steps_on_one_shared_gpu_never_time_at_once(tmp_path, nvidia_root):  # noqa: F811
    cache = tmp_path / "cache"  # one node's cache root: the gate beside it is the same for both steps
    shared = {SHARE_ENV: "0.5", "CUDA_VISIBLE_DEVICES": "0", "BISECTOR_CACHE_DIR": str(cache)}
    outcomes = {}

    def step(name):
        outcomes[name] = measured(tmp_path / name, nvidia_root, 0.01, name, env=shared)

    threads = [threading.Thread(target=step, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gated = []
    for name in ("a", "b"):
        assert outcomes[name].verdict is Verdict.GOOD, outcomes[name].reason
        found = marks((tmp_path / name / "logs" / f"{name}.log").read_text())
        assert {"import", "timing_gate", "engine", "measure"} <= set(found)
        assert outcomes[name].details["phases"]["timing_gate"] >= 0
        gated.append((found["timing_gate"], found["measure"]))  # gate taken .. measurements done
    (_, first_measured), (second_gated, _) = sorted(gated)
    assert first_measured <= second_gated  # the later engine started only once the first had measured
    assert list((cache / "timing").iterdir()) == [cache / "timing" / f"{socket.gethostname()}-gpu-0.lock"]


def test_a_gpu_of_its_own_takes_no_timing_gate(tmp_path, nvidia_root):  # noqa: F811
    alone = measured(tmp_path, nvidia_root, 0.002, "alone", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert alone.verdict is Verdict.GOOD, alone.reason
    assert "timing_gate" not in marks((tmp_path / "logs" / "alone.log").read_text())
    assert "timing_gate" not in alone.details["phases"]


def test_a_perf_hunt_of_the_scenario_may_share_a_gpu_a_command_may_not(cli, repo_builder, tmp_path):
    repo = repo_builder(tmp_path / "repo")
    shas = repo.linear(3, bad_from=2)
    before = repo.snapshot()
    common = ("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--gpus", "0:2,1:2", "--jobs", "2",
              "--metric", "decode_tok_s", "--higher-is-better", "--plan")
    gpu = ("--scenario", "dpa-fp8-kv-graph-capture", "--option", "check=perf")
    shared = cli(*common, "--state-dir", str(tmp_path / "s1"), *gpu)
    assert shared.returncode == 0, shared.stderr
    command = cli(*common, "--state-dir", str(tmp_path / "s2"), "--", "true")
    assert command.returncode == 2
    assert command.stderr.startswith("bisector: error: a performance hunt needs a GPU per step: shared slots")
    assert repo.snapshot() == before
