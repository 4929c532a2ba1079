"""check=perf: the measurements the child printed (child.PERF_MARKER lines) as the run's metrics. Pure.

The child measures decode throughput and time to first token several times inside one engine start, after
a warm-up; the run reports the median of each (one sample per run for `bisector run --metric`), and every
measurement in its details.
"""
from __future__ import annotations

import json
import statistics

from scenarios.dpa_fp8_kv.child import PERF_MARKER

METRICS = ("decode_tok_s", "ttft_ms")


def measurements(output: str) -> list[dict[str, float]]:
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
            measured = {name: float(record[name]) for name in METRICS if isinstance(record.get(name), (int, float))}
            if measured:
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
    return medians, {"perf": {"measurements": found, **{name: round(value, 3) for name, value in medians.items()}}}
