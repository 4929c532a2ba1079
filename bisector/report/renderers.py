"""Reports rendered from typed results (bisector.record.results): text, JSON, Markdown, JUnit, HTML."""
from __future__ import annotations

import html
import json
import re
import shlex
import time
import xml.etree.ElementTree as ET
from functools import wraps
from typing import Any, Callable, Mapping, Sequence

from bisector.errors import ReportError
from bisector.record.backport_results import VERDICTS, BackportResult, BranchEntry, Conflict
from bisector.record.plan import Plan
from bisector.record.results import BisectResult, StepRecord, named
from bisector.record.runs import Result, StoredRun
from bisector.redact import redact
from bisector.report import perf as perf_report
from bisector.report.formats import FORMATS

LOG_TAIL_CHARS = 6000
TEXT_FILES = 20      # files a culprit's text report lists besides those the scenario implicates
MARKDOWN_FILES = 30  # ... its Markdown and HTML reports (in a collapsed list); the rest are counted
SKIPPED_SHOWN = 20   # commits skipped by --skip every format but JSON lists (JSON lists them all); the rest counted
ANSI_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# what XML 1.0 cannot hold (HTML neither): all but #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-]
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def printable(text: str) -> str:
    """text without ANSI colour sequences, each character XML 1.0 cannot hold written as its escape
    (`\\x01`, `\\ud800`): step output and commit subjects may hold both."""
    return NOT_XML.sub(lambda m: ascii(m[0])[1:-1], ANSI_ESCAPE.sub("", text))


def one_row(text: str) -> str:
    """text on one line: each line break (`\\n`, `\\r`, U+2028, ...) a space, so a reason cannot split its row."""
    return " ".join(text.splitlines())


def published(renderer: Callable[..., str]) -> Callable[..., str]:
    """A document renderer whose output is printable and holds no credentials (bisector.redact)."""
    @wraps(renderer)
    def render_published(*args: Any, **kwargs: Any) -> str:
        return redact(printable(renderer(*args, **kwargs)))
    return render_published


def redacted(renderer: Callable[..., str]) -> Callable[..., str]:
    """A renderer (JSON: it escapes control characters itself) whose output holds no credentials."""
    @wraps(renderer)
    def render_redacted(*args: Any, **kwargs: Any) -> str:
        return redact(renderer(*args, **kwargs))
    return render_redacted


def render(row: Mapping, fmt: str, pr_url_template: str | None = None) -> str:
    """The single entry point: a stored run row (store.runs) rendered as fmt, by the run's kind;
    pr_url_template links PR numbers in bisection Markdown."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r} (known: {', '.join(FORMATS)})")
    run = StoredRun.from_row(row)
    if run.record is None:
        raise ReportError(f"run {run.id} is {run.status}: it has no result to report")
    renderer = REPORTS.get(run.kind, {}).get(fmt)
    if renderer is None or run.result is None:
        raise ReportError(f"no {fmt} report for {run.kind} runs in this version")
    return renderer(run.result, pr_url_template)


def github_pull_url_template(remote_url: str | None) -> str | None:
    """https://github.com/OWNER/REPO/pull/{pr} for a GitHub remote URL (https or ssh), else None."""
    match = re.fullmatch(r"(?:https://(?:[^@/]+@)?|ssh://git@|git@)github\.com[:/]([\w.-]+)/([\w.-]+?)(?:\.git)?/?",
                         (remote_url or "").strip())
    return f"https://github.com/{match[1]}/{match[2]}/pull/{{pr}}" if match else None


def _short_ends(shas: Sequence[str], names: Mapping[str, str] | None = None) -> str:
    """Range ends, shortened, each with the tag or branch naming it when names has one."""
    return ",".join(named(sha, names or {}) for sha in shas)


def counts_line(result: BisectResult) -> str:
    """The run's commit counts in words, the same in every format (BisectResult.counts)."""
    counts = result.counts
    left = "" if counts["left"] is None else \
        f", {counts['left']} {'candidate' if counts['left'] == 1 else 'candidates'} left"
    return (f"commits: {counts['commits']} in range, {counts['tested']} tested in {counts['steps']} steps"
            + left)


def _more(files: Sequence[str], shown: int) -> str:
    return f" (+{len(files) - shown} more)" if len(files) > shown else ""


def skipped_line(result: BisectResult) -> str | None:
    """The commits --skip/--skip-file kept out of the search, counted and named, the same in every format:
    `skipped by --skip: 3 commits: 1a2b3c4d5e6f (v1.1~3), ...` (None when the user skipped none)."""
    skipped = result.skipped_by_user
    if not skipped:
        return None
    return (f"skipped by --skip: {len(skipped)} {'commit' if len(skipped) == 1 else 'commits'}: "
            + ", ".join(result.named(sha) for sha in skipped[:SKIPPED_SHOWN]) + _more(skipped, SKIPPED_SHOWN))


def _command_line(result: Result) -> str | None:
    """How the run was asked for, as one shell-quoted line (None for records that predate it)."""
    return shlex.join(result.command_line) if result.command_line else None


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
        answer = _backport_summary(result) if isinstance(result, BackportResult) else "-"
    else:
        span = f"{_short_ends(params.good, names)}..{_short_ends(params.bad, names)}"
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


