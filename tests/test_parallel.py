"""k-way rounds, cancellation of moot steps, and local GPU/CPU slots."""
import json
import math
import time

import pytest

from bisector.engine.config import RunConfig
from bisector.engine.executor import local_slots
from bisector.engine.run import run_bisection
from bisector.errors import UsageError
from bisector.machine.gpus import parse_gpus, visible_gpus
from bisector.record.steps import Handler
from bisector.search.dag import Bisection, Term
from scenarios.command import CommandScenario

pytestmark = [pytest.mark.integration, pytest.mark.gpu_plan]


@pytest.mark.parametrize("n", [2, 3, 7, 16, 100, 1000])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_rounds_stay_within_log_k_plus_1_of_n(n, k):
    commits = [(f"c{i}", [f"c{i - 1}"] if i else []) for i in range(n)]
    bound = math.ceil(math.log(n, k + 1)) + 1
    for culprit in sorted({0, 1, n // 3, n // 2, n - 2, n - 1} - {-1}):
        search, rounds = Bisection(commits, f"c{n - 1}"), 0
        while not search.done:
            rounds += 1
            probes = search.next_probes(k)
            assert 0 < len(probes) <= k
            for sha in probes:
                search.record(sha, Term.NEW if int(sha[1:]) >= culprit else Term.OLD)
        assert search.answer().first_new == f"c{culprit}"
        assert rounds <= bound, (n, k, culprit, rounds)


def _threshold_scenario(bad_from: int) -> CommandScenario:
    return CommandScenario(["sh", "-c", f'test "$(cat counter.txt)" -lt {bad_from}'])


@pytest.mark.parametrize("jobs", [1, 3])
def test_rounds_in_result_count_probe_rounds(make_repo, tmp_path, jobs):
    repo = make_repo()
    shas = repo.linear(61, bad_from=None)
    launches = _Launches()
    result = run_bisection(RunConfig(repo=repo.path, good=shas[0], bad=shas[-1], jobs=jobs,
                                     scenario=_threshold_scenario(37), state_dir=tmp_path / f"s{jobs}"), launches)
    assert result.culprit.sha == shas[37]
    probe_rounds = {s.round for s in result.steps if s.role == "probe"}
    first = 0 if jobs > 2 else 1  # more slots than endpoints: the first probes run in the endpoint round
    assert probe_rounds == set(range(first, result.rounds + 1))
    assert result.rounds <= math.ceil(math.log(60, jobs + 1)) + 1
    # Steps a landed verdict made moot are cancelled and never land, so count what each round launched.
    assert max(len(batch) for batch in launches.probe_rounds) == jobs


class _Launches(Handler):
    """The probes launched per round: a round launches all its steps before the first of them lands."""

    def __init__(self):
        self.probe_rounds: list[list[str]] = []
        self.landed = True

    def testing(self, sha, role):
        if role != "probe":
            return
        if self.landed:
            self.probe_rounds.append([])
        self.probe_rounds[-1].append(sha)
        self.landed = False

    def tested(self, step, left, steps_left):
        self.landed = True


def test_result_deciding_the_answer_kills_the_running_step(make_repo, tmp_path,
                                                           deciding_answer_kills_the_rest, pid_alive,
                                                           script_scenario, wait_for):
    repo = make_repo()
    shas = repo.linear(4, bad_from=1)
    start = time.monotonic()
    result = run_bisection(RunConfig(repo=repo.path, good=shas[0], bad=shas[3], jobs=2,
                                     scenario=script_scenario(deciding_answer_kills_the_rest),
                                     state_dir=tmp_path / "state"))
    assert time.monotonic() - start < 300  # well under the sleeper's 600 s: it did not wait for it
    assert result.culprit.sha == shas[1]
    sleeper = int((tmp_path / "sleeper").read_text())
    assert wait_for(lambda: not pid_alive(sleeper))  # killed: it dies as soon as the kernel runs it
    assert shas[2] not in [s.sha for s in result.steps]


# Probes 2, 4, 6 run together; 4 is bad, which makes 6 moot: 6 must be killed for 2 to answer (the step
# timeout, far above a loaded machine's round and far below the sleep, turns a kill that never comes into
# skips, not into a wait of 600 s).
MOOT_PROBE_IS_KILLED_MID_ROUND = """
case $n in
  6) echo $$ > $PIDS/sleeper; exec sleep 600;;
  4) while [ ! -f $PIDS/sleeper ]; do sleep 0.05; done; exit 1;;
  2) while [ ! -f $PIDS/sleeper ]; do sleep 0.05; done
     while kill -0 $(cat $PIDS/sleeper) 2>/dev/null; do sleep 0.05; done; exit 0;;
esac
grep -q good state
"""


def test_probe_made_moot_mid_round_is_killed_while_the_round_goes_on(make_repo, tmp_path, script_scenario):
    repo = make_repo()
    shas = repo.linear(9, bad_from=4)
    result = run_bisection(RunConfig(repo=repo.path, good=shas[0], bad=shas[8], jobs=3, timeout=180,
                                     scenario=script_scenario(MOOT_PROBE_IS_KILLED_MID_ROUND),
                                     state_dir=tmp_path / "state"))
    first = {s.sha: s.verdict for s in result.steps if s.round == 0 and s.role == "probe"}  # beside the endpoints
    assert first == {shas[2]: "good", shas[4]: "bad"}
    assert result.culprit.sha == shas[4]
    assert result.rounds == 1


def test_parse_gpus():
    assert parse_gpus("0-7") == list(range(8))
    assert parse_gpus("0,2,4") == [0, 2, 4]
    assert parse_gpus("0-1, 4, 1") == [0, 1, 4]
    for bad in ("", "a", "3-1", "1-", "-1", "0,,1"):
        with pytest.raises(UsageError):
            parse_gpus(bad)


def test_visible_gpus_from_hip_variable_then_kfd_topology(tmp_path):
    for node, simds in enumerate([0, 304, 304, 0, 304]):
        (tmp_path / str(node)).mkdir()
        (tmp_path / str(node) / "properties").write_text(f"cpu_cores_count 0\nsimd_count {simds}\n")
    assert visible_gpus({}, tmp_path) == [0, 1, 2]
    assert visible_gpus({"HIP_VISIBLE_DEVICES": "4,5"}, tmp_path) == [4, 5]
    assert visible_gpus({"HIP_VISIBLE_DEVICES": ""}, tmp_path) == []
    assert visible_gpus({}, tmp_path / "missing") == []
    # a scheduler's ROCR_VISIBLE_DEVICES holds physical ids; HIP ids index within it
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "4,5,6,7"}, tmp_path) == [4, 5, 6, 7]
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1,3"}, tmp_path) == [5, 7]
    # one rule for every variable: set but empty grants no GPU; CUDA_ stands in for HIP_
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": ""}, tmp_path) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2"}, tmp_path) == [2]
    assert visible_gpus({"ROCR_VISIBLE_DEVICES": "4,5", "CUDA_VISIBLE_DEVICES": "1"}, tmp_path) == [5]


