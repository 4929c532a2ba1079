"""check=perf: the measurements the child printed (child.PERF_MARKER lines) as the run's metrics. Pure.

The child measures decode throughput and time to first token several times inside one engine start, after
a warm-up; the run reports the median of each (one sample per run for `bisector run --metric`), and every
measurement in its details with how its decode was measured (`method`: "engine-steps", the median of the
timed engine steps, their median, interquartile range and mean in ms; or "two-generates" on an engine
without step()).
"""
from __future__ import annotations

import json
import statistics

from scenarios.dpa_fp8_kv.child import PERF_MARKER

# cpu_ms_per_step: the CPU time of the engine's processes per decode step, a metric for a CPU-side regression
# on a machine whose wall time drifts (a VM's host taking its CPUs away does not count in it)
METRICS = ("decode_tok_s", "ttft_ms", "cpu_ms_per_step")
# engine-steps: the timed steps, and what the machine did meanwhile (child.machine_figures, the GPU's clock)
STEP_FIGURES = ("steps", "step_ms_median", "step_ms_iqr", "step_ms_mean", "steal_ms", "sm_clock_mhz")


def measurements(output: str) -> list[dict]:
    """The child's measurements, in the order printed (lines that do not parse are left out)."""
    found = []
    for line in output.splitlines():
        at = line.find(PERF_MARKER + " ")
        if at < 0:
            continue
        try:
            record = json.loads(line[at + len(PERF_MARKER) + 1:])
        except ValueError:
            continue
        if isinstance(record, dict):
            measured: dict = {name: float(record[name]) for name in METRICS if _number(record.get(name))}
            if measured:
                measured |= {name: record[name] for name in STEP_FIGURES if _number(record.get(name))}
                if isinstance(record.get("method"), str):
                    measured["method"] = record["method"]
                found.append(measured)
    return found


def metrics(output: str) -> tuple[dict[str, float], dict]:
    """(the run's metrics: the median of each measurement, its details: every measurement); ({}, {}) when
    the child printed none."""
    found = measurements(output)
    if not found:
        return {}, {}
    medians = {name: statistics.median(values) for name in METRICS
               if (values := [record[name] for record in found if name in record])}
    methods = sorted({record["method"] for record in found if "method" in record})
    return medians, {"perf": {**({"method": ", ".join(methods)} if methods else {}), "measurements": found,
                              **{name: round(value, 3) for name, value in medians.items()}}}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
