"""Reports rendered from stored result records: text, JSON, Markdown, JUnit XML."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from bisector.backport import VERDICTS


def _culprit_label(result: dict) -> str:
    return "first good commit (the fix)" if result.get("mode") == "find-fix" else "first bad commit"


def bisect_text(result: dict) -> str:
    lines = []
    culprit = result.get("culprit")
    if culprit:
        lines.append(f"{_culprit_label(result)}: {culprit['sha']}")
        lines.append(f"  {culprit['subject']}")
        lines.append(f"  author: {culprit['author']}   date: {culprit['date']}"
                     + (f"   PR: #{culprit['pr']}" if culprit.get("pr") else ""))
        if culprit["files"]:
            lines.append("  files: " + ", ".join(culprit["files"][:20])
                         + (f" (+{len(culprit['files']) - 20} more)" if len(culprit["files"]) > 20 else ""))
    else:
        lines.append(f"inconclusive: skipped commits leave {len(result['candidates'])} candidates "
                     f"for the {_culprit_label(result)}:")
        lines.extend(f"  {sha}" for sha in result["candidates"])
    lines.append(f"steps: {len(result['steps'])}, scenario executions: {result['executions']}, "
                 f"rounds: {result['rounds']}")
    for step in result["steps"]:
        cached = " (cached)" if step["cached"] else ""
        lines.append(f"  {step['sha'][:12]} {step['role']:<8} {step['verdict']:<4} "
                     f"{step['seconds']:7.2f}s{cached}  {step['reason']}")
    return "\n".join(lines)


def bisect_markdown(result: dict) -> str:
    culprit = result.get("culprit")
    out = ["## bisector result", ""]
    if culprit:
        pr = f" (PR #{culprit['pr']})" if culprit.get("pr") else ""
        out += [f"**{_culprit_label(result).capitalize()}:** `{culprit['sha']}`{pr}", "",
                f"> {culprit['subject']}", "",
                f"- author: {culprit['author']}", f"- date: {culprit['date']}",
                "- files: " + ", ".join(f"`{f}`" for f in culprit["files"][:30])]
    else:
        out += [f"**Inconclusive:** skipped commits leave {len(result['candidates'])} candidates:", ""]
        out += [f"- `{sha}`" for sha in result["candidates"]]
    out += ["", f"Scenario `{result['scenario']}`: {result['executions']} executions, "
            f"{len(result['steps'])} steps, {result['rounds']} rounds.", "",
            "| # | commit | role | verdict | seconds | cached | reason |",
            "|---|---|---|---|---|---|---|"]
    for n, step in enumerate(result["steps"], 1):
        reason = step["reason"].replace("|", "\\|")
        out.append(f"| {n} | `{step['sha'][:12]}` | {step['role']} | {step['verdict']} | "
                   f"{step['seconds']:.2f} | {'yes' if step['cached'] else ''} | {reason} |")
    return "\n".join(out) + "\n"


def bisect_json(result: dict) -> str:
    return json.dumps(result, indent=2) + "\n"


# -- backport ------------------------------------------------------------------------------------
BACKPORT_COLUMNS = ("branch", "tip", "pick", "before", "after", "verdict", "detail")


def _backport_rows(result: dict) -> list[tuple[str, ...]]:
    rows = []
    for entry in result["branches"]:
        detail = entry["reason"]
        if entry.get("backport_branch"):
            detail += f"; {entry['backport_branch']['name']} {entry['backport_branch']['state']}"
        rows.append((entry["branch"], entry["tip"][:12], entry["pick"], entry["before"] or "-",
                     entry["after"] or "-", entry["verdict"], detail))
    return rows


def _backport_conflicts(entry: dict) -> list[str]:
    return [f"{c['file']} ({c['kind']}): " + (", ".join(c["hunks"]) or "whole file")
            for c in entry["conflicts"]]


def _backport_summary(result: dict) -> str:
    verdicts = [entry["verdict"] for entry in result["branches"]]
    return ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if v in verdicts)


def backport_text(result: dict) -> str:
    rows = [BACKPORT_COLUMNS, *_backport_rows(result)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(BACKPORT_COLUMNS) - 1)]
    lines = [f"fix {result['fix'][:12]} ({result['fix_ref']}): {result['fix_subject']}",
             f"scenario: {result['scenario'] or 'none'}", ""]
    for row in rows:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    for entry in result["branches"]:
        if entry["conflicts"]:
            lines.append(f"conflicts on {entry['branch']}:")
            lines.extend(f"  {line}" for line in _backport_conflicts(entry))
    lines += ["", f"{len(result['branches'])} branches: {_backport_summary(result)}"]
    return "\n".join(lines)


def backport_markdown(result: dict) -> str:
    out = ["## bisector backport", "",
           f"Fix `{result['fix'][:12]}` ({result['fix_ref']}): {result['fix_subject']}", "",
           f"Scenario: `{result['scenario'] or 'none'}`", "",
           "| " + " | ".join(BACKPORT_COLUMNS) + " |", "|" + "---|" * len(BACKPORT_COLUMNS)]
    for row in _backport_rows(result):
        cells = [f"`{row[0]}`", f"`{row[1]}`", *row[2:5], f"**{row[5]}**", row[6]]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    for entry in result["branches"]:
        if entry["conflicts"]:
            out += ["", f"<details><summary>conflicts on <code>{entry['branch']}</code></summary>", ""]
            out += [f"- `{line}`" for line in _backport_conflicts(entry)]
            out += ["", "</details>"]
    out += ["", f"{len(result['branches'])} branches: {_backport_summary(result)}"]
    return "\n".join(out) + "\n"


def backport_junit(result: dict) -> str:
    """One test case per branch: failure for conflict and fix-ineffective, error for untestable."""
    entries = result["branches"]
    failures = sum(e["verdict"] in ("conflict", "fix-ineffective") for e in entries)
    errors = sum(e["verdict"] == "untestable" for e in entries)
    suite = ET.Element("testsuite", name=f"bisector backport {result['fix'][:12]}",
                       tests=str(len(entries)), failures=str(failures), errors=str(errors))
    for entry in entries:
        case = ET.SubElement(suite, "testcase", classname=f"backport.{result['fix'][:12]}",
                             name=entry["branch"])
        body = "\n".join([entry["reason"], *_backport_conflicts(entry)])
        if entry["verdict"] in ("conflict", "fix-ineffective"):
            ET.SubElement(case, "failure", type=entry["verdict"], message=entry["reason"]).text = body
        elif entry["verdict"] == "untestable":
            ET.SubElement(case, "error", type="untestable", message=entry["reason"]).text = body
        ET.SubElement(case, "system-out").text = f"verdict: {entry['verdict']}\ntip: {entry['tip']}"
    return ET.tostring(ET.ElementTree(suite).getroot(), encoding="unicode", xml_declaration=True) + "\n"


def backport_json(result: dict) -> str:
    return json.dumps(result, indent=2) + "\n"
