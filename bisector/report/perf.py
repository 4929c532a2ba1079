"""A performance hunt in reports: the change in words ("tok_s 10,340 → 9,410 (−9.0 %, 95 % CI −10.1 … −7.8 %,
p = 2e-6)"), a line per tested commit, and an SVG plot of the metric per tested commit in history order
(median and spread, coloured by verdict, the culprit marked), and the verdict a step list shows for each run.
Reads the result's `perf` record (bisector.search.perf.PerfRecord); hand-written SVG, no plotting library."""
from __future__ import annotations

import html
import math
from typing import Sequence

from bisector.record.results import StepRecord
from bisector.search.perf import CONFIDENCE, Change, PerfRecord

COLOURS = {"good": "#2e7d32", "bad": "#c62828", "skip": "#f9a825"}
MINUS = "\u2212"
PLOT_MARK = "<!-- bisector: a performance hunt's plot (beside its JSON report, rewritten by each hunt) -->"


def number(value: float) -> str:
    """A measurement for people: thousands separated, about four significant digits."""
    size = abs(value)
    if not size:
        return "0"
    digits = 0 if size >= 1000 else 1 if size >= 100 else 2 if size >= 1 else 4
    return f"{value:,.{digits}f}".replace("-", MINUS)


def percent(fraction: float) -> str:
    return f"{fraction * 100:+.1f} %".replace("-", MINUS)


def p_text(p: float) -> str:
    """A p-value as 2e-6 (one significant digit; 0.04 as it is)."""
    if p <= 0:
        return "0"
    if p >= 0.001:
        return f"{p:.2g}"
    mantissa, exponent = f"{p:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def signed(value: float) -> str:
    return ("+" if value >= 0 else "") + number(value)


def moved_text(change: Change) -> str:
    """A change in words: `−9.0 %` of the magnitude of the baseline; from a baseline of 0, `+5.00 absolute, from 0`."""
    if change.relative is None:
        return f"{signed(change.absolute)} absolute, from 0"
    return percent(change.relative)


def change_text(metric: str, change: Change) -> str:
    """`tok_s 10,340 → 9,410 (−9.0 %, 95 % CI −10.1 … −7.8 %, p = 2e-6)`; from a baseline of 0 the change and
    its interval in the metric's units (`errors 0 → 5.00 (+5.00 absolute, from 0; 95 % CI +5.00 … +6.00, …)`)."""
    low, high = change.low, change.high
    confidence = round(CONFIDENCE * 100)
    interval = f"{signed(low)} … {signed(high)}" if change.relative is None else \
        f"{percent(low).removesuffix(' %')} … {percent(high)}"
    said = moved_text(change)
    return (f"{metric} {number(change.before)} → {number(change.after)} ({said}"
            f"{';' if change.relative is None else ','} {confidence} % CI {interval}, "
            f"p = {p_text(change.p_value)})")


def notes(perf: PerfRecord) -> list[str]:
    """The hunt in lines: the ends' change, then each tested commit's samples and verdict, history order."""
    lines = []
    settings = perf.settings
    direction = "" if settings.direction == "any" else f"; {settings.direction.value.replace('-', ' ')}"
    if perf.change:
        lines.append(f"performance: {change_text(settings.metric, perf.change)} from {perf.old_name} "
                     f"to {perf.new_name}{direction}")
    lines.append(f"  min change {settings.min_change * 100:g} %, warm-up {settings.warmup} run(s), at most "
                 f"{settings.max_samples} samples per commit")
    for entry in perf.commits:
        said = f"{entry.sha[:12]} {entry.verdict:<4} {len(entry.samples)} sample(s)"
        if entry.median is not None:  # it has samples
            said += f", median {number(entry.median)}"
            if entry.change and entry.role == "probe":
                said += f" ({moved_text(entry.change)})"
        if entry.reason:
            said += f": {entry.reason}"
        lines.append("  " + said)
    return lines


def step_verdict(perf: PerfRecord | None, step: StepRecord) -> str:
    """The verdict a step list shows for one run: its own (exit code) verdict, except that in a performance
    hunt a run that measured (not skip) shows what the hunt decided for its commit: "like good" / "like bad"
    (a probe, in the ends' names), "undecided" (a skip, or still being sampled when the hunt stopped), or an
    end's own name; every such run exits good."""
    if not perf or step.verdict == "skip":
        return step.verdict
    for entry in perf.commits:
        if entry.sha == step.sha:
            if entry.role == "endpoint":
                return entry.verdict
            return "undecided" if entry.verdict in ("skip", "undecided") else f"like {entry.verdict}"
    return step.verdict