@pytest.mark.parametrize("command", [["run", "--good", "HEAD~1", "--bad", "HEAD"],
                                     ["backport", "--fix", "HEAD", "--branches", "main"],
                                     ["scenario", "run"]])
def test_gpu_scenario_with_empty_hip_visible_devices_is_a_usage_error(make_repo, command, cli):
    repo = make_repo()
    repo.linear(2, bad_from=1)
    before = repo.snapshot()
    args = [*command, "dpa-fp8-kv-graph-capture"] if command[0] == "scenario" else \
        [*command, "--scenario", "dpa-fp8-kv-graph-capture"]
    proc = cli(*args, "--repo", str(repo.path), cwd=repo.path, env={"HIP_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("bisector: error: scenario 'dpa-fp8-kv-graph-capture' needs 1 GPU(s) per "
                                   "step but HIP_VISIBLE_DEVICES='' grants none (set but empty = no GPUs; "
                                   "unset = all the runner gives)")
    assert repo.snapshot() == before


def test_local_slots():
    assert local_slots(3, [], 1) == [{}, {}, {}]
    assert local_slots(2, [0, 1, 2, 3], 0) == [{}, {}]
    slots = local_slots(2, [0, 1, 2, 3, 4], 2)
    assert [s["ROCR_VISIBLE_DEVICES"] for s in slots] == ["0,1", "2,3"]
    assert all(s["CUDA_VISIBLE_DEVICES"] == s["HIP_VISIBLE_DEVICES"] == "0,1" for s in slots)
    with pytest.raises(UsageError, match="--jobs 3 needs 6 GPUs"):
        local_slots(3, [0, 1, 2, 3, 4], 2)


@pytest.fixture
def seen_devices_run(cli, state_is_good):
    def run(repo, tmp_path, *options, env):
        shas = repo.linear(20, bad_from=11)
        seen = tmp_path / "seen"
        proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], *options,
                   "--json", str(tmp_path / "r.json"), "--", "sh", "-c",
                   f'echo "$HIP_VISIBLE_DEVICES|$ROCR_VISIBLE_DEVICES|$CUDA_VISIBLE_DEVICES" >> {seen}; '
                   + " ".join(state_is_good), env=env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads((tmp_path / "r.json").read_text())["culprit"]["sha"] == shas[11]
        return set(seen.read_text().splitlines())

    return run


