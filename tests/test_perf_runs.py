"""The bench goal of performance hunts (issue 35): bench/perf_noise.py's seeded hunts, the real PerfPolicy over
the real Bisection, against a fixed 10 runs per end and per probe."""
import pytest
from helpers.perf_noise_bench import load_bench

pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")

pytestmark = pytest.mark.unit

def test_noisy_hunts_take_fewer_runs_and_name_no_wrong_commit():
    """50 seeded 64-commit histories, 3 % noise, an 8 % slowdown: every hunt names the culprit, and the hunts
    take at most 48 runs each on average (probes start at 3 samples against the ends' pools; before, 4
    samples against the ends alone and an end repeat with every probe took 49.3), under 60 % of fixed x10's."""
    perf_noise = load_bench()
    runs, fixed_runs = 0, 0
    for seed in range(50):
        bench = perf_noise.Bench(seed, 64, 0.03, 0.08, 0.0)
        assert perf_noise.adaptive(bench, 20) == bench.shas[bench.culprit], seed
        runs += bench.runs
        fixed = perf_noise.Bench(seed, 64, 0.03, 0.08, 0.0)
        perf_noise.fixed(fixed, 10)
        fixed_runs += fixed.runs
    assert runs / 50 <= 48, runs / 50
    assert runs < 0.6 * fixed_runs