def plan_text(metric: str, fewest: int, most: int, testable: int, timeout: float | None, slots: int = 1) -> str:
    """`--plan` of a performance hunt: how many runs, and what bounds their time (slots runs side by side)."""
    side = f" / {slots} slots" if slots > 1 else ""
    time = (f"at most {most} × --timeout {timeout:g}s{side} = {most * timeout / slots / 3600:.1f} h" if timeout
            else "each run takes as long as one run of the benchmark"
            + (f", {slots} side by side" if slots > 1 else "") + "; time one to know")
    return (f"performance hunt on {metric}: {testable} commits to search; about {fewest} runs if each "
            f"commit decides at its first samples, {most} at most; {time}")


def svg(perf: PerfRecord, order: Sequence[str], culprit: str | None) -> str:
    """The metric per tested commit in history order (order: the range, oldest first): each commit's
    quartiles as a bar, its median as a dot, its samples as faint ticks, coloured by verdict; the culprit
    marked by a line and a label."""
    e, metric = html.escape, perf.settings.metric
    index = {sha: n for n, sha in enumerate(order)}
    tested = sorted((entry for entry in perf.commits if entry.samples), key=lambda entry: index.get(entry.sha, -1))
    width, height, left, right, top, bottom = 720, 300, 70, 20, 30, 70
    values = [value for entry in tested for value in entry.samples] or [0.0, 1.0]
    low, high = min(values), max(values)
    pad = (high - low) * 0.08 or abs(high) * 0.05 or 1.0
    low, high = low - pad, high + pad
    step = (width - left - right) / max(len(tested), 1)

    def x(n: int) -> float:
        return left + step * (n + 0.5)

    def y(value: float) -> float:
        return top + (high - value) / (high - low) * (height - top - bottom)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             PLOT_MARK,
             f"<title>{e(metric)} per tested commit</title>",
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="16" font-size="13">{e(metric)} per tested commit, oldest first '
             f'(median and quartiles; {e(str(perf.settings.direction))})</text>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>']
    ticks = _ticks(low, high)
    decimals = max(0, -math.floor(math.log10(ticks[1] - ticks[0]))) if len(ticks) > 1 else 2
    for value in ticks:
        parts.append(f'<line x1="{left - 4}" y1="{y(value):.1f}" x2="{width - right}" y2="{y(value):.1f}" '
                     f'stroke="#eee"/><text x="{left - 6}" y="{y(value) + 4:.1f}" text-anchor="end">'
                     f"{value:,.{decimals}f}</text>")
    for n, entry in enumerate(tested):
        colour = COLOURS.get(entry.verdict, "#555")
        cx = x(n)
        if entry.sha == culprit:
            parts.append(f'<line x1="{cx:.1f}" y1="{top}" x2="{cx:.1f}" y2="{height - bottom}" stroke="#c62828" '
                         f'stroke-dasharray="4 3"/><text x="{cx:.1f}" y="{top - 4}" text-anchor="middle" '
                         f'fill="#c62828">▼ culprit</text>')
        for value in entry.samples:
            parts.append(f'<line x1="{cx - 6:.1f}" y1="{y(value):.1f}" x2="{cx + 6:.1f}" y2="{y(value):.1f}" '
                         f'stroke="{colour}" stroke-opacity="0.35"/>')
        q1, median, q3 = entry.q1, entry.median, entry.q3
        assert q1 is not None and median is not None and q3 is not None  # a commit with samples has them
        parts.append(f'<rect x="{cx - 4:.1f}" y="{y(q3):.1f}" width="8" '
                     f'height="{max(y(q1) - y(q3), 1):.1f}" fill="{colour}" fill-opacity="0.5"/>'
                     f'<circle cx="{cx:.1f}" cy="{y(median):.1f}" r="4" fill="{colour}">'
                     f"<title>{e(entry.sha[:12])} {e(entry.verdict)}: median {e(number(median))}, "
                     f"{len(entry.samples)} samples</title></circle>"
                     f'<text transform="translate({cx + 3:.1f},{height - bottom + 8}) rotate(60)" '
                     f'font-family="monospace" font-size="9">{e(entry.sha[:8])}</text>')
    legend = "".join(f'<circle cx="{left + 80 * n + 5}" cy="{height - 8}" r="4" fill="{colour}"/>'
                     f'<text x="{left + 80 * n + 12}" y="{height - 4}">{e(name)}</text>'
                     for n, (name, colour) in enumerate(COLOURS.items()))
    parts += [legend, "</svg>"]
    return "\n".join(parts) + "\n"


def _ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About `count` round values between low and high."""
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [first + n * step for n in range(count + 2) if first + n * step <= high]