def follow_answer(result: BisectResult) -> str | None:
    """--follow-pins: the answer across levels in one line, e.g. "vLLM <sha> (v0.21.0) moved AITER
    v0.1.10.post3 → v0.1.13; inside AITER: first good <sha> <subject> (#PR)"; None without levels."""
    change, first_level = result.pin_change, result.levels[0].level if result.levels else None
    if not result.culprit or not change or not first_level:
        return None
    name = change.name.upper()
    inside = []
    for level in result.levels:
        if level.stopped:  # a level stopped at its ends says so itself
            inside.append(level.stopped if level.outcome == "endpoint" else f"{_no_answer(level)}: {level.stopped}")
        else:
            inside.append(level.answer_inside())
    return (f"vLLM {result.culprit.sha[:12]} ({first_level.held_label}) moved {name} {change.old} → "
            f"{change.new}; inside {name}: " + ", then ".join(inside))


def _level_notes(result: BisectResult) -> list[str]:
    """--follow-pins: what a level inside a dependency bisects, where tags bound it, why levels end."""
    notes = []
    level = result.level
    if level:
        notes.append(level.said())
        if level.how == "release tags" and result.culprit:
            tagged = [sha for _, sha in level.tags]
            before = level.tags[tagged.index(result.culprit.sha) - 1][0]
            notes.append(f"boundary tags: {before} → {level.tag_of(result.culprit.sha)}")
    notes += [f"follow-pins: {note}" for note in result.follow_notes]
    return notes


def _search_notes(result: BisectResult) -> list[str]:
    """How the search went beyond plain bisection: prefilter, seeds, pin change, signature, flaky evidence."""
    notes = _level_notes(result)
    prefilter = result.prefilter
    if prefilter:
        found = f"culprit {result.named(prefilter.culprit)}" if prefilter.culprit else \
            f"no culprit ({prefilter.error or 'inconclusive'})"
        notes.append(f"prefilter {prefilter.scenario.split('/')[0]}: {found}"
                     + (f" in {prefilter.executions} execution(s)" if prefilter.executions is not None else ""))
    seeded = result.seeded
    if seeded:
        pair = seeded.pair
        how = ("confirmed against its parent" if seeded.confirmed else "not confirmed; bisected on") \
            if pair else "none testable; bisected"
        if seeded.kind == "prefilter":
            notes.append(f"  by the main scenario: {how}" if pair else "  no testable parent; bisected")
        else:
            notes.append(f"seeded from {seeded.kind} {result.named(seeded.origin)}: {len(seeded.candidates)} "
                         f"blamed candidate(s)" + (f", best {result.named(pair[0])} {how}" if pair else f", {how}"))
    change = result.pin_change
    if change:
        name = change.name.upper()
        notes.append(f"this commit moves {name} {change.old} → {change.new}; the behaviour "
                     f"change may come from {name}")
        if not result.levels and change.continuation:  # --follow-pins went on by itself; one-sided: no range
            notes.append(f"  continue inside {name}: {change.continuation}")
    signature = result.signature
    if signature.mode != "any":
        hunted = signature.signature or signature.pattern or "none seen"
        notes.append(f"signature ({signature.mode}): {hunted}; other failures are skips")
    flaky = result.flaky
    if flaky:
        notes.append(f"flaky search: confidence {flaky.confidence:.3f} that "
                     f"{result.named(flaky.best_guess)} is the {result.culprit_label}")
        notes += [f"  {result.named(sha)}: {seen.faults} fault(s) in {seen.runs} run(s)"
                  for sha, seen in flaky.evidence.items()]
    if result.perf:
        notes += perf_report.notes(result.perf)
    return notes


def _inconclusive(result: BisectResult) -> str:
    if result.stopped:
        return result.stopped
    if result.flaky:
        return (f"below the asked confidence ({result.flaky.confidence:.3f}); most likely "
                f"{len(result.candidates)} candidates for the {result.culprit_label}:")
    return (f"skipped commits leave {len(result.candidates)} candidates "
            f"for the {result.culprit_label}:")


# The headline of a run without a culprit, by its outcome (bisector.record.results.OUTCOMES).
HEADLINES = {"inconclusive": "inconclusive", "endpoint": "stopped", "merge-base": "stopped", "aborted": "aborted",
             "interrupted": "interrupted"}


def _no_answer(result: BisectResult) -> str:
    """The headline of a run without a culprit: inconclusive, stopped at its ends, aborted or interrupted."""
    return HEADLINES[result.outcome]


@published
def bisect_text(result: BisectResult) -> str:
    """The run's text report; with --follow-pins levels, the answer across them, then each level's."""
    if not result.levels:
        return _level_text(result)
    parts = [f"answer: {follow_answer(result) or _no_answer(result)}"]
    for level in (result, *result.levels):
        number = level.level.number if level.level else 1
        parts += ["", f"== level {number}: {level.repo} ==", _level_text(level)]
    return "\n".join(parts)