def test_each_step_sees_only_its_gpu_slot(make_repo, tmp_path, seen_devices_run):
    seen = seen_devices_run(make_repo(), tmp_path, "--jobs", "2", "--gpus-per-run", "2",
                            env={"HIP_VISIBLE_DEVICES": "0,1,2,3"})
    assert seen == {"0,1|0,1|0,1", "0,1|2,3|0,1"}  # HIP|ROCR|CUDA: ROCR physical, HIP/CUDA within it


def test_gpus_option_picks_the_devices(make_repo, tmp_path, seen_devices_run):
    seen = seen_devices_run(make_repo(), tmp_path, "--jobs", "2", "--gpus", "5,7",
                            env={"HIP_VISIBLE_DEVICES": ""})
    assert seen == {"0|5|0", "0|7|0"}  # HIP|ROCR|CUDA


def test_no_gpus_visible_means_cpu_slots(make_repo, tmp_path, seen_devices_run):
    seen = seen_devices_run(make_repo(), tmp_path, "--jobs", "3",
                            env={"HIP_VISIBLE_DEVICES": "", "ROCR_VISIBLE_DEVICES": "",
                                  "CUDA_VISIBLE_DEVICES": ""})
    assert seen == {"||"}


@pytest.mark.parametrize("options, message", [
    (["--gpus", "7-3"], "bad GPU range '7-3'"),
    (["--gpus", "x"], "bad GPU list 'x'"),
    (["--jobs", "3", "--gpus", "0,1"], "--jobs 3 needs 3 GPUs (1 per run); 2 available (0,1)"),
    (["--gpus-per-run", "1"], "no GPUs visible"),
    (["--remote", "/elsewhere"], "--ray-address and --remote need --executor ray"),
    (["--executor", "ray", "--gpus", "0"], "--gpus is for --executor local"),
])
def test_bad_placement_options_are_usage_errors(make_repo, options, message, cli, state_is_good):
    repo = make_repo()
    shas = repo.linear(3, bad_from=2)
    before = repo.snapshot()
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], *options,
               "--", *state_is_good, env={"HIP_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2
    assert proc.stderr.startswith("bisector: error: ") and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert repo.snapshot() == before
