"""The metric protocol's parsing, the performance statistics (Pinpoint's comparison over scipy.stats), and
the record's metrics column (schema 6, migrated from 4)."""
import json
import math
import random
import sqlite3

import pytest
from helpers.perf_noise_bench import load_bench

from bisector.metrics import MetricError, parse_output, read_file
from bisector.record.store import SCHEMA_VERSION, Execution, Store
from bisector.seams import Verdict

pytestmark = pytest.mark.unit


def test_metric_lines_last_value_of_a_name_wins_and_junk_is_ignored():
    output = ("warming up\nBISECTOR_METRIC tok_s=10\n[rank0] BISECTOR_METRIC tok_s = 12.5 \n"
              "BISECTOR_METRIC ttft_ms=3e2\nBISECTOR_METRIC bad=nan\nBISECTOR_METRIC worse=fast\n")
    assert parse_output(output) == {"tok_s": 12.5, "ttft_ms": 300.0}


def test_metric_file_is_a_json_object_of_finite_numbers(tmp_path):
    path = tmp_path / "m.json"
    assert read_file(path) == {}  # none written
    path.write_text(json.dumps({"tok_s": 9410, "ttft_ms": 21.5}))
    assert read_file(path) == {"tok_s": 9410.0, "ttft_ms": 21.5}
    for text in ("[1, 2]", '{"tok_s": "fast"}', '{"tok_s": true}', "{", '{"1x": 3}'):
        path.write_text(text)
        with pytest.raises(MetricError, match="BISECTOR_METRIC_FILE"):
            read_file(path)


def test_comparison_is_different_same_or_unknown_as_pinpoint_says():
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import LOW_THRESHOLD, Result, change, compare

    rng = random.Random(0)
    base = [1000 * (1 + rng.gauss(0, 0.02)) for _ in range(10)]
    slow = [920 * (1 + rng.gauss(0, 0.02)) for _ in range(10)]
    same = [1000 * (1 + rng.gauss(0, 0.02)) for _ in range(30)]
    seen = compare(base, slow)
    assert seen.result is Result.DIFFERENT and seen.p_value <= LOW_THRESHOLD
    assert compare(base[:3], slow[:3]).result is Result.UNKNOWN  # 3 samples cannot reach p <= 0.01
    assert compare(same[:15], same[15:]).result is Result.SAME
    moved = change(base, slow)
    assert moved.low <= moved.relative <= moved.high < 0
    assert -0.11 < moved.relative < -0.05
    assert change(base, slow) == moved  # the interval is reproducible


def test_a_commit_is_like_an_end_only_when_it_differs_from_the_other():
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import likeness

    rng = random.Random(1)
    old = [1000 * (1 + rng.gauss(0, 0.02)) for _ in range(8)]
    new = [920 * (1 + rng.gauss(0, 0.02)) for _ in range(8)]
    assert likeness([1000 * (1 + rng.gauss(0, 0.02)) for _ in range(6)], old, new).end == "old"
    assert likeness([920 * (1 + rng.gauss(0, 0.02)) for _ in range(6)], old, new).end == "new"
    halfway = likeness([960 * (1 + rng.gauss(0, 0.002)) for _ in range(8)], old, new)
    assert halfway.end is None and halfway.reason.startswith("differs from both ends")


def test_a_schema_4_record_gains_the_metrics_column(tmp_path):
    path = tmp_path / "bisector.sqlite"
    Store(path).close()
    with sqlite3.connect(path) as db:  # as a schema 4 file was: no metrics column
        db.execute("ALTER TABLE executions DROP COLUMN metrics")
        db.execute("PRAGMA user_version = 4")
    with Store(path) as store:
        store.add_execution("k", Execution("a" * 40, Verdict.GOOD, "exit 0", None, 0.1, None, {},
                                           metrics={"tok_s": 9410.0}))
        store.add_execution("k", Execution("a" * 40, Verdict.GOOD, "exit 0", None, 0.1, None, {}))
        assert [run.metrics for run in store.executions("a" * 40, "k")] == [{"tok_s": 9410.0}, {}]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6


