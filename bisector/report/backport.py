"""A backport run's reports: text, Markdown, JUnit, JSON and HTML of the branch matrix (a verdict per branch and
--option value), the fix's checks and each branch's conflicts."""
from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from typing import Sequence

from bisector.record.backport_results import VERDICTS, BackportResult, BranchEntry, Conflict
from bisector.report.documents import command_text, md_code, published, redacted
from bisector.report.page import badge, page

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


def backport_summary(result: BackportResult) -> str:
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
    if command_text(result):
        lines.append(f"command: {command_text(result)}")
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
    lines += ["", f"{len(_branch_names(result))} branches: {backport_summary(result)}{_all_cached(result)}"]
    return "\n".join(lines)


@published
def backport_markdown(result: BackportResult) -> str:
    out = ["## bisector backport", "",
           f"Fix {md_code(result.fix[:12])} ({', '.join(md_code(name) for name in _fix_names(result))}): "
           f"{md_code(result.fix_subject)}",
           "", f"Scenario: {md_code(result.scenario or 'none')}", "",
           *([f"Command: {md_code(command_text(result))}", ""] if command_text(result) else []),
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
    out += [f"{len(_branch_names(result))} branches: {backport_summary(result)}{_all_cached(result)}"]
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


def _short(value: object) -> str:
    """A 40-hex sha shortened to 12; anything else as text (None as empty)."""
    text = "" if value is None else str(value)
    return text[:12] if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else text


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
                + "".join(f"<td>{badge(verdict)}</td>" for verdict in verdicts) + "</tr>"
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
                        f'<td>{badge(entry.before)}</td><td>{badge(entry.after)}</td>'
                        f'<td>{badge(entry.verdict)}</td>'
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
    command = command_text(result)
    problems = "".join(f'<div class="card"><span class="v bad">!</span> {e(problem)}</div>'
                       for problem in result.problems)
    body = (f"<h1>{e(title)}</h1><div class=\"meta\">fix <code>{e(result.named(result.fix, 40))}</code> · "
            f"{len(_branch_names(result))} branches"
            + (f"<br>command: <code>{e(command)}</code>" if command else "") + "</div>"
            f'{problems}{"".join(tables)}{"".join(details)}')
    return page(title, body)
