"""The tables printed to a terminal: `bisector runs` (a line per recorded run) and `bisector run --plan`."""
from __future__ import annotations

import shlex
import time
from typing import Mapping, Sequence

from bisector.record.backport_results import BackportResult
from bisector.record.plan import Plan
from bisector.record.results import BisectResult, named
from bisector.record.runs import StoredRun
from bisector.redact import redact
from bisector.report.backport import backport_summary
from bisector.report.documents import printable, published, short_ends

RUNS_COLUMNS = ("ID", "STARTED", "ENDED", "KIND", "STATE", "REPOSITORY", "RANGE", "ANSWER", "COMMAND")
# When `bisector runs` must fit a terminal: the fields cut first, with the least each keeps (the repository is
# shown only when runs of several are listed); then the command, then the repository, left out.
RUNS_ELIDED = {"COMMAND": 12, "REPOSITORY": 16, "ANSWER": 18, "RANGE": 12}
RUNS_DROPPED = ("COMMAND", "REPOSITORY")


@published
def runs_table(rows: Sequence[Mapping], names: Mapping[str, str] | None = None, width: int | None = None) -> str:
    """`bisector runs`: a header, then a line per recorded run: id, when it started and ended, kind, state,
    repository (when the runs are of several), range (or fix), answer, command. Within width columns when
    given: long fields are cut, marked … (`bisector report ID` shows them whole). names (sha -> tag or branch)
    name the commits of a run with no result yet (its result's names otherwise)."""
    cells = [dict(zip(RUNS_COLUMNS, RUNS_COLUMNS)), *(_run_cells(row, names) for row in rows)]
    widths = {column: max(len(cell[column]) for cell in cells) for column in RUNS_COLUMNS
              if column != "REPOSITORY" or len({cell["REPOSITORY"] for cell in cells[1:]}) > 1}

    def over() -> int:
        return sum(widths.values()) + 2 * (len(widths) - 1) - width if width else 0

    for column, least in RUNS_ELIDED.items():
        if column in widths and over() > 0:
            widths[column] = max(min(least, widths[column]), widths[column] - over())
    for column in RUNS_DROPPED:
        if over() > 0:
            widths.pop(column, None)
    lines = []
    for cell in cells:
        fields = [_elided(cell[column], size, at_start=column == "REPOSITORY") for column, size in widths.items()]
        fields[0] = fields[0].rjust(widths["ID"])
        line = "  ".join(field.ljust(size) for field, size in zip(fields, widths.values())).rstrip()
        lines.append(_elided(line, width) if width else line)
    return "\n".join(lines)


def _run_cells(row: Mapping, names: Mapping[str, str] | None) -> dict[str, str]:
    """One run's fields for runs_table, printable and without credentials before any is cut."""
    run = StoredRun.from_row(row)
    params, result = run.params, run.result
    names = result.names if result else names or {}
    if run.kind == "backport":
        span = f"fix {named(params.fix or '', names)} on {' '.join(params.globs)}"
        answer = backport_summary(result) if isinstance(result, BackportResult) else "-"
    else:
        span = f"{short_ends(params.good, names)}..{short_ends(params.bad, names)}"
        answer = _run_answer(result) if isinstance(result, BisectResult) else "-"
        if params.parent_run is not None:
            answer += f" (level {params.level} of --follow-pins, under run {params.parent_run})"
    command = shlex.join(params.command_line) if params.command_line else params.scenario
    started, ended = (time.localtime(moment) if moment else None for moment in (run.started, run.ended))
    fields = {"ID": str(run.id), "STARTED": time.strftime("%Y-%m-%d %H:%M", started) if started else "-",
              "ENDED": "-" if ended is None else time.strftime(
                  "%H:%M" if started and started[:3] == ended[:3] else "%Y-%m-%d %H:%M", ended),
              "KIND": run.kind, "STATE": run.status, "REPOSITORY": params.repo or "-", "RANGE": span,
              "ANSWER": answer, "COMMAND": f"$ {command}"}
    return {column: redact(printable(" ".join(text.split()))) for column, text in fields.items()}


