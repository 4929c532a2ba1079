"""--flaky (posterior search) and --repeat: pure search, 100 seeded runs, one real CLI run."""
import json
import random

import pytest

from bisector.record.results import Evidence
from bisector.search.dag import FlakyBisection, FlakyModel, InconsistentVerdicts

pytestmark = pytest.mark.integration

SHAS = [f"c{i}" for i in range(30)]


def simulate(culprit: int, p: float, seed: int, **kw) -> tuple[FlakyBisection, int]:
    """One seeded flaky hunt over SHAS: bad commits fault with probability p. Returns (search, runs)."""
    rng = random.Random(seed)
    search = FlakyBisection(SHAS, "old", model=FlakyModel(max_runs_per_commit=60, **kw))
    runs = 0
    while not search.done:
        sha = search.next_probes(1)[0]
        position = -1 if sha == "old" else SHAS.index(sha)
        search.record(sha, position >= culprit and rng.random() < p)
        runs += 1
    return search, runs


def test_first_probe_is_the_middle_only_for_a_reliable_fault():
    reliable = FlakyBisection(SHAS, "old", model=FlakyModel(fault_rate=0.999)).next_probes(1)[0]
    assert 13 <= SHAS.index(reliable) <= 15
    # a fault rules out everything after the probe, a clean run rules out little: probe earlier
    flaky = FlakyBisection(SHAS, "old").next_probes(1)[0]
    assert 6 <= SHAS.index(flaky) < 13


def test_a_fault_rules_out_every_later_culprit_and_clean_runs_only_weigh():
    search = FlakyBisection(SHAS, "old", model=FlakyModel(fault_rate=0.5))
    search.record("c9", True)
    post = search.posterior()
    assert all(post[f"c{i}"] == 0 for i in range(10, 30))
    assert post["c9"] == pytest.approx(0.1)
    search.record("c4", False)  # clean on c4: culprits c0..c4 lose half their weight
    post = search.posterior()
    assert post["c4"] == pytest.approx(0.5 * post["c5"])


def test_fault_before_every_culprit_is_inconsistent():
    search = FlakyBisection(SHAS, "old")
    with pytest.raises(InconsistentVerdicts):
        search.record("old", True)


def test_find_fix_mirrors_the_model():
    search = FlakyBisection(SHAS, "old", faults_mean_new=False, model=FlakyModel(fault_rate=0.5))
    search.record("c9", True)  # still faulty at c9: the fix comes later
    assert all(p == 0 for sha, p in search.posterior().items() if SHAS.index(sha) <= 9)
    with pytest.raises(InconsistentVerdicts):
        search.record("c29", True)  # the new (fixed) endpoint never faults


def test_skips_and_run_limits_take_commits_out_of_play():
    search = FlakyBisection(SHAS[:3], "old", model=FlakyModel(max_runs_per_commit=2))
    search.skip("c1")
    for _ in range(2):
        search.record("c0", False)
    assert set(search.expected_entropies()) == {"old", "c2"}
    assert search.evidence() == {"c0": Evidence(runs=2, faults=0)}


def test_priors_pull_the_first_probe():
    uniform = FlakyBisection(SHAS, "old").next_probes(1)[0]
    seeded = FlakyBisection(SHAS, "old", priors={"c3": 40.0}).next_probes(1)[0]
    assert SHAS.index(seeded) < SHAS.index(uniform)


def test_confident_and_right_over_100_seeded_runs():
    """p = 0.3 unknown to the search: it names the culprit at least as often as it claims."""
    hits, claimed = 0, 0.0
    for seed in range(100):
        culprit = random.Random(seed).randrange(len(SHAS))
        search, _ = simulate(culprit, 0.3, seed)
        best, confidence = search.best()
        assert confidence >= 0.95
        hits += best == SHAS[culprit]
        claimed += confidence
    assert hits / 100 >= 0.95
    assert hits >= claimed - 2  # calibrated within noise, not just above the threshold


def make_history(repo, count: int, bad_from: int) -> list[str]:
    return repo.linear(count, bad_from)


def flaky_env(tmp_path, seed: int, p: float) -> dict:
    counters = tmp_path / f"counters-{seed}"
    counters.mkdir()
    return {"FLAKY_COUNTER_DIR": str(counters), "FLAKY_SEED": str(seed), "FLAKY_P": str(p)}


@pytest.fixture
def flaky_fault(project_root):
    """The command scenario of bench/flaky_fault.py: a fault that shows with probability FLAKY_P."""
    return ["python3", str(project_root / "bench" / "flaky_fault.py")]


# decision logic also in tests/test_engine_table.py, row "repeat catches a commit that faults on its second run"
@pytest.mark.slow
def test_repeat_makes_plain_bisection_catch_an_intermittent_fault(make_repo, tmp_path, cli, flaky_fault):
    repo = make_repo()
    shas = repo.linear(16, bad_from=7)
    out = tmp_path / "r.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--repeat", "12",
               "--json", str(out), "--", *flaky_fault, env=flaky_env(tmp_path, 3, 0.5))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["first_bad"]["sha"] == shas[7]
    good_steps = [s for s in result["steps"] if s["verdict"] == "good"]
    assert good_steps and all(s["reason"] == "12 clean runs" for s in good_steps)


def test_flaky_cli_names_culprit_with_confidence_and_evidence(make_repo, tmp_path, cli, flaky_fault):
    repo = make_repo()
    shas = repo.linear(16, bad_from=7)
    before = repo.snapshot()
    out = tmp_path / "r.json"
    proc = cli("run", "--repo", str(repo.path), "--good", shas[0], "--bad", shas[-1], "--flaky",
               "--json", str(out), "--", *flaky_fault, env=flaky_env(tmp_path, 1, 0.5))
    assert proc.returncode == 0, proc.stderr
    assert "flaky search: confidence " in proc.stdout and " fault(s) in " in proc.stdout
    result = json.loads(out.read_text())
    assert result["first_bad"]["sha"] == shas[7]
    assert result["confidence"] >= 0.95
    evidence = result["evidence"]
    assert sum(e["runs"] for e in evidence.values()) == result["executions"]
    assert all(e["faults"] == 0 for sha, e in evidence.items() if sha in shas[:7])
    assert evidence[shas[-1]]["faults"] >= 1
    assert repo.snapshot() == before
