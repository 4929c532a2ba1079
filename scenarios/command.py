"""Any command, judged by git bisect's exit protocol."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from bisector.errors import ScenarioAbort, ScenarioError
from bisector.machine.probe_env import python_environment
from bisector.metrics import FILE_VARIABLE, MetricError, parse_output, read_file
from bisector.process import NO_ROOM_TEXTS, no_room, run_process, watch_for
from bisector.signatures import failure_signature
from scenarios.base import BaseScenario, Outcome, StepContext, Verdict, fault_lines

SKIP_EXIT = 125
# Signals a crashing program raises itself: evidence of a fault (bad).
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP"})
# Signals sent from outside (the OOM killer, a `kill` of a hung step, Ctrl-C, a closed terminal): no
# evidence about the commit, so a skip that is never cached (the next run judges the commit again).
OUTSIDE_SIGNALS = frozenset({"SIGKILL", "SIGTERM", "SIGINT", "SIGHUP"})
# A file size limit hit (`ulimit -f`, a quota): the machine's, a skip that is never cached either.
MACHINE_SIGNALS = frozenset({"SIGXFSZ"})
watch_for(*NO_ROOM_TEXTS)  # a command that failed saying it met a full disk, a quota or a file size limit


class CommandScenario(BaseScenario):
    """Exit 0 good, 125 skip, 1-127 bad; killed by a crash signal (CRASH_SIGNALS) bad, by one from outside
    (OUTSIDE_SIGNALS), the machine's (MACHINE_SIGNALS) or any other a skip; other exits >= 128 abort the run;
    a step whose log cannot be written for want of room (a full disk, `ulimit -f`), or that failed saying it
    met none (NO_ROOM_TEXTS, without a GPU fault line), is the machine's skip. A
    good run's metrics (bisector.metrics: `BISECTOR_METRIC name=value` lines, else the JSON file
    `$BISECTOR_METRIC_FILE` names, whose values win) are its Outcome's.

    What decides a command's verdict (the files it reads, the variables it sees) cannot be known, so
    its verdicts are reused across runs only with --reuse-verdicts (inputs_known False)."""

    name = "command"
    description = "run a command in the checkout; git bisect run's exit protocol"
    runs_in_images = True
    inputs_known = False

    def __init__(self, argv: list[str], in_image: bool = False):
        """in_image: the command runs inside each commit's image (--image), where it must exist, not here."""
        super().__init__({})
        if not argv:
            raise ScenarioError("no command given after --")
        if not in_image and shutil.which(argv[0]) is None and not _is_checkout_relative(argv[0]):
            raise ScenarioError(f"command not found: {argv[0]}")
        self.argv = list(argv)

    @property
    def gpus_per_run(self) -> int:
        """A command may drive a GPU: it gets one where there are GPUs, a CPU slot elsewhere."""
        return 1

    def identity(self, python: str) -> dict:
        """argv, the content of every file it names outside the checkout, and the --python environment."""
        return {"scenario": self.name, "argv": list(self.argv), "files": outside_files(self.argv),
                "python": python_environment(python)}

    def run(self, ctx: StepContext) -> Outcome:
        argv = list(self.argv)
        candidate = ctx.checkout / argv[0]
        if _is_checkout_relative(argv[0]) and candidate.exists():
            argv[0] = str(candidate)
        metric_file = ctx.log_path.with_name(ctx.log_path.name + ".metrics.json")
        metric_file.unlink(missing_ok=True)
        step_env = {**ctx.env, FILE_VARIABLE: str(metric_file)}
        env: dict | None = step_env
        if ctx.container is not None:  # the checkout at its own path inside the commit's image
            argv, env = ctx.container.command(argv, ctx.checkout, step_env, mounts=(metric_file.parent,)), None
        try:
            result = run_process(argv, ctx.checkout, ctx.log_path, ctx.timeout, env, ctx.cancel)
        except OSError as exc:
            if no_room(exc):  # the step's log (or the tool's files beside it) could not be written
                return Outcome(Verdict.SKIP, f"cannot run {argv[0]}: {exc.strerror} (a full disk, a quota or a "
                               f"file size limit)", str(ctx.log_path), cause="machine")
            return Outcome(Verdict.SKIP, f"cannot start {argv[0]}: {exc.strerror}", str(ctx.log_path))
        log = str(ctx.log_path)
        code = result.returncode
        if result.timed_out or code is None:  # no exit status: killed for the timeout
            return Outcome(Verdict.SKIP, f"timed out after {ctx.timeout:g}s", log, timed_out=True)
        faults = fault_lines("\n".join(result.marked))
        signature = failure_signature(result.output + "\n" + "\n".join(result.marked), code)
        if result.signal_name:
            return _killed(result.signal_name, faults, log, signature)
        if code == 0:
            try:
                metrics = {**parse_output(result.output), **read_file(metric_file)}
            except MetricError as exc:
                return Outcome(Verdict.SKIP, f"exit 0, but {exc}", log)
            shown = ", ".join(f"{name}={value:g}" for name, value in metrics.items())
            return Outcome(Verdict.GOOD, f"exit 0 ({shown})" if shown else "exit 0", log, metrics=metrics)
        if code == SKIP_EXIT:
            return Outcome(Verdict.SKIP, "exit 125 (skip)", log)
        no_room_line = next((line for line in result.marked if any(text in line for text in NO_ROOM_TEXTS)), None)
        if no_room_line and not faults:
            return Outcome(Verdict.SKIP, f"exit {code}: {no_room_line.strip()} (a full disk, a quota or a file size "
                           f"limit), no verdict", log, cause="machine")
        if code < 128:
            return Outcome(Verdict.BAD, f"exit {code}" + (f": {faults[0]}" if faults else ""), log, signature=signature)
        if faults:
            return Outcome(Verdict.BAD, f"exit {code}: {faults[0]}", log, signature=signature)
        raise ScenarioAbort(f"command exited {code} (>= 128, not a signal): aborting as git bisect run "
                            f"does; see {log}")


