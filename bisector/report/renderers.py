"""Reports rendered from typed results: a bisection's text, JSON, Markdown, JUnit and HTML here, a backport's in
bisector.report.backport; `REPORTS` maps each run kind's formats, `render` renders a stored run by its kind."""
from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from typing import Any, Callable, Mapping, Sequence

from bisector.errors import ReportError
from bisector.record.results import BisectResult, StepRecord
from bisector.record.runs import StoredRun
from bisector.report import perf as perf_report
from bisector.report.backport import backport_html, backport_json, backport_junit, backport_markdown, backport_text
from bisector.report.documents import command_text, md_code, one_row, published, redacted, short_ends
from bisector.report.formats import FORMATS
from bisector.report.page import badge, page

LOG_TAIL_CHARS = 6000
TEXT_FILES = 20      # files a culprit's text report lists besides those the scenario implicates
MARKDOWN_FILES = 30  # ... its Markdown and HTML reports (in a collapsed list); the rest are counted
SKIPPED_SHOWN = 20   # commits skipped by --skip every format but JSON lists (JSON lists them all); the rest counted


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
    if command_text(result):
        lines.append(f"command: {command_text(result)}")
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
    if command_text(result):
        out += ["", f"Command: {md_code(command_text(result))}"]
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
                        ("command", command_text(result) or ""),
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


# -- HTML (the page: bisector.report.page) ---------------------------------------------------------
USER_SKIP = "background:repeating-linear-gradient(45deg,#d5d9de 0 3px,#fff 3px 6px)"  # a commit --skip kept out


@published
def bisect_html(result: BisectResult) -> str:
    """The range as a timeline coloured by verdict; click a tested commit for its steps and log tail.
    With --follow-pins levels: the answer across them, then each level's timeline and steps."""
    title, body = _html_level(result, "")
    if not result.levels:
        return page(title, body)
    answer = html.escape(follow_answer(result) or _no_answer(result))
    sections = [f'<div class="card culprit"><b>Answer:</b> {answer}</div><h2>Level 1</h2>{body}']
    for level in result.levels:
        number = level.level.number if level.level else 0
        sections.append(f"<h2>Level {number}</h2>" + _html_level(level, f"l{number}-")[1])
    return page(title, "".join(sections))


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
                    f'<td>{badge(perf_report.step_verdict(result.perf, step))}</td><td>{step.seconds:.2f}</td>'
                    f'<td>{"yes" if step.cached else ""}</td><td>{e(step.reason)}</td></tr>')
    for sha, runs in by_sha.items():
        parts = [f'<div class="card detail" id="{prefix}d-{sha}" hidden><b><code>{e(result.named(sha, 40))}</code></b>'
                 + (" — " + e(label) if sha == culprit_sha else "")]
        for step in runs:
            parts.append(f'<p>{e(step.role)} {badge(perf_report.step_verdict(result.perf, step))} {e(step.reason)} · '
                         f'{step.seconds:.2f}s · build {e(str(step.build))}'
                         f'{" · cached" if step.cached else ""}<br><code>{e(str(step.log))}</code></p>'
                         f'<pre class="log">{e(log_tail(step.log))}</pre>')
        details.append("".join(parts) + "</div>")
    title = (f"bisector run {result.run_id}: {short_ends(result.good, result.names)}.."
             f"{short_ends(result.bad, result.names)}")
    command = command_text(result)
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