def _elided(text: str, width: int, at_start: bool = False) -> str:
    """text cut to width characters at its end (or start: a path's last folders tell most), marked with …."""
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1:] if at_start else text[:max(width - 1, 0)] + "…"


def _run_answer(result: BisectResult) -> str:
    """A bisection's answer in a few words (with the last level's, when levels followed it)."""
    if result.stopped:
        answer = f"{result.outcome}: {result.stopped}"
    elif result.culprit:
        answer = f"{result.culprit_label} {result.named(result.culprit.sha)}"
    else:
        answer = f"{len(result.candidates)} candidates"
    last = result.levels[-1] if result.levels else None
    if last and last.level:
        answer += f"; level {last.level.number} ({last.level.dependency.upper()}): {_run_answer(last)}"
    return answer


def _minutes_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


PLAN_WIDTH = 36  # the widest a --plan column gets; a longer value is cut with "…"


@published
def plan_text(plan: Plan) -> str:
    """`bisector run --plan`: the first commits to test, the build each needs and its commands."""
    imaged = f", {plan.imaged} of them with an image" if plan.imaged is not None else ""
    lines = [f"plan: {plan.commits} commits in range{imaged}, --build {plan.builder}"]
    if plan.rounds is not None:
        one = f" (one slot: about {plan.rounds_one_slot})" if plan.slots > 1 else ""
        lines.append(f"rounds: about {plan.rounds} after the endpoints with {plan.slots} "
                     f"{'slot' if plan.slots == 1 else 'slots'}{one}; a round takes about one step's time")
        cached = sum(probe.cached is not None for probe in plan.probes)
        if cached or plan.cached_rounds:
            lines.append(f"cached: {cached} of the {len(plan.probes)} steps below and {plan.cached_rounds} probe "
                         f"round{'' if plan.cached_rounds == 1 else 's'} have their verdicts in the record: they "
                         f"cost nothing and are not counted")
        total = plan.seconds_to_answer
        if total is not None:
            lines.append(f"time: about {_minutes_text(total)} of steps to the answer ({plan.endpoint_rounds} "
                         f"endpoint round{'' if plan.endpoint_rounds == 1 else 's'} and {plan.rounds} more, "
                         f"~{plan.step_seconds:.0f} s a step: the median of the last {plan.timed_steps} steps of "
                         f"this scenario in this state dir; a first step that compiles or builds takes longer)")
        else:
            lines.append("time: no earlier step of this scenario in this state dir to time a round by")
    if plan.skipped_by_user:
        lines.append(f"skipped by --skip: {plan.skipped_by_user} commits")
    if plan.held_build:
        lines.append(plan.held_build)
    rows = [(named(probe.sha, plan.names), probe.role, probe.build) for probe in plan.probes]
    widths = [min(PLAN_WIDTH, max(map(len, column))) for column in zip(*rows)] if rows else []
    for probe, row in zip(plan.probes, rows):
        lines.append("  " + "  ".join(_elided(cell, width).ljust(width) for cell, width in zip(row, widths))
                     + f"  {probe.reason}")
        if probe.world:
            lines.append(f"      {probe.world}")
        if probe.estimate:
            lines.append(f"      cost: {probe.estimate}")
        for command in probe.commands:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in command.env.items())
            lines.append(f"      $ {env + ' ' if env else ''}{shlex.join(command.argv)}")
    low, high = plan.minutes
    lines.append(f"estimate: {low if low == high else f'{low}-{high}'} min of builds, pulls and installs for "
                 f"these steps (the costlier second probe counted; each step's scenario run comes on top)")
    lines.extend(f"follow-pins: {level}" for level in plan.pin_levels)
    lines.extend(f"warning: {warning}" for warning in plan.warnings)
    return "\n".join(lines)
