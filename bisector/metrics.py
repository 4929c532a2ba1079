"""The metric protocol: how a step reports measurements (a performance hunt's samples).

A command prints `BISECTOR_METRIC name=value` lines (several names allowed; the last value of a name in
one run wins), or writes a JSON object {name: value} to the file named by `$BISECTOR_METRIC_FILE`; a named
scenario returns them in its Outcome's `metrics`. One run gives one sample of each name it reports.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable, Mapping

MARKER = "BISECTOR_METRIC"
FILE_VARIABLE = "BISECTOR_METRIC_FILE"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:/-]*")
LINE = re.compile(rf"{MARKER}\s+({NAME.pattern})\s*=\s*(\S+)")


class MetricError(ValueError):
    """A metric file that cannot be read as {name: number}."""


def finite(value: object) -> float | None:
    """value as a finite float, else None (booleans are not measurements)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def parse_lines(lines: Iterable[str]) -> dict[str, float]:
    """The metrics `BISECTOR_METRIC name=value` lines report, the last value of each name winning; a line
    whose value is not a finite number is ignored."""
    found: dict[str, float] = {}
    for line in lines:
        for name, raw in LINE.findall(line):
            value = finite(raw)
            if value is not None:
                found[name] = value
    return found


def parse_output(output: str) -> dict[str, float]:
    """The metrics of one run's output as its log keeps it (the head and the tail of a long one, so the
    last value printed is kept)."""
    return parse_lines(output.splitlines())


def read_file(path: Path) -> dict[str, float]:
    """The metrics a run wrote to its $BISECTOR_METRIC_FILE ({} when it wrote none); MetricError when the
    file holds anything but a JSON object of names to finite numbers."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricError(f"{FILE_VARIABLE} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise MetricError(f"{FILE_VARIABLE} {path}: not JSON ({exc})") from None
    if not isinstance(data, Mapping):
        raise MetricError(f"{FILE_VARIABLE} {path}: not a JSON object of name: number")
    found: dict[str, float] = {}
    for name, raw in data.items():
        value = finite(raw)
        if not NAME.fullmatch(str(name)) or value is None:
            raise MetricError(f"{FILE_VARIABLE} {path}: {name!r}: {raw!r} is not a metric name and finite number")
        found[str(name)] = value
    return found
