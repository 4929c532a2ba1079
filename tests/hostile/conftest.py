"""The hostile-input suite (issue 45, ../shared/HOSTILE.md): bad input, signals, odd paths and secrets, each a row.

Every row runs the real tool on real repositories, environments and files, and asserts what HOSTILE.md asks:
one line and a non-zero exit for bad input, nothing changed outside the tool's own marked files, no credential
in any output or row of the record, no wrong answer printed as certain. A new command or option lands with its
rows here (CONTRIBUTING.md). Files are named test_hostile_<area>.py (tests/ is no package: names stay unique).
"""
from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest

from bisector.errors import EXIT_USAGE

SECRET = "s3cr@t-t0ken"  # a password with '@' inside: a redaction that stops at the first '@' leaks its tail


def one_line_error(proc: subprocess.CompletedProcess, code: int = EXIT_USAGE) -> str:
    """The one `bisector: error:` line proc printed on stderr, once its exit code is checked and no traceback came."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("bisector: error: "), proc.stderr
    return lines[0]


def record_text(state_dir: Path) -> str:
    """Every value of every row of the record at state_dir, as one text (to look for a secret in)."""
    with sqlite3.connect(state_dir / "bisector.sqlite") as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for table in tables for row in db.execute(f"SELECT * FROM {table}"))


def tree_listing(folder: Path) -> dict[str, bytes]:
    """Every file under folder with its bytes (to show nothing of the user's changed)."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="session")
def hostile():
    """The helpers rows share: one_line_error, record_text, tree_listing, SECRET."""
    return type("Hostile", (), {"one_line_error": staticmethod(one_line_error),
                                "record_text": staticmethod(record_text),
                                "tree_listing": staticmethod(tree_listing), "SECRET": SECRET})