def _level_text(result: BisectResult) -> str:
    lines = []
    culprit = result.culprit
    if culprit:
        lines.append(f"{result.culprit_label}: {result.named(culprit.sha, 40)}")
        lines.append(f"  {culprit.subject}")
        lines.append(f"  author: {culprit.author}   date: {culprit.date}"
                     + (f"   PR: #{culprit.pr}" if culprit.pr else ""))
        if culprit.implicated:
            lines.append("  implicated files: " + ", ".join(culprit.implicated))
        rest = culprit.other_files
        if rest:
            lines.append(f"  {'other files' if culprit.implicated else 'files'}: " + ", ".join(rest[:TEXT_FILES])
                         + _more(rest, TEXT_FILES))
    else:
        lines.append(f"{_no_answer(result)}: {_inconclusive(result)}")
        lines.extend(f"  {result.named(sha, 40)}" for sha in result.candidates)
    lines += _search_notes(result)
    skipped = skipped_line(result)
    if skipped:
        lines.append(skipped)
    lines += [f"warning: {warning}" for warning in result.warnings]
    if _command_line(result):
        lines.append(f"command: {_command_line(result)}")
    lines.append(counts_line(result))
    lines.append(f"steps: {len(result.steps)}, scenario executions: {result.executions}, "
                 f"rounds: {result.rounds}")
    for step in result.steps:
        cached = (" (cached from an earlier run)" if step.from_earlier_run else " (cached)") if step.cached else ""
        shown = step.build and not step.build.startswith("none")
        build = f"  [build {step.build}]" if shown else ""
        lines.append(f"  {result.named(step.sha)} {step.role:<8} {perf_report.step_verdict(result.perf, step):<4} "
                     f"{step.seconds:7.2f}s{cached}  {one_row(step.reason)}{build}")
    return "\n".join(lines)


def md_code(value: object, in_table: bool = False) -> str:
    """Untrusted text (commit subjects, authors, branch names, output) as one Markdown code span:
    rendered literally, so no HTML, links, auto-links, @mentions or emphasis; one line."""
    text = " ".join(str(value).split())
    if not text:
        return ""
    if in_table:
        text = text.replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


@published
def bisect_markdown(result: BisectResult, pr_url_template: str | None = None) -> str:
    """pr_url_template: a URL with {pr} where the PR number goes; PR numbers are links with one.
    Commit subjects, authors and file names are untrusted: each is one literal code span.
    With --follow-pins levels: the answer across them, then a section per level."""
    if not result.levels:
        return "\n".join(["## bisector result", "", *_markdown_level(result, pr_url_template)]) + "\n"
    out = ["## bisector result", "", f"**Answer:** {md_code(follow_answer(result) or _no_answer(result))}"]
    for level in (result, *result.levels):
        number = level.level.number if level.level else 1
        out += ["", f"### Level {number}: {md_code(level.repo)}", "",
                *_markdown_level(level, pr_url_template if number == 1 else None)]
    return "\n".join(out) + "\n"


def _markdown_level(result: BisectResult, pr_url_template: str | None) -> list[str]:
    culprit = result.culprit
    out: list[str] = []
    if culprit:
        number = int(str(culprit.pr)) if str(culprit.pr or "").isdigit() else 0
        pr = "" if not number else f" ([PR #{number}]({pr_url_template.replace('{pr}', str(number))}))" \
            if pr_url_template else f" (PR #{number})"
        name = f" ({md_code(result.names[culprit.sha])})" if culprit.sha in result.names else ""
        out += [f"**{result.culprit_label.capitalize()}:** {md_code(culprit.sha)}{name}{pr}", "",
                f"> {md_code(culprit.subject)}", "",
                f"- author: {md_code(culprit.author)}", f"- date: {md_code(culprit.date)}",
                *_markdown_files(culprit.implicated, culprit.other_files)]
    else:
        said = md_code(result.stopped) if result.stopped else _inconclusive(result)
        out.append(f"**{_no_answer(result).capitalize()}:** {said}")
        if result.candidates:
            out += ["", *(f"- {md_code(result.named(sha, 40))}" for sha in result.candidates)]
    skipped = skipped_line(result)
    notes = _search_notes(result) + ([skipped] if skipped else []) + [f"warning: {w}" for w in result.warnings]
    if notes:
        out += ["", *(f"- {md_code(note.strip())}" for note in notes)]
    if _command_line(result):
        out += ["", f"Command: {md_code(_command_line(result))}"]
    out += ["", f"Scenario {md_code(result.scenario)}: {result.executions} executions, "
            f"{len(result.steps)} steps, {result.rounds} rounds.", "", f"{counts_line(result)}.", "",
            "| # | commit | role | verdict | seconds | cached | reason |",
            "|---|---|---|---|---|---|---|"]
    for n, step in enumerate(result.steps, 1):
        out.append(f"| {n} | {md_code(result.named(step.sha), True)} | {step.role} | "
                   f"{perf_report.step_verdict(result.perf, step)} | "
                   f"{step.seconds:.2f} | {'yes' if step.cached else ''} | {md_code(step.reason, True)} |")
    return out


def _markdown_files(implicated: Sequence[str], rest: Sequence[str]) -> list[str]:
    """A culprit's files as Markdown list items: those the scenario implicates, then the rest collapsed."""
    if not implicated:
        return ["- files: " + ", ".join(md_code(f) for f in rest[:MARKDOWN_FILES]) + _more(rest, MARKDOWN_FILES)]
    out = ["- implicated files: " + ", ".join(md_code(f) for f in implicated)]
    if rest:
        out += ["", f"<details><summary>{len(rest)} other files</summary>", "",
                ", ".join(md_code(f) for f in rest[:MARKDOWN_FILES]) + _more(rest, MARKDOWN_FILES), "", "</details>"]
    return out


@redacted
def bisect_json(result: BisectResult) -> str:
    return json.dumps(result.to_json(published=True), indent=2) + "\n"


