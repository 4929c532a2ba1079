"""What every report is made of: printable text (no ANSI, nothing XML 1.0 cannot hold) with no credentials in
it (`published`, `redacted`), untrusted text as Markdown code, and the cells several reports share."""
from __future__ import annotations

import re
import shlex
from functools import wraps
from typing import Any, Callable, Mapping, Sequence

from bisector.record.results import named
from bisector.record.runs import Result
from bisector.redact import redact

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


def short_ends(shas: Sequence[str], names: Mapping[str, str] | None = None) -> str:
    """Range ends, shortened, each with the tag or branch naming it when names has one."""
    return ",".join(named(sha, names or {}) for sha in shas)


def command_text(result: Result) -> str | None:
    """How the run was asked for, as one shell-quoted line (None for records that predate it)."""
    return shlex.join(result.command_line) if result.command_line else None