def test_the_adaptive_hunt_names_no_wrong_commit_over_seeds_with_outliers():
    """bench/perf_noise.py's simulation (the real PerfPolicy and Bisection): 3 % noise, an 8 % slowdown and
    5 % of runs 2x slow: right or an honest skip, never a wrong commit, with fewer runs than 10 per commit."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    noise = load_bench()
    right = runs = 0
    for seed in range(20):
        bench = noise.Bench(seed, 32, 0.03, 0.08, 0.05)
        found = noise.adaptive(bench, 20)
        assert found in (None, bench.shas[bench.culprit]), f"seed {seed}: {found}, not {bench.shas[bench.culprit]}"
        right += found is not None
        runs += bench.runs
    assert right >= 18
    assert runs / 20 < 10 * (2 + 5)  # fixed x10: both ends and 5 probes of 32 commits


def test_three_samples_decide_against_ends_of_eight_by_their_likelihood_ratio():
    """Three runs of a commit plainly like one end decide it against ends of 8 samples each (the rank tests
    alone, two-sided at 0.005, cannot: 3 samples beyond 8 give p = 0.012 at best); a 2x outlier among its
    samples moves the likelihood ratio by less than one ordinary run (a heavy-tailed t likelihood), and, far
    beyond both ends, it is set aside: the three ordinary runs decide (before, ranked below every sample of the
    new end, it held the rank check back for two more runs); halfway between the ends nothing is decided."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import likeness, log_likelihood_ratio, within_reach

    rng = random.Random(3)
    old = [1000 * (1 + rng.gauss(0, 0.03)) for _ in range(8)]
    new = [920 * (1 + rng.gauss(0, 0.03)) for _ in range(8)]
    assert likeness([1004.0, 991.0, 1012.0], old, new).end == "old"
    assert likeness([921.0, 915.0, 928.0], old, new).end == "new"
    with_outlier = [1004.0, 502.0, 991.0, 1012.0]  # a busy machine's run: half the throughput
    outlier = log_likelihood_ratio([502.0], old, new)
    assert 0 < outlier < -log_likelihood_ratio([1004.0], old, new)
    assert within_reach(with_outlier, old, new) == [1004.0, 991.0, 1012.0]
    assert likeness(with_outlier, old, new).end == "old"
    assert likeness([502.0, 498.0, 505.0], old, new).end is None  # runs that tell neither end decide nothing
    assert likeness([960.0, 959.0, 961.0], old, new).end is None


def test_the_adaptive_hunt_takes_at_most_half_of_fixed_10s_runs_and_names_no_wrong_commit():
    """bench/perf_noise.py, 3 % noise and an 8 % slowdown over 64 commits, 40 seeds: never a wrong commit, and
    at most half of the fixed 10-repeat strategy's runs, issue 35's goal (before: 54 %; the rank-test policy
    before that about 60 %)."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    noise = load_bench()
    ours = noise.tally(lambda bench: noise.adaptive(bench, 20), 40, 64, 0.03, 0.08, 0.0)
    fixed = noise.tally(lambda bench: noise.fixed(bench, 10), 40, 64, 0.03, 0.08, 0.0)
    assert ours["wrong"] == 0 and ours["right"] >= 39
    assert ours["runs"] <= 0.5 * fixed["runs"]


def test_with_the_ends_known_the_hunts_own_rules_take_under_half_of_fixed_10s_runs():
    """bench/perf_noise.py's `known_ends` reference (issue 35): the real PerfPolicy with each end known from 40
    runs, only its first 5 counted, at 3 % noise, an 8 % slowdown and 10 % outliers: right on every seed, in
    under half of fixed x10's runs (the hunt itself, estimating its ends, takes 55 % there). What the goal
    misses is what estimating the ends costs, not the probes' rules (docs/perf.md, the figures)."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    noise = load_bench()
    fixed = noise.tally(lambda bench: noise.fixed(bench, 10), 12, 64, 0.03, 0.08, 0.10)
    known = noise.tally(lambda bench: noise.known_ends(bench, 20), 12, 64, 0.03, 0.08, 0.10)
    assert known["right"] == 12 and known["runs"] <= 0.5 * fixed["runs"]