def log_tail(path: str | None, limit: int = LOG_TAIL_CHARS) -> str:
    """The last `limit` characters of a step's log, read now; a note when there is none."""
    if not path:
        return "(no log recorded)"
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - limit))
            text = fh.read().decode(errors="replace")
    except OSError as exc:
        return f"(log unavailable: {path}: {exc.strerror})"
    return ("…" + text) if size > limit else text


@published
def bisect_junit(result: BisectResult) -> str:
    """A found culprit is a result, not a failure: every step is a passing testcase carrying its verdict
    as a property (and its log tail); one more testcase, "answer", fails only when the run found no
    culprit: its failure's type is the outcome (inconclusive, endpoint, merge-base, aborted, interrupted),
    its message why. With --follow-pins levels, one testsuite per level."""
    root = ET.Element("testsuites")
    for level in (result, *result.levels):
        root.append(_junit_suite(level))
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _junit_suite(result: BisectResult) -> ET.Element:
    steps = result.steps
    culprit = result.culprit
    suite = ET.Element("testsuite", name=f"bisector run {result.run_id}",
                       tests=str(len(steps) + 1), failures="0" if culprit else "1", skipped="0",
                       errors="0", time=f"{sum(s.seconds for s in steps):.3f}")
    props = ET.SubElement(suite, "properties")
    for name, value in (("scenario", result.scenario), ("mode", result.mode),
                        ("good", " ".join(result.good)), ("bad", " ".join(result.bad)),
                        (result.culprit_label.replace(" ", "_"), culprit.sha if culprit else ""),
                        ("candidates", " ".join(result.candidates)),
                        *((("skipped_by_user", " ".join(result.skipped_by_user)),) if result.skipped_by_user else ()),
                        ("command", _command_line(result) or ""),
                        *((name, "" if count is None else str(count)) for name, count in result.counts.items()),
                        *((("level", result.level.said()),) if result.level else ()),
                        *((("outcome", result.outcome), ("stopped", result.stopped)) if result.stopped else ())):
        ET.SubElement(props, "property", name=name, value=value)
    classname = "bisector." + result.scenario.split("/")[0]
    answer = ET.SubElement(suite, "testcase", classname=classname, name="answer", time="0.000")
    skipped = skipped_line(result)
    if culprit:
        ET.SubElement(answer, "system-out").text = \
            f"{result.culprit_label}: {result.named(culprit.sha, 40)} {culprit.subject}" + \
            (f"\n{skipped}" if skipped else "")
    else:
        ET.SubElement(answer, "failure", type=result.outcome, message=_inconclusive(result)).text = \
            "\n".join(result.named(sha, 40) for sha in result.candidates)
        if skipped:
            ET.SubElement(answer, "system-out").text = skipped
    for n, step in enumerate(steps, 1):
        case = ET.SubElement(suite, "testcase", classname=classname,
                             name=f"step {n}: {result.named(step.sha)}, {step.role}",
                             time=f"{step.seconds:.3f}")
        case_props = ET.SubElement(case, "properties")
        for name, value in (("verdict", step.verdict), ("reason", step.reason),
                            ("cached", "yes" if step.cached else "no")):
            ET.SubElement(case_props, "property", name=name, value=value)
        ET.SubElement(case, "system-out").text = log_tail(step.log)
    return suite