def _killed(signal_name: str, faults: list[str], log: str, signature: str) -> Outcome:
    """A command killed by a signal: a crash (or a GPU fault line) is bad; a kill from outside is no
    verdict and not cached (cause "external-signal"), as a file size limit's is (cause "machine"); any other
    signal is no evidence either."""
    reason = f"killed by {signal_name}"
    if signal_name in CRASH_SIGNALS or faults:
        return Outcome(Verdict.BAD, reason + (f": {faults[0]}" if faults else ""), log, signature=signature)
    if signal_name in OUTSIDE_SIGNALS:
        cause = " (OOM killer?)" if signal_name == "SIGKILL" else ""
        return Outcome(Verdict.SKIP, f"{reason} from outside{cause}: no verdict", log, {"signal": signal_name},
                       cause="external-signal")
    if signal_name in MACHINE_SIGNALS:
        return Outcome(Verdict.SKIP, f"{reason}: a file size limit (ulimit -f, a quota), no verdict", log,
                       {"signal": signal_name}, cause="machine")
    return Outcome(Verdict.SKIP, f"{reason}, not a crash signal: no verdict", log)


def outside_files(argv: list[str]) -> dict[str, str]:
    """sha256 (16 hex) of each file an argv word names outside the checkout: absolute paths (also as
    the value of `--opt=/path`) and the program found on PATH. Relative words name files in the
    checkout, which the commit already identifies."""
    found: dict[str, str] = {}
    for n, word in enumerate(argv):
        value = word.partition("=")[2] if "=" in word and not word.startswith("/") else word
        if n == 0 and "/" not in word:
            value = shutil.which(word) or ""
        if value.startswith("/") and Path(value).is_file():
            found[value] = _file_hash(Path(value))
    return found


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _is_checkout_relative(program: str) -> bool:
    return "/" in program and not program.startswith("/")