def test_ends_with_outliers_are_sampled_further_when_the_direction_is_known():
    """Six runs of each end, two of the good end's 2x slow (a busy machine): the two-sided tests call the ends
    the same (p = 0.59 > 0.37); with --higher-is-better the one-sided test (p = 0.29) leaves them undecided,
    so both ends run again instead of the hunt stopping with "the endpoints do not differ". Without a
    direction the two-sided call stands."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.errors import EndpointError
    from bisector.search.dag import Bisection
    from bisector.search.perf import Direction, PerfSettings
    from bisector.search.policies import Endpoints, PerfPolicy

    good = [962.0, 499.0, 940.0, 995.0, 973.0, 494.0]
    bad = [889.0, 897.0, 932.0, 976.0, 950.0, 450.0]
    shas = ["a" * 40, "b" * 40, "c" * 40]
    for direction in (Direction.HIGHER, Direction.ANY):
        history = {shas[0]: [Execution(shas[0], Verdict.GOOD, "exit 0", None, 0.1, None, {}, metrics={"tok_s": v})
                             for v in good],
                   shas[1]: [],
                   shas[2]: [Execution(shas[2], Verdict.GOOD, "exit 0", None, 0.1, None, {}, metrics={"tok_s": v})
                             for v in bad]}
        ends = Endpoints(old=shas[0], new=shas[2], old_name="good", new_name="bad", old_ref="good", new_ref="bad")
        policy = PerfPolicy(Bisection([(shas[1], [shas[0]]), (shas[2], [shas[1]])], shas[2]), ends,
                            PerfSettings("tok_s", direction), history.__getitem__)
        if direction is Direction.ANY:
            with pytest.raises(EndpointError, match="the endpoints do not differ"):
                next(policy.batches())
        else:
            assert sorted(next(policy.batches()).commits) == [(shas[0], "endpoint"), (shas[2], "endpoint")]


def _one_probe_hunt(good: list[float], probe: list[float], bad: list[float]):
    """(the three shas, a PerfPolicy over good end, one commit, bad end whose stored runs gave these samples)."""
    from bisector.search.dag import Bisection
    from bisector.search.perf import Direction, PerfSettings
    from bisector.search.policies import Endpoints, PerfPolicy

    shas = ["a" * 40, "b" * 40, "c" * 40]
    history = {sha: [Execution(sha, Verdict.GOOD, "exit 0", None, 0.1, None, {}, metrics={"tok_s": value})
                     for value in values] for sha, values in zip(shas, (good, probe, bad))}
    ends = Endpoints(old=shas[0], new=shas[2], old_name="good", new_name="bad", old_ref="good", new_ref="bad")
    policy = PerfPolicy(Bisection([(shas[1], [shas[0]]), (shas[2], [shas[1]])], shas[2]), ends,
                        PerfSettings("tok_s", Direction.HIGHER), history.__getitem__)
    return shas, policy


def test_an_end_whose_few_samples_look_off_runs_again_before_the_probe_does():
    """The bad end's six runs came out low by chance (about 880); a commit's eight runs sit at 920: 10,000s
    of times likelier under the bad end than the good, but not consistent with the bad end's own six samples.
    That end, with fewer samples than the commit, runs again next, not the commit."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import likeness

    good, bad = [1000.0, 1012.0, 991.0, 1005.0, 996.0, 1009.0], [880.0, 871.0, 889.0, 884.0, 876.0, 893.0]
    probe = [920.0, 915.0, 927.0, 918.0, 923.0, 912.0, 925.0, 921.0]
    seen = likeness(probe, good, bad)
    assert seen.end is None and seen.doubted == "new"
    shas, policy = _one_probe_hunt(good, probe, bad)
    assert next(policy.batches()).commits == ((shas[2], "endpoint"),)


def test_an_undecided_commit_with_more_samples_than_an_ends_pool_runs_that_end_again():
    """bench/perf_noise.py seed 156: the good end's five runs came out high by chance (median 1058, the true
    mean 1000), so a good commit's runs at about 990 sit between the ends' medians: likelier under neither end,
    consistent with neither end's pool. Before, the commit ran to the cap of 20 and was skipped while the good
    end kept its five runs; now, once the commit has more samples than an end's pool, that end runs again (the
    smaller pool's: every later commit is weighed against it)."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import likeness

    good, bad = [957.0, 975.0, 1058.0, 1059.0, 1072.0], [878.0, 905.0, 926.0, 928.0, 942.0]
    probe = [990.0, 1000.0, 978.0, 1011.0, 965.0, 997.0, 1016.0, 984.0]
    seen = likeness(probe, good, bad)
    assert seen.end is None and seen.doubted is None
    shas, policy = _one_probe_hunt(good, probe, bad)
    assert next(policy.batches()).commits == ((shas[0], "endpoint"),)


def test_two_runs_of_an_end_in_the_other_ends_phase_make_the_ends_overlap_and_2x_outliers_do_not():
    """bench/perf_noise.py seed 11 under the H200's phases, five runs an end: the good end's all fast, the bad
    end's three slow and two fast. Two runs far from their own end's median yet within reach of the ends are a
    second mode: the ends overlap (before, 2 far runs of 10 were under the quarter that said so, and the hunt
    named a wrong commit). 2x outliers lie beyond both ends: they are set aside, not a second mode."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import overlapping, within_reach

    good, bad = [980.0, 999.0, 1004.0, 1010.0, 1013.0], [618.0, 620.0, 623.0, 926.0, 931.0]
    assert overlapping(good, bad)
    good, bad = [1002.0, 499.0, 985.0, 1011.0, 994.0], [921.0, 905.0, 460.0, 930.0, 917.0]
    assert not overlapping(good, bad)
    assert within_reach(good, good, bad) == [1002.0, 985.0, 1011.0, 994.0]


