"""check=perf on a GPU that slots share (--gpus 0:2): each step's engine start holds a timing gate on that GPU
shared and its measurements hold it alone, so engines start side by side but nothing starts or measures beside a
measurement, while imports and shutdowns overlap; a performance hunt may then share a GPU between steps. Real
child.py against the fake vLLM of test_dpa_fp8_kv_numerics.py."""
import socket
import threading

import pytest
from test_dpa_fp8_kv_numerics import nvidia_root  # noqa: F401
from test_dpa_fp8_kv_perf import measured

from bisector.machine.gpus import SHARE_ENV
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


RENDEZVOUS = """import time
from pathlib import Path


def meet(folder, me, other):
    \"\"\"This engine start has begun; wait until the other step's has too (a minute at most: then fail).\"\"\"
    Path(folder, me).touch()
    deadline = time.monotonic() + 60
    while not Path(folder, other).exists():
        if time.monotonic() > deadline:
            raise SystemExit("the other step's engine never started beside this one")
        time.sleep(0.02)
"""


def test_two_steps_on_one_shared_gpu_start_engines_side_by_side_and_never_measure_beside_anything(
        tmp_path, nvidia_root):  # noqa: F811
    """Each step's engine start holds the GPU's timing gate shared, its measurements alone: the two engines
    start at once (each waits in its start for the other's to begin: with the gate held alone through the
    start, as in round 8, the second could not begin and the first gave up), and neither step measures while
    the other starts an engine or measures."""
    cache = tmp_path / "cache"  # one node's cache root: the gate beside it is the same for both steps
    shared = {SHARE_ENV: "0.5", "CUDA_VISIBLE_DEVICES": "0", "BISECTOR_CACHE_DIR": str(cache)}
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    # the node's first engine of these settings starts alone (it fills the compile cache): a run before theirs
    assert measured(tmp_path / "first", nvidia_root, 0.002, "first", env=shared).verdict is Verdict.GOOD
    outcomes = {}

    def step(name, other):
        (tmp_path / name / "site").mkdir(parents=True)
        (tmp_path / name / "site" / "rendezvous.py").write_text(RENDEZVOUS)
        outcomes[name] = measured(tmp_path / name, nvidia_root, 0.01, name, env=shared,
                                  on_start="rendezvous:meet", on_start_args=(str(meeting), name, other))

    threads = [threading.Thread(target=step, args=names) for names in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    starts, measurements = {}, {}
    for name in ("a", "b"):
        assert outcomes[name].verdict is Verdict.GOOD, outcomes[name].reason
        found = marks((tmp_path / name / "logs" / f"{name}.log").read_text())
        assert {"import", "timing_gate", "engine", "measure_gate", "measure"} <= set(found)
        assert outcomes[name].phases["measure_gate"] >= 0
        starts[name] = (found["timing_gate"], found["engine"])  # gate taken shared .. engine up
        measurements[name] = (found["measure_gate"], found["measure"])  # gate taken alone .. measured

    def apart(one, two):
        return one[1] <= two[0] or two[1] <= one[0]

    assert not apart(starts["a"], starts["b"])  # side by side
    assert apart(measurements["a"], measurements["b"])
    assert apart(measurements["a"], starts["b"]) and apart(measurements["b"], starts["a"])
    assert list((cache / "timing").iterdir()) == [cache / "timing" / f"{socket.gethostname()}-gpu-0.lock"]


def test_a_gpu_of_its_own_takes_no_timing_gate(tmp_path, nvidia_root):  # noqa: F811
    alone = measured(tmp_path, nvidia_root, 0.002, "alone", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert alone.verdict is Verdict.GOOD, alone.reason
    assert "timing_gate" not in marks((tmp_path / "logs" / "alone.log").read_text())
    assert "timing_gate" not in alone.phases


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