# -- HTML: one self-contained file, inline CSS and JS, no external assets --------------------------
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fafbfc}
h1{font-size:20px;margin:0 0 4px}code,pre{font:12px/1.4 ui-monospace,monospace}
.meta{color:#555;margin-bottom:16px}.card{background:#fff;border:1px solid #dde1e6;border-radius:6px;
padding:12px 16px;margin:12px 0}.culprit{border-left:6px solid #c62828}
.timeline{display:flex;gap:2px;overflow-x:auto;padding:22px 4px 6px;align-items:flex-end}
.c{flex:1 0 10px;max-width:38px;height:34px;border-radius:3px;background:#d5d9de;border:0;padding:0;
position:relative}.c.tested{cursor:pointer;height:46px}.c.good{background:#2e7d32}.c.bad{background:#c62828}
.c.skip{background:#f9a825}.c.candidate{outline:2px dashed #6a1b9a;outline-offset:1px}
.c.culprit{outline:3px solid #111;outline-offset:2px}
.c.culprit::after{content:"▼";position:absolute;top:-17px;left:50%;transform:translateX(-50%);font-size:11px}
.c.sel{box-shadow:0 0 0 3px #1565c0}.axis{display:flex;justify-content:space-between;color:#666;font-size:12px}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;
border-radius:2px;margin-right:4px;vertical-align:-1px}
table{border-collapse:collapse;width:100%}td,th{border-bottom:1px solid #e4e7eb;padding:5px 8px;
text-align:left;vertical-align:top}tr.pick{cursor:pointer}tr.pick:hover{background:#f0f4f8}
.v{font-weight:600;border-radius:3px;padding:1px 6px;color:#fff;white-space:nowrap}.v.good{background:#2e7d32}
.v.bad{background:#c62828}.v.skip{background:#f9a825;color:#222}.v.other{background:#607d8b}
pre.log{background:#14171c;color:#e6e6e6;padding:10px;border-radius:4px;max-height:420px;overflow:auto;
white-space:pre-wrap}
"""
_JS = """
function show(id){document.querySelectorAll('.detail').forEach(d=>d.hidden=d.id!==id);
document.querySelectorAll('[data-target]').forEach(e=>e.classList.toggle('sel',e.dataset.target===id));}
document.querySelectorAll('[data-target]').forEach(e=>e.addEventListener('click',()=>show(e.dataset.target)));
"""
USER_SKIP = "background:repeating-linear-gradient(45deg,#d5d9de 0 3px,#fff 3px 6px)"  # a commit --skip kept out
# Every verdict the tool produces: step verdicts, a performance hunt's (perf_report.step_verdict), then
# backport verdicts (bisector.record.results.VERDICTS).
_TONES = {"good": "good", "bad": "bad", "skip": "skip", "like good": "good", "like bad": "bad", "undecided": "skip",
          "verified": "good", "not-affected": "good", "already-fixed": "good", "contains": "good",
          "already-picked": "good", "applies-unverified": "skip", "conflict": "bad",
          "fix-ineffective": "bad", "masked": "bad", "not-exercised": "skip", "untestable": "skip"}


def _tone(verdict: object) -> str:
    return _TONES.get(str(verdict).lower(), "other")


def _badge(verdict: object) -> str:
    if verdict is None:
        return "—"
    return f'<span class="v {_tone(verdict)}">{html.escape(str(verdict))}</span>'


def _short(value: object) -> str:
    """A 40-hex sha shortened to 12; anything else as text (None as empty)."""
    text = "" if value is None else str(value)
    return text[:12] if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else text


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n<script>{_JS}</script>\n</body></html>\n")


@published
def bisect_html(result: BisectResult) -> str:
    """The range as a timeline coloured by verdict; click a tested commit for its steps and log tail.
    With --follow-pins levels: the answer across them, then each level's timeline and steps."""
    title, body = _html_level(result, "")
    if not result.levels:
        return _page(title, body)
    answer = html.escape(follow_answer(result) or _no_answer(result))
    sections = [f'<div class="card culprit"><b>Answer:</b> {answer}</div><h2>Level 1</h2>{body}']
    for level in result.levels:
        number = level.level.number if level.level else 0
        sections.append(f"<h2>Level {number}</h2>" + _html_level(level, f"l{number}-")[1])
    return _page(title, "".join(sections))


def _html_level(result: BisectResult, prefix: str) -> tuple[str, str]:
    """(title, body) of one run's page; prefix keeps the element ids of levels on one page apart."""
    e = html.escape
    steps = result.steps
    label = result.culprit_label
    by_sha: dict[str, list[StepRecord]] = {}
    for step in steps:
        by_sha.setdefault(step.sha, []).append(step)
    order = result.range
    culprit = result.culprit
    culprit_sha = culprit.sha if culprit else None
    candidates = set(result.candidates) if not culprit else set()
    skipped, skipped_by_user = skipped_line(result), set(result.skipped_by_user)
    cells = []
    for sha in order:
        classes = ["c"]
        title = result.named(sha)
        if sha in skipped_by_user:
            classes.append("user-skip")
            title += " skipped by --skip"
        if sha in by_sha:
            verdict = by_sha[sha][-1].verdict
            classes += ["tested", verdict]
            title += f" {verdict}: {by_sha[sha][-1].reason}"
        if sha == culprit_sha:
            classes.append("culprit")
            title += f" — {label}"
        if sha in candidates:
            classes.append("candidate")
        target = f' data-target="{prefix}d-{sha}"' if sha in by_sha else ""
        style = f' style="{USER_SKIP}"' if sha in skipped_by_user else ""
        cells.append(f'<button class="{" ".join(classes)}" title="{e(title)}"{target}{style}></button>')
    if culprit:
        pr = f" · PR #{culprit.pr}" if culprit.pr else ""
        name = f" ({e(result.names[culprit.sha])})" if culprit.sha in result.names else ""
        headline = (f'<div class="card culprit"><b>{e(label.capitalize())}:</b> '
                    f'<code>{e(culprit.sha)}</code>{name}<br>{e(culprit.subject)}<br>'
                    f'<span class="meta">{e(culprit.author)} · {e(culprit.date)}{pr}</span>'
                    f"{_html_files(culprit.implicated, culprit.other_files)}</div>")
    elif result.stopped:
        headline = f'<div class="card"><b>{e(_no_answer(result).capitalize())}:</b> {e(result.stopped)}</div>'
    else:
        headline = (f'<div class="card"><b>Inconclusive:</b> skipped commits leave '
                    f'{len(result.candidates)} candidates (dashed outline): '
                    + " ".join(f"<code>{e(result.named(s))}</code>" for s in result.candidates) + "</div>")
    notes = _search_notes(result)
    if notes:  # how the search went: prefilter, seeds, pin change, signature, flaky evidence
        headline += '<div class="card notes">' + "<br>".join(e(note) for note in notes) + "</div>"
    if result.perf:  # the metric per tested commit (a performance hunt)
        headline += '<div class="card">' + perf_report.svg(result.perf, order, culprit_sha) + "</div>"
    rows, details = [], []
    for n, step in enumerate(steps, 1):
        rows.append(f'<tr class="pick" data-target="{prefix}d-{step.sha}"><td>{n}</td>'
                    f'<td><code>{e(result.named(step.sha))}</code></td><td>{e(step.role)}</td>'
                    f'<td>{_badge(perf_report.step_verdict(result.perf, step))}</td><td>{step.seconds:.2f}</td>'
                    f'<td>{"yes" if step.cached else ""}</td><td>{e(step.reason)}</td></tr>')
    for sha, runs in by_sha.items():
        parts = [f'<div class="card detail" id="{prefix}d-{sha}" hidden><b><code>{e(result.named(sha, 40))}</code></b>'
                 + (" — " + e(label) if sha == culprit_sha else "")]
        for step in runs:
            parts.append(f'<p>{e(step.role)} {_badge(perf_report.step_verdict(result.perf, step))} {e(step.reason)} · '
                         f'{step.seconds:.2f}s · build {e(str(step.build))}'
                         f'{" · cached" if step.cached else ""}<br><code>{e(str(step.log))}</code></p>'
                         f'<pre class="log">{e(log_tail(step.log))}</pre>')
        details.append("".join(parts) + "</div>")
    title = (f"bisector run {result.run_id}: {_short_ends(result.good, result.names)}.."
             f"{_short_ends(result.bad, result.names)}")
    command = _command_line(result)
    body = (f"<h1>{e(title)}</h1>"
            f'<div class="meta">{e(result.mode)} · scenario <code>'
            f'{e(result.scenario)}</code> · {e(counts_line(result))} · '
            f'{result.executions} executions · {result.rounds} rounds'
            + (f'<br>command: <code>{e(command)}</code>' if command else "")
            + (f"<br>{e(skipped)}" if skipped else "")
            + "".join(f"<br>warning: {e(w)}" for w in result.warnings)
            + f'</div>{headline}'
            f'<div class="card"><div class="legend"><span><i style="background:#2e7d32"></i>good</span>'
            f'<span><i style="background:#c62828"></i>bad</span><span><i style="background:#f9a825">'
            f'</i>skip</span><span><i style="background:#d5d9de"></i>not tested</span>'
            + (f'<span><i style="{USER_SKIP}"></i>skipped by --skip</span>' if skipped else "")
            + f'<span>▼ {e(label)}</span><span>click a tested commit for its log</span></div>'
            f'<div class="timeline">{"".join(cells)}</div><div class="axis"><span>'
            f'<code>{e(result.named(order[0]))}</code> (oldest)</span><span>(newest) '
            f'<code>{e(result.named(order[-1]))}'
            f'</code></span></div></div>{"".join(details)}'
            f'<div class="card"><table><tr><th>#</th><th>commit</th><th>role</th><th>verdict</th>'
            f'<th>seconds</th><th>cached</th><th>reason</th></tr>{"".join(rows)}</table></div>')
    return title, body


def _html_files(implicated: Sequence[str], rest: Sequence[str]) -> str:
    """A culprit's files: those the scenario implicates, then the rest collapsed."""
    e = html.escape
    listed = ", ".join(f"<code>{e(f)}</code>" for f in rest[:MARKDOWN_FILES]) + _more(rest, MARKDOWN_FILES)
    if not implicated:
        return f"<div>files: {listed}</div>"
    out = "<div>implicated files: " + ", ".join(f"<code>{e(f)}</code>" for f in implicated) + "</div>"
    return out + (f"<details><summary>{len(rest)} other files</summary>{listed}</details>" if rest else "")


def _equivalent(result: BackportResult, entry: BranchEntry) -> str:
    """The commit on the branch that already carries the fix (already-picked), linked by patch id."""
    return f"<code>{html.escape(result.named(entry.equivalent))}</code>" if entry.equivalent else "—"


@published
def backport_html(result: BackportResult) -> str:
    """The branch matrix of a backport run (a verdict column per --option value, then one table per value
    with each branch's reason); click a branch for its conflicts."""
    e = html.escape
    values = result.values
    tables, details = [], []
    if len(values) > 1:
        head = "".join(f"<th>{e(value)}</th>" for value in values)
        rows = [f"<tr><td><b>{e(branch)}</b></td><td><code>{e(tip)}</code></td><td>{e(pin or '—')}</td>"
                + "".join(f"<td>{_badge(verdict)}</td>" for verdict in verdicts) + "</tr>"
                for branch, tip, pin, verdicts in _backport_matrix(result)]
        tables.append(f'<div class="card"><table><tr><th>branch</th><th>tip</th><th>AITER</th>{head}</tr>'
                      f'{"".join(rows)}</table></div>')
    n = 0
    for value in values:
        rows = []
        for entry in _entries_at(result, value):
            target, n = f"b-{n}", n + 1
            rows.append(f'<tr class="pick" data-target="{target}"><td><b>{e(entry.branch)}</b></td>'
                        f'<td><code>{e(_tip(result, entry))}</code></td><td>{e(entry.pin or "—")}</td>'
                        f'<td><code>{e(_short(entry.pick))}</code></td>'
                        f'<td>{_badge(entry.before)}</td><td>{_badge(entry.after)}</td>'
                        f'<td>{_badge(entry.verdict)}</td>'
                        f'<td>{_equivalent(result, entry)}</td>'
                        f'<td>{len(entry.conflicts)}</td><td>{e(_detail(entry))}</td></tr>')
            listed = "".join(f"<li><code>{e(line)}</code></li>" for line in _backport_conflicts(entry)) \
                or "<li>none</li>"
            picked = f'<p>picked: <code>{e(result.named(entry.picked, 40))}</code></p>' if entry.picked else ""
            details.append(f'<div class="card detail" id="{target}" hidden><b>{e(entry.branch)}</b> '
                           f'at <code>{e(_tip(result, entry, 40))}</code>{picked}<p>conflicts:</p>'
                           f"<ul>{listed}</ul></div>")
        heading = f"<h2>at {e(value)}</h2>" if value else ""
        tables.append(f'<div class="card">{heading}<table><tr><th>branch</th><th>tip</th><th>AITER</th>'
                      f'<th>pick</th><th>before</th><th>after</th><th>verdict</th><th>equivalent</th>'
                      f'<th>conflicts</th><th>reason</th></tr>{"".join(rows)}</table></div>')
    title = f"bisector backport of {result.named(result.fix)}"
    command = _command_line(result)
    problems = "".join(f'<div class="card"><span class="v bad">!</span> {e(problem)}</div>'
                       for problem in result.problems)
    body = (f"<h1>{e(title)}</h1><div class=\"meta\">fix <code>{e(result.named(result.fix, 40))}</code> · "
            f"{len(_branch_names(result))} branches"
            + (f"<br>command: <code>{e(command)}</code>" if command else "") + "</div>"
            f'{problems}{"".join(tables)}{"".join(details)}')
    return _page(title, body)


# -- backport ------------------------------------------------------------------------------------
BACKPORT_COLUMNS = ("branch", "tip", "aiter", "pick", "before", "after", "verdict", "detail")


def _entries_at(result: BackportResult, value: str) -> list[BranchEntry]:
    return [entry for entry in result.branches if entry.options == value]


def _branch_names(result: BackportResult) -> list[str]:
    return list(dict.fromkeys(entry.branch for entry in result.branches))


def _tip(result: BackportResult, entry: BranchEntry, width: int = 12) -> str:
    """The branch's tip, with the tag naming it, or the branch that does when it is not this one."""
    name = result.names.get(entry.tip)
    return f"{entry.tip[:width]} ({name})" if name and name != entry.branch else entry.tip[:width]


def _fix_names(result: BackportResult) -> list[str]:
    """The tag or branch naming the fix and the ref it was asked as, each once (`v0.25.0`, `the-fix`)."""
    return list(dict.fromkeys(name for name in (result.names.get(result.fix), result.fix_ref) if name))


def _backport_matrix(result: BackportResult) -> list[tuple[str, str, str | None, list[str]]]:
    """(branch, its tip as reports show it, AITER pin, its verdict at each --option value) per branch."""
    by_branch: dict[str, list[BranchEntry]] = {}
    for entry in result.branches:
        by_branch.setdefault(entry.branch, []).append(entry)
    matrix = []
    for branch, entries in by_branch.items():
        at = {entry.options: entry.verdict for entry in entries}
        matrix.append((branch, _tip(result, entries[0]), entries[0].pin,
                       [at.get(value, "-") for value in result.values]))
    return matrix


def _detail(entry: BranchEntry) -> str:
    detail = entry.reason + (f" ({entry.said_cached})" if entry.cached else "")
    if entry.pin_level:
        detail += f"; {entry.pin_level.said()}"
    if entry.backport_branch:
        detail += f"; {entry.backport_branch.name} {entry.backport_branch.state}"
    return detail


def _backport_rows(result: BackportResult, entries: Sequence[BranchEntry]) -> list[tuple[str, ...]]:
    return [(entry.branch, _tip(result, entry), entry.pin or "-", entry.pick, entry.before or "-",
             entry.after or "-", entry.verdict, _detail(entry)) for entry in entries]


def _conflict_line(conflict: Conflict) -> str:
    return f"{conflict.file} ({conflict.kind}): " + (", ".join(conflict.hunks) or "whole file")


def _backport_conflicts(entry: BranchEntry) -> list[str]:
    return [_conflict_line(conflict) for conflict in entry.conflicts]


def _backport_summary(result: BackportResult) -> str:
    """How many branches got each verdict, per --option value when there are several."""
    parts = []
    for value in result.values:
        verdicts = [entry.verdict for entry in _entries_at(result, value)]
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts)
        parts.append(f"{value}: {counts}" if value else counts)
    return "; ".join(parts)


def _all_cached(result: BackportResult) -> str:
    """"; nothing ran: ..." when the record answered every verdict (a rerun), else ""."""
    cached = any(entry.cached for entry in result.branches)
    return "; nothing ran: every verdict came from the record" if cached and not result.executions else ""


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as columns padded to their widest cell (the last column left as it is)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows]


@published
def backport_text(result: BackportResult) -> str:
    lines = [f"fix {result.fix[:12]} ({', '.join(_fix_names(result))}): {result.fix_subject}",
             f"scenario: {result.scenario or 'none'}"]
    if _command_line(result):
        lines.append(f"command: {_command_line(result)}")
    lines += [f"! {problem}" for problem in result.problems]
    lines.append("")
    if len(result.values) > 1:
        lines += _aligned([("branch", "tip", "aiter", *result.values)]
                          + [(branch, tip, pin or "-", *verdicts)
                             for branch, tip, pin, verdicts in _backport_matrix(result)])
    for value in result.values:
        if len(result.values) > 1:
            lines += ["", f"at {value}:"]
        entries = _entries_at(result, value)
        lines += _aligned([BACKPORT_COLUMNS, *_backport_rows(result, entries)])
        for entry in entries:
            if entry.conflicts:
                lines.append(f"conflicts on {entry.branch}:")
                lines.extend(f"  {line}" for line in _backport_conflicts(entry))
    lines += ["", f"{len(_branch_names(result))} branches: {_backport_summary(result)}{_all_cached(result)}"]
    return "\n".join(lines)


@published
def backport_markdown(result: BackportResult) -> str:
    out = ["## bisector backport", "",
           f"Fix {md_code(result.fix[:12])} ({', '.join(md_code(name) for name in _fix_names(result))}): "
           f"{md_code(result.fix_subject)}",
           "", f"Scenario: {md_code(result.scenario or 'none')}", "",
           *([f"Command: {md_code(_command_line(result))}", ""] if _command_line(result) else []),
           *[f"> **{md_code(problem)}**\n" for problem in result.problems]]
    if len(result.values) > 1:
        out += ["| branch | tip | aiter | " + " | ".join(md_code(value, True) for value in result.values) + " |",
                "|" + "---|" * (3 + len(result.values))]
        out += ["| " + " | ".join([md_code(branch, True), md_code(tip, True), md_code(pin or "-", True),
                                   *(f"**{verdict}**" for verdict in verdicts)]) + " |"
                for branch, tip, pin, verdicts in _backport_matrix(result)]
        out.append("")
    for value in result.values:
        if len(result.values) > 1:
            out += [f"### at {md_code(value)}", ""]
        entries = _entries_at(result, value)
        out += ["| " + " | ".join(BACKPORT_COLUMNS) + " |", "|" + "---|" * len(BACKPORT_COLUMNS)]
        for row in _backport_rows(result, entries):
            cells = [md_code(row[0], True), md_code(row[1], True), md_code(row[2], True), *row[3:6],
                     f"**{row[6]}**", md_code(row[7], True)]
            out.append("| " + " | ".join(cells) + " |")
        for entry in entries:
            if entry.conflicts:
                out += ["", f"<details><summary>conflicts on <code>{html.escape(entry.branch)}</code></summary>",
                        ""]
                out += [f"- {md_code(line)}" for line in _backport_conflicts(entry)]
                out += ["", "</details>"]
        out.append("")
    out += [f"{len(_branch_names(result))} branches: {_backport_summary(result)}{_all_cached(result)}"]
    return "\n".join(out) + "\n"


FAILING = ("conflict", "fix-ineffective", "masked")  # JUnit failures: a branch that needs work


@published
def backport_junit(result: BackportResult) -> str:
    """One test case per branch (per branch and --option value when there are several), and one per value
    whose fix check failed: failure for conflict, fix-ineffective, masked and a fix not shown to work;
    error for untestable and a fix check that skipped; skipped for not-exercised."""
    entries = result.branches
    untested = sum(check.untested for check in result.checks)
    failures = sum(entry.verdict in FAILING for entry in entries) + len(result.problems) - untested
    errors = sum(entry.verdict == "untestable" for entry in entries) + untested
    suite = ET.Element("testsuite", name=f"bisector backport {result.named(result.fix)}",
                       tests=str(len(entries) + len(result.problems)), failures=str(failures), errors=str(errors),
                       skipped=str(sum(entry.verdict == "not-exercised" for entry in entries)))
    for check in result.checks:
        if check.problem:
            case = ET.SubElement(suite, "testcase", classname=f"backport.{result.fix[:12]}",
                                 name="the fix" + (f" [{check.options}]" if check.options else ""))
            kind = "error" if check.untested else "failure"  # a skip is no evidence the fix fails
            ET.SubElement(case, kind, type="fix-untested" if check.untested else "fix-not-shown",
                          message=check.problem).text = check.problem
    for entry in entries:
        name = entry.branch + (f" [{entry.options}]" if entry.options else "")
        case = ET.SubElement(suite, "testcase", classname=f"backport.{result.fix[:12]}", name=name)
        body = "\n".join([entry.reason, *_backport_conflicts(entry)])
        if entry.verdict in FAILING:
            ET.SubElement(case, "failure", type=entry.verdict, message=entry.reason).text = body
        elif entry.verdict == "untestable":
            ET.SubElement(case, "error", type="untestable", message=entry.reason).text = body
        elif entry.verdict == "not-exercised":
            ET.SubElement(case, "skipped", message=entry.reason)
        ET.SubElement(case, "system-out").text = f"verdict: {entry.verdict}\ntip: {_tip(result, entry, 40)}" + \
            (f"\npicked: {result.named(entry.picked, 40)}" if entry.picked else "") + \
            (f"\naiter: {entry.pin}" if entry.pin else "") + \
            (f"\nfollow-pins: {entry.pin_level.said()}" if entry.pin_level else "")
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


@redacted
def backport_json(result: BackportResult) -> str:
    return json.dumps(result.to_json(), indent=2) + "\n"


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


# -- the formats of each result kind --------------------------------------------------------------
Renderer = Callable[[Any, "str | None"], str]  # (a result of the kind, pr_url_template) -> the report


def _unlinked(renderer: Callable[[Any], str]) -> Renderer:
    """A renderer that links no pull requests, called as REPORTS calls every renderer."""
    return lambda result, pr_url_template: renderer(result)


REPORTS: dict[str, dict[str, Renderer]] = {
    "bisect": {"text": _unlinked(bisect_text), "json": _unlinked(bisect_json), "markdown": bisect_markdown,
               "junit": _unlinked(bisect_junit), "html": _unlinked(bisect_html)},
    "backport": {"text": _unlinked(backport_text), "json": _unlinked(backport_json),
                 "markdown": _unlinked(backport_markdown), "junit": _unlinked(backport_junit),
                 "html": _unlinked(backport_html)},
}