def test_runs_in_fast_and_slow_phases_leave_a_commit_to_the_strict_rank_tests_against_the_ends_alone():
    """The H200's VM (round 6) ran each engine start in a fast or a slow phase, 1.5x apart, about half each.
    Ends whose runs sit in two such modes overlap: three slow-phase runs of a commit like the old end, a bit
    slower than the old end's own slow runs by chance, are not called like the new end (the likelihood ratio
    around the medians did: the new end's median fell in its slow mode), and the rank tests alone decide, at
    the strict threshold. Unimodal ends 8 % apart under 3 % noise, with a 2x outlier, do not overlap."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import STRICT_THRESHOLD, likeness, one_sided_p, overlapping

    old = [1006.0, 675.0, 1005.0, 672.0, 996.0, 1004.0, 999.0]  # bench/perf_noise.py seed 22, as decided
    new = [936.0, 619.0, 951.0, 627.0, 609.0, 949.0, 632.0]
    slow_runs_of_a_good_commit = [662.0, 669.0, 670.0]
    assert overlapping(old, new)
    assert likeness(slow_runs_of_a_good_commit, old, new).end == "new"  # the model's answer, wrong
    strict = likeness(slow_runs_of_a_good_commit, old, new, strict=True)
    assert strict.end is None and "rank tests alone" in strict.reason
    # what the strict test asks: runs plainly beyond the other end's; 7 above all 7 of the new end's do it
    # (p = 1 / C(14, 7)), 6 do not (1 / C(13, 6) = 0.00058), nor 10 of both phases (p = 0.012)
    fast = [1001.0, 1003.0, 998.0, 1002.0, 1000.0, 1004.0, 997.0]
    assert likeness(fast, old, new, strict=True).end == "old"
    assert likeness(fast[:6], old, new, strict=True).end is None
    fast_and_slow = [1001.0, 669.0, 1003.0, 671.0, 998.0, 1002.0, 673.0, 1000.0, 675.0, 1004.0]
    assert one_sided_p(fast_and_slow, new, lower=False) > STRICT_THRESHOLD
    assert likeness(fast_and_slow, old, new, strict=True).end is None

    rng = random.Random(3)
    unimodal_old = [1000 * (1 + rng.gauss(0, 0.03)) for _ in range(7)] + [500.0]  # and a 2x outlier
    unimodal_new = [920 * (1 + rng.gauss(0, 0.03)) for _ in range(8)]
    assert not overlapping(unimodal_old, unimodal_new)


def test_under_fast_and_slow_phases_the_adaptive_hunt_names_no_wrong_commit():
    """bench/perf_noise.py with the H200's phases (1 % noise inside a phase, half the runs 1.5x slower) and a
    6 % slowdown: the policy before named a wrong commit for seed 36 of 16 commits (and in 6 of 100 seeds of
    64 commits; fixed x10 in 95); now right or an honest skip (300 seeds in docs/perf.md)."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    noise = load_bench()
    for seed in range(30, 40):
        bench = noise.Bench(seed, 16, 0.01, 0.06, 0.0, 0.5, 1.5)
        found = noise.adaptive(bench, 20)
        assert found in (None, bench.shas[bench.culprit]), f"seed {seed}: {found}, not {bench.shas[bench.culprit]}"


