"""The progress display: one line per event on stderr (rich, imported at the first line printed)."""
from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from bisector.errors import UsageError
from bisector.record.results import named
from bisector.record.steps import Handler, Step
from bisector.redact import redact

if TYPE_CHECKING:
    from rich.console import Console


class StderrConsole:
    """rich's Console on stderr, made at the first line printed (importing rich costs more than click)."""

    @functools.cached_property
    def rich(self) -> Console:
        from rich.console import Console
        return Console(stderr=True, highlight=False, soft_wrap=True)  # one event, one line: never wrapped

    def print(self, *objects: Any, **settings: Any) -> None:
        """Print objects, credentials in text redacted (bisector.redact)."""
        self.rich.print(*(redact(o) if isinstance(o, str) else o for o in objects), **settings)


def escape(text: str) -> str:
    """text with rich markup neutralised."""
    from rich.markup import escape as rich_escape
    return rich_escape(text)


console = StderrConsole()


def resume_hint(no_cache: bool) -> str:
    """What a rerun does with the verdicts an interrupted run kept: --no-cache judges every commit again."""
    return ("without --no-cache the same command resumes and reuses them (with it, every commit is judged again)"
            if no_cache else "run the same command to resume")


def counted(number: int, noun: str) -> str:
    """`1 commit`, `2 commits`: the number with its noun in the right number."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


PERIOD_VARIABLE = "BISECTOR_PROGRESS_SECONDS"
PERIOD_RANGE = (0.1, 86400.0)  # seconds: more often would spin the heartbeat, less is never


def progress_period() -> float:
    """How often the heartbeat prints: PERIOD_VARIABLE's seconds (within PERIOD_RANGE), else 30; UsageError in
    one line for anything else."""
    given = os.environ.get(PERIOD_VARIABLE, "").strip()
    low, high = PERIOD_RANGE
    try:
        seconds = float(given) if given else 30.0
    except ValueError:
        seconds = float("nan")
    if not low <= seconds <= high:  # NaN too
        raise UsageError(f"{PERIOD_VARIABLE}={given[:40]!r}: a number of seconds from {low:g} to {high:g}")
    return seconds


class ProgressHandler(Handler):
    """One line per event on stderr, never wrapped (CI logs are grepped): each step as it lands with its
    log, and every BISECTOR_PROGRESS_SECONDS the phase and last output line of each step still running."""

    def __init__(self, notes: list[str] | None = None, metric: str | None = None):
        self.metric = metric  # a performance hunt's: its steps say what they measured, not "good"
        self.count = 0  # steps of the run now going: numbered as its reports number them
        self.runs = 0   # runs started by this command (--prefilter and --follow-pins levels start several)
        self.start = time.monotonic()
        self.notes = notes or []  # said once, at the start
        self.logs: Path | None = None
        self.running: dict[str, float] = {}  # sha -> when it started
        self.shown: dict[str, str] = {}      # sha -> the last progress line printed for it
        self.period = progress_period()
        self.names: dict[str, str] = {}  # sha -> the tag or branch naming it, of the runs so far

    def named(self, names: Mapping[str, str]) -> None:
        self.names.update(names)

    def _named(self, sha: str) -> str:
        return escape(named(sha, self.names))

    def waiting(self, holder: str) -> None:
        console.print(f"waiting for another bisector run on this repository ({escape(holder)}) …")

    def started(self, run_id: int, total: int, resumed_from: int | None, logs: Path) -> None:
        self.start = time.monotonic()  # the ETA counts from here, not from the wait for the lock
        self.logs = logs
        again = f", resuming run {resumed_from}" if resumed_from else ""
        console.print(f"run {run_id}: {total} commits in range{again}")
        self.count = 0
        self._begin()

    def calibrating(self, good: str, bad: str, runs: int, logs: Path) -> None:
        self.start, self.logs = time.monotonic(), logs
        console.print(f"calibrating: {counted(runs, 'run')} of each end, bad {self._named(bad)} and good "
                      f"{self._named(good)}")
        self._begin()

    def judging(self, sha: str, logs: Path) -> None:
        """`scenario run`: its one commit, heard from while it runs as a step is."""
        self.start, self.logs = time.monotonic(), logs
        console.print(f"judging {self._named(sha)} …")
        self._begin()
        self.running[sha] = time.monotonic()

    def _begin(self) -> None:
        """The notes and the heartbeat, once per command (--prefilter and --follow-pins levels start several runs)."""
        self.runs += 1
        if self.runs == 1:
            for note in self.notes:
                console.print(escape(note))
            threading.Thread(target=self._heartbeat, name="progress", daemon=True).start()

    def testing(self, sha: str, role: str) -> None:
        self.running[sha] = time.monotonic()
        console.print(f"  testing {self._named(sha)}, {role} …", style="dim")

    def tested(self, step: Step, left: int, steps_left: int) -> None:
        self.running.pop(step.sha, None)
        self.count += 1
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.count * steps_left
        colour = {"good": "green", "bad": "red"}.get(step.verdict, "yellow")
        said = f"[{colour}]{step.verdict}[/{colour}]"
        if self.metric and step.verdict == "good" and self.metric in step.execution.metrics:  # a run's sample
            said = f"measured {escape(self.metric)} {step.execution.metrics[self.metric]:,.6g}"
        cached = " cached" if step.cached else ""
        build = escape(f" [build {step.build}]") if step.build else ""
        console.print(f"step {self.count}: {self._named(step.sha)} {said}{cached} "
                      f"({escape(' '.join(step.reason.splitlines()))}){build} | {counted(left, 'commit')} left, "
                      f"~{counted(steps_left, 'step')} to go | "
                      f"elapsed {elapsed:.0f}s ETA {eta:.0f}s", markup=True)
        if step.log_path:
            console.print(f"  log: {escape(step.log_path)}", markup=True)

    def cancelled(self, sha: str) -> None:
        self.running.pop(sha, None)
        console.print(f"  {self._named(sha)} cancelled (answer found elsewhere)", markup=True)

    def level(self, text: str) -> None:
        console.print(escape(text))

    def _heartbeat(self) -> None:
        while True:
            time.sleep(self.period)
            for sha, since in list(self.running.items()):
                line = self._progress(sha)
                if line and line != self.shown.get(sha):
                    self.shown[sha] = line
                    console.print(f"  … {self._named(sha)} {time.monotonic() - since:.0f}s {escape(line)}", markup=True)

    def _progress(self, sha: str) -> str | None:
        """The step's phase (build command or scenario) and the last line its newest log holds."""
        logs = sorted(self.logs.glob(f"*{sha[:12]}*.log"), key=lambda p: p.stat().st_mtime) \
            if self.logs and self.logs.is_dir() else []
        if not logs:
            return None
        newest = logs[-1]
        if newest.name.startswith("pull-"):  # bytes and layers so far (bisector.world.images)
            from bisector.world.images import pull_progress
            return f"pull: {pull_progress(newest) or '(no layer done yet)'}"
        phase = "build " + newest.stem.rsplit("-", 1)[-1] if newest.name.startswith("build-") else \
            "image check" if newest.name.startswith("image-") else "scenario"
        with open(newest, "rb") as handle:
            handle.seek(max(0, newest.stat().st_size - 4096))
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
        return f"{phase}: {lines[-1][:200]}" if lines else f"{phase}: (no output yet)"

