"""Reports rendered from stored result records: text, JSON, Markdown."""
from __future__ import annotations

import json
import shlex


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
        build = f"  [build {step['build']}]" if step.get("build") else ""
        lines.append(f"  {step['sha'][:12]} {step['role']:<8} {step['verdict']:<4} "
                     f"{step['seconds']:7.2f}s{cached}  {step['reason']}{build}")
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


def plan_text(plan: dict) -> str:
    """`bisector run --plan`: the first commits to test, the build each needs and its commands."""
    lines = [f"plan: {plan['commits']} commits in range, --build {plan['builder']}"]
    for probe in plan["probes"]:
        lines.append(f"  {probe['sha'][:12]}  {probe['role']:<28} {probe['build']:<13} {probe['reason']}")
        for command in probe["commands"]:
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in command["env"].items())
            lines.append(f"      $ {env + ' ' if env else ''}{shlex.join(command['argv'])}")
    return "\n".join(lines)