def test_the_runs_a_commit_needs_against_overlapping_ends_come_from_how_the_ends_own_runs_rank():
    """Two clean peaks (every good run above every bad one) need about 8 runs a side for the strict one-sided
    rank test (7 beyond 7 give 1 / 3432); the H200's phases, half the runs of each end 1.5x slower, where a
    fast bad run beats a slow good one (a good run beats a bad one in 3 pairs of 4), need about 30, more than
    --max-samples 20; ends that rank no way cannot be told apart by any number."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import runs_to_tell

    assert runs_to_tell([1000.0, 1010.0, 990.0, 1005.0, 995.0], [920.0, 925.0, 915.0, 930.0, 910.0]) == 8
    assert runs_to_tell([1006.0, 675.0, 1005.0, 672.0, 996.0, 669.0], [936.0, 619.0, 951.0, 627.0, 609.0, 940.0]) == 30
    assert runs_to_tell([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == math.inf


def _h200_round_7_runs() -> dict[str, list[float]]:
    """decode tok/s of every run of the H200's round-7 hunt (tests/records/h200-r7-perf-samples.txt), per
    commit, in the order they ran."""
    from pathlib import Path

    runs: dict[str, list[float]] = {}
    records = Path(__file__).parent / "records" / "h200-r7-perf-samples.txt"
    for line in records.read_text().splitlines():
        if line and not line.startswith("#"):
            sha, _role, value = line.split()[:3]
            runs.setdefault(sha, []).append(float(value))
    return runs


def test_a_commit_a_fraction_of_a_per_cent_from_an_end_is_like_it_however_steady_the_runs():
    """The H200's GPU-bound decode (round 7): the ends 5.7 % apart, each end's runs within 0.5 %; c6, after the
    planted commit, ran 0.2 % below the bad end (6 % of the ends' distance). Rank tests told that apart at
    p = 0.013, so c6 stayed undecided for 9 runs until the device time ran out. Its runs are now equivalent to
    the bad end's (the change's interval within a quarter of the ends' distance) at every count from its first
    batch on. A commit 30 % of the way between the ends, as steady, is still like neither."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import first_samples, likeness

    runs = _h200_round_7_runs()
    good, bad = runs["bb781452c1ff"][:6], runs["605860915a99"][:6]  # the ends as the hunt first compared them
    old_pool = [*good, *runs["d8d102b35544"]]  # c4, decided like the good end
    c6 = runs["85abdea83684"]
    for count in range(first_samples(len(bad)), len(c6) + 1):
        seen = likeness(c6[:count], old_pool, bad)
        assert seen.end == "new", (count, seen.reason)
    shift = 0.3 * (sum(good) - sum(bad)) / len(bad)
    partial = [value + shift for value in c6]
    assert likeness(partial, old_pool, bad).end is None


def _h200_round_8_shared_gpu_runs() -> dict[str, list[float]]:
    """decode tok/s of every run of the H200's round-8 hunt on two slots sharing the GPU (the second section of
    tests/records/h200-r8-perf-samples.txt), per commit, in the order they landed."""
    from pathlib import Path

    records = Path(__file__).parent / "records" / "h200-r8-perf-samples.txt"
    shared = records.read_text().split("\n## ")[2]
    runs: dict[str, list[float]] = {}
    for line in shared.splitlines()[1:]:
        sha, _role, value = line.split()[:3]
        runs.setdefault(sha, []).append(float(value))
    return runs


def test_the_h200_hunt_on_a_shared_gpu_is_decided_as_it_was_there():
    """Round 8 on the H200, two steps sharing the GPU (each timing alone behind the GPU's timing gate): the ends
    5.7 % apart after 5 runs each (as on a GPU of their own in round 7), c4 (before the planted commit, 0.2 %
    below the good end) called like the good end at its 4th run; the statistics as they are now (changed after
    that run) decide the same, and not before enough runs."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import first_samples, likeness

    runs = _h200_round_8_shared_gpu_runs()
    good, bad, c4 = runs["bb781452c1ff"], runs["6074cf1b1f0d"], runs["d8d102b35544"]
    assert len(good) == len(bad) == 5 and len(c4) == 4
    assert likeness(c4, good, bad).end == "old"
    for count in range(1, first_samples(len(bad))):
        assert likeness(c4[:count], good, bad).end is None, count


def test_runs_of_two_modes_are_never_equivalent_to_an_end_whose_median_they_happen_to_sit_near():
    """A wrong answer of the bench under the H200's phases (seed 52 of `--noise 0.01 --slowdown 0.06 --slow-phase
    0.5`), as the hunt weighed it: a good commit whose six runs all fell in the slow phase sits near the bad pool's
    median (its runs mostly in that phase too), while the good pool's runs lie in both modes, its median between
    them. The ends' distance means nothing there, so no equivalence is taken from it: the commit is not called
    like the bad end."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import likeness

    good = [658.92, 660.56, 661.21, 662.18, 663.21, 663.24, 663.48, 664.57, 665.27, 669.11, 670.64, 670.83, 675.02,
            675.64, 977.14, 987.41, 988.12, 988.6, 988.73, 995.27, 995.33, 995.33, 996.68, 997.64, 998.36, 999.57,
            1004.19, 1008.79, 1011.35, 1018.08]
    bad = [618.92, 621.53, 621.96, 624.1, 624.52, 625.65, 626.72, 626.97, 628.56, 632.29, 634.11, 635.66, 637.03,
           639.18, 639.49, 644.05, 930.08, 937.93, 960.62]
    assert likeness([665.54, 663.38, 670.55, 666.98, 668.01, 669.66], good, bad).end != "new"


def test_an_ends_second_mode_that_inflated_the_pooled_scale_still_makes_the_ends_overlap():
    """Issue 35 at 3 % noise, an 8 % slowdown, 10 % 2x outliers and the H200's phases: the pooled scale, grown
    by the second mode's runs, put no run far from its end, so `overlapping` said no and probes were weighed
    against biased pools (wrong answers for bench seeds 11, 79, 138, 142 and 153). Bench seed 11's ends as c0015
    was decided: the good end's runs fast and slow, the bad end's two fast runs next to the good end's median,
    many more than the model puts there (crossing_p). Seed 153's: the bad end's runs in two clusters, its
    median between them (two_modes). Single peaks with a 2x outlier, and steady runs, do not overlap."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import CROSSING_P, crossing_p, overlapping, two_modes

    good = [1039.0, 1011.0, 939.0, 997.0, 1030.0, 689.0, 701.0, 1060.0, 1038.0, 996.0, 674.0]
    bad = [879.0, 594.0, 604.0, 293.0, 894.0]
    assert crossing_p(good, bad) <= CROSSING_P
    assert overlapping(good, bad)
    good = [1021.0, 1044.0, 965.0, 979.0, 676.0, 987.0, 988.0, 638.0, 1024.0, 665.0, 696.0, 1035.0, 1036.0]
    bad = [930.0, 856.0, 870.0, 593.0, 600.0, 908.0, 908.0, 593.0, 637.0, 840.0, 301.0, 631.0]
    assert two_modes([value for value in bad if value > 400])
    assert overlapping(good, bad)

    rng = random.Random(35)
    for size in (5, 8, 12, 20):
        old = [1000 * (1 + rng.gauss(0, 0.03)) for _ in range(size)] + [500.0]
        new = [920 * (1 + rng.gauss(0, 0.03)) for _ in range(size)]
        assert not overlapping(old, new), size
        assert not two_modes(old[:-1]) and not two_modes(new)
    assert not two_modes([6735.0, 6741.0, 6744.0, 6748.0, 6750.0, 6753.0])


def test_under_phases_and_outliers_the_adaptive_hunt_names_no_wrong_commit():
    """bench/perf_noise.py `--noise 0.03 --slowdown 0.08 --outliers 0.1 --slow-phase 0.5 --phase-factor 1.5`:
    the seeds on which the policy before named a wrong commit (6 of 300) are now right or an honest skip."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    noise = load_bench()
    for seed in (11, 79, 138, 142, 153, 263):
        bench = noise.Bench(seed, 64, 0.03, 0.08, 0.1, 0.5, 1.5)
        found = noise.adaptive(bench, 20)
        assert found in (None, bench.shas[bench.culprit]), f"seed {seed}: {found}, not {bench.shas[bench.culprit]}"


def _replay(seed: int, noise: float, slowdown: float, outliers: float, slow_phase: float, phase_factor: float):
    """bench/perf_noise.py's hunt of one seed (64 commits): (the commit it named or None, the culprit)."""
    noise_bench = load_bench()
    bench = noise_bench.Bench(seed, 64, noise, slowdown, outliers, slow_phase, phase_factor)
    return noise_bench.adaptive(bench, 20), bench.shas[bench.culprit]


def test_runs_set_aside_as_telling_neither_end_do_not_join_an_ends_pool_with_the_probe_decided_like_it():
    """Issue 35, the two wrong answers round 7 left under phases: both ends' medians in one mode, so the other
    mode's runs lay beyond both and were set aside as outliers. A probe decided like an end on its runs within
    reach joined that end's pool with all its runs, the set-aside ones too: the pool's median moved between the
    modes (seed 11 at 2 %/5 %, 5 % outliers, 30 % of runs 1.3x slower: the bad pool's median went from 930 to
    835 with c0031's five slow runs) and a good commit's slow runs were called like the bad end. Now a decided
    probe brings to the pool only its runs within reach of the ends; both seeds are right or an honest skip."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    for seed, setting in ((109, (0.03, 0.08, 0.0, 0.5, 1.5)), (11, (0.02, 0.05, 0.05, 0.3, 1.3))):
        found, culprit = _replay(seed, *setting)
        assert found in (None, culprit), f"seed {seed} of {setting}: {found}, not {culprit}"

    good, bad = [1000.0, 1012.0, 991.0, 1005.0, 996.0, 1009.0], [920.0, 931.0, 912.0, 925.0, 917.0, 928.0]
    shas, policy = _one_probe_hunt(good, [921.0, 918.0, 460.0, 926.0, 915.0], bad)
    assert list(policy.batches()) == [] and policy.verdicts[shas[1]][0] == "new"
    assert sorted(policy.pool("new")) == sorted([*bad, 921.0, 918.0, 926.0, 915.0])


def test_an_ends_two_modes_are_seen_through_2x_outliers_that_the_grown_scale_kept_in_reach():
    """Bench seed 212 under the H200's phases with 10 % outliers (`--noise 0.01 --slowdown 0.06 --outliers 0.1
    --slow-phase 0.5`), its ends as a good commit was called like the bad end: the good end's median fast, the
    bad end's slow, the pooled scale 248 for a distance of 359, so the 2x outliers lay within reach and, as one
    cluster's part, hid the two modes from the split (and no check said the ends overlap). The runs' lowest and
    highest tenth left out, the clusters show. One peak with two 2x outliers in 20 runs is still one peak."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.perf import overlapping, two_modes

    good = [330.0, 651.0, 662.0, 667.0, 672.0, 674.0, 677.0, 679.0, 687.0, 988.0, 996.0, 998.0, 998.0, 998.0,
            999.0, 1002.0, 1004.0, 1005.0, 1013.0, 1020.0]
    bad = [312.0, 468.0, 468.0, 622.0, 625.0, 625.0, 626.0, 630.0, 632.0, 637.0, 638.0, 924.0, 928.0, 931.0,
           936.0, 939.0, 946.0, 949.0, 951.0]
    assert two_modes(good) and two_modes(bad)
    assert overlapping(good, bad)
    rng = random.Random(212)
    for _ in range(20):
        peak = [1000 * (1 + rng.gauss(0, 0.01)) for _ in range(18)] + [500.0, 495.0]
        assert not two_modes(peak)


def test_against_overlapping_ends_the_end_with_fewer_runs_of_its_own_runs_again_not_the_smaller_pool():
    """Where the ends' runs overlap, a commit is weighed against the ends' own runs, not the pools: an
    undecided commit with more samples than an end's own runs runs that end again, however many runs of probes
    decided like it its pool holds. (Bench seed 97 under phases with 10 % outliers, with the pools cleaned of
    set-aside runs: the bad end's nine runs, one fast, against a bad commit's sixteen, nine fast, and the good
    end ran instead, its pool being the smaller; the commit was called like the good end.)"""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    from bisector.search.dag import Bisection
    from bisector.search.perf import Direction, PerfSettings, overlapping, runs_to_tell
    from bisector.search.policies import Endpoints, PerfPolicy

    good, bad = [1006.0, 1005.0, 996.0, 1003.0, 672.0], [619.0, 627.0, 609.0, 622.0, 949.0, 615.0]
    assert overlapping(good, bad) and runs_to_tell(good, bad) <= 20
    decided_good = [1001.0, 1003.0, 998.0, 1002.0, 1000.0, 1004.0, 997.0, 999.0]  # above every bad run
    undecided = [1001.0, 669.0, 1003.0, 671.0, 998.0, 673.0, 1000.0, 675.0]
    shas = [letter * 40 for letter in "abcd"]
    history = {sha: [Execution(sha, Verdict.GOOD, "exit 0", None, 0.1, None, {}, metrics={"tok_s": value})
                     for value in values] for sha, values in zip(shas, (good, decided_good, undecided, bad))}
    ends = Endpoints(old=shas[0], new=shas[3], old_name="good", new_name="bad", old_ref="good", new_ref="bad")
    policy = PerfPolicy(Bisection([(shas[i], [shas[i - 1]]) for i in range(1, 4)], shas[3]), ends,
                        PerfSettings("tok_s", Direction.HIGHER), history.__getitem__)
    batch = next(policy.batches())
    assert policy.verdicts[shas[1]][0] == "old" and len(policy.pool("old")) > len(policy.pool("new"))
    assert policy.sampling is not None and policy.sampling[0] == shas[2] and policy.doubted is None
    assert batch.commits == ((shas[0], "endpoint"),)


def _replay_h200_round_9(after_each_run=lambda policy, runs: None, record="h200-r9-hunt.json", slots=2):
    """An H200 round-9 hunt (tests/records/h200-r9-hunt.json: two slots sharing the GPU;
    h200-r9-three-slots-hunt.json: three) replayed through the real PerfPolicy over the real history, each
    commit's recorded runs given in the order they landed; after_each_run(policy, runs so far) is called as each
    lands. Returns (the policy as it ended, the history's shas, runs given)."""
    from pathlib import Path

    from bisector.search.dag import Bisection
    from bisector.search.perf import Direction, PerfSettings
    from bisector.search.policies import Endpoints, PerfPolicy

    records = Path(__file__).parent / "records"
    hunt = json.loads((records / record).read_text())
    shas = [commit["sha"] for commit in json.loads((records / "h200-r8-perf-history.json").read_text())]
    recorded = {entry["sha"]: list(entry["samples"]) for entry in hunt["perf"]["commits"]}
    assert hunt["first_bad"]["sha"] == shas[5] and len(hunt["steps"]) == 21  # as the H200 named it
    history: dict[str, list[Execution]] = {sha: [] for sha in shas}
    commits = [(sha, [shas[n - 1]]) for n, sha in enumerate(shas)][1:]
    ends = Endpoints(old=shas[0], new=shas[-1], old_name="good", new_name="bad", old_ref="v0.24.0",
                     new_ref="history")
    settings = PerfSettings("decode_tok_s", Direction.HIGHER, 0.02, 0, 12, parallel=slots)
    policy = PerfPolicy(Bisection(commits, ends.new), ends, settings, history.__getitem__)
    batches = policy.batches()
    batch, given = next(batches, None), 0
    while batch is not None:
        for sha, _ in batch.commits:
            runs = history[sha]
            assert len(runs) < len(recorded.get(sha, [])), f"the replay wants run {len(runs) + 1} of {sha[:12]}"
            runs.append(Execution(sha, Verdict.GOOD, "exit 0", None, 0.0, None, {},
                                  metrics={"decode_tok_s": recorded[sha][len(runs)]}))
            given += 1
            after_each_run(policy, given)
        try:
            batch = batches.send([])
        except StopIteration:
            batch = None
    return policy, shas, given


@pytest.mark.parametrize("record, slots", [("h200-r9-hunt.json", 2), ("h200-r9-three-slots-hunt.json", 3)])
def test_the_h200_hunt_to_the_planted_commit_replays_to_the_same_answer_on_its_own_runs(record, slots):
    """Round 9 on the H200: the whole hunt of the planted decode slowdown (two steps sharing the GPU, then
    three) named the planted commit in 21 runs. Replayed on its own runs, the hunt asks for no run the H200 did
    not give and names the same commit in the same runs."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    policy, shas, given = _replay_h200_round_9(record=record, slots=slots)
    assert policy.answer().first_new == shas[5]
    assert given == 21


def test_a_performance_hunts_progress_counts_the_runs_left_not_the_probes():
    """On the H200 the progress line said "~3 steps to go" with 11 runs left (a step of a performance hunt is
    one run; the count was of probes), and its ETA was a quarter of the time left. Replayed, the runs-left
    estimate after each run is within 3 of the runs the hunt still took (it was 8 short after the ends)."""
    pytest.importorskip("scipy", reason="the statistics need scipy (the `perf` extra)")
    estimates: list[tuple[int, int]] = []
    _replay_h200_round_9(lambda policy, given: estimates.append((given, policy.progress()[1])))
    assert len(estimates) == 21
    for given, left in estimates[:-1]:
        assert abs(left - (21 - given)) <= 3, estimates
