"""Starts `bisector` CLI drivers by fork from one process that imported the CLI once.

A test that starts many drivers only to kill them (test_fault_injection) pays Python's and the CLI's import
once instead of per driver. Each line on stdin is a JSON list of CLI arguments; for each, a child is forked
that runs the CLI's main with them (stdin, stdout and stderr on /dev/null), and its pid is written on stdout.
Children are reaped at once (SIGCHLD ignored here), so a driver that ended is gone from /proc.
"""
from __future__ import annotations

import json
import os
import signal
import sys

from bisector import cli


def run_driver(args: list[str]) -> None:
    """In the forked child: the CLI, as `python -m bisector.cli ARGS` runs it; never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the driver waits on its own children
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    code = 1
    try:
        cli.main(args, prog_name="bisector")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os._exit(code)


def serve() -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            run_driver(json.loads(line))
        print(pid, flush=True)


if __name__ == "__main__":
    serve()
