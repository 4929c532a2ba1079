"""bench/perf_noise.py loaded as a module, for the tests that run its seeded hunts."""
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "perf_noise.py"


def load_bench():
    """A fresh module of bench/perf_noise.py (its Bench, adaptive, fixed, tally, known_ends ...)."""
    spec = importlib.util.spec_from_file_location("perf_noise", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
