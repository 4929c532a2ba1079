"""The metric protocol's parsing, the performance statistics (Pinpoint's comparison over scipy.stats), and
the record's metrics column (schema 6, migrated from 4)."""
import json
import random
import sqlite3

import pytest

from bisector.metrics import MetricError, parse_output, read_file
from bisector.seams import Verdict
from bisector.store import SCHEMA_VERSION, Execution, Store

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
    from bisector.perf import LOW_THRESHOLD, Result, change, compare

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
    from bisector.perf import likeness

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
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("perf_noise", Path(__file__).parents[1] / "bench" / "perf_noise.py")
    noise = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noise)
    right = runs = 0
    for seed in range(20):
        bench = noise.Bench(seed, 32, 0.03, 0.08, 0.05)
        found = noise.adaptive(bench, 20)
        assert found in (None, bench.shas[bench.culprit]), f"seed {seed}: {found}, not {bench.shas[bench.culprit]}"
        right += found is not None
        runs += bench.runs
    assert right >= 18
    assert runs / 20 < 10 * (2 + 5)  # fixed x10: both ends and 5 probes of 32 commits
