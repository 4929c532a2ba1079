"""Judge one child's run from its exit and its log. Pure."""
from __future__ import annotations

import re

from bisector.process import ProcessResult
from scenarios.base import Verdict, fault_lines
from scenarios.dpa_fp8_kv.child import OK_MARKER, READY_MARKER

ABORT_CODES = (-6, 134)  # SIGABRT as Python reports it, as a shell reports it
ENGINE_CORE_ABORT = re.compile(r"Failed core proc\(s\): \{.*: -6\b.*")
AITER_MLA = re.compile(r"AITER.?MLA", re.IGNORECASE)
SKIP_CAUSES = (
    ("no GPU", re.compile(r".*(No (HIP|CUDA) GPUs are available|hipErrorNoDevice).*")),
    ("out of GPU memory", re.compile(
        r".*((HIP|CUDA) out of memory|OutOfMemoryError|hipErrorOutOfMemory"
        r"|No available memory for the cache blocks).*")),
    ("build problem", re.compile(
        r".*(undefined symbol|No module named '?vllm\._|hipErrorNoBinaryForGpu"
        r"|invalid device function|no kernel image is available).*")),
    ("import error", re.compile(r"^(ModuleNotFoundError|ImportError): .*", re.MULTILINE)),
)
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*", re.MULTILINE)


def classify(result: ProcessResult) -> tuple[Verdict, str]:
    """Fault or SIGABRT → bad; marker on AITER MLA → good; anything else → skip, saying why."""
    output = result.output
    phase = "during decode" if READY_MARKER in output else "during engine start-up/graph capture"
    faults = fault_lines(output, limit=3)
    if faults:
        return Verdict.BAD, f"GPU memory fault {phase}: " + " | ".join(faults)
    core_abort = ENGINE_CORE_ABORT.search(output)
    if result.returncode in ABORT_CODES or core_abort:
        where = core_abort.group(0).strip() if core_abort else f"exit {result.returncode}"
        return Verdict.BAD, f"SIGABRT {phase}: {where}"
    if OK_MARKER in output:
        if not AITER_MLA.search(output):
            return Verdict.SKIP, ("decode finished but the log never names the AITER MLA backend, "
                                  "so this run did not test it")
        return Verdict.GOOD, f"graph capture and a decode step finished on AITER MLA: {_marker_line(output)}"
    if result.timed_out:
        return Verdict.SKIP, f"timed out after {result.seconds:.0f}s {phase}"
    for label, pattern in SKIP_CAUSES:
        found = pattern.search(output)
        if found:
            return Verdict.SKIP, f"{label}: {found.group(0).strip()}"
    return Verdict.SKIP, f"{_exit_text(result)} before the marker: {_last_error(output)}"


def _marker_line(output: str) -> str:
    return next(line.strip() for line in output.splitlines() if OK_MARKER in line)


def _exit_text(result: ProcessResult) -> str:
    if result.signal_name:
        return f"killed by {result.signal_name}"
    if result.returncode is None:
        return "stopped"
    return f"exit {result.returncode}"


def _last_error(output: str) -> str:
    errors = [match.group(0) for match in EXCEPTION_LINE.finditer(output)]
    if errors:
        return errors[-1].strip()
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def combine(results: list[ProcessResult], judged: list[tuple[Verdict, str]]) -> tuple[Verdict, str]:
    """One verdict for all DP ranks from each rank's: any bad → bad; all good → good; else a skip.

    A rank stopped because a peer failed gives the skip reason only if no other rank has one.
    """
    if len(judged) == 1:
        return judged[0]
    for rank, (verdict, reason) in enumerate(judged):
        if verdict is Verdict.BAD:
            return verdict, f"DP rank {rank}: {reason}"
    if all(verdict is Verdict.GOOD for verdict, _ in judged):
        return Verdict.GOOD, f"all {len(judged)} DP ranks: {judged[0][1]}"
    skips = [rank for rank, (verdict, _) in enumerate(judged) if verdict is Verdict.SKIP]
    stopped = {rank for rank, result in enumerate(results)
               if result.returncode is None and not result.timed_out}
    rank = next((rank for rank in skips if rank not in stopped), skips[0])
    return Verdict.SKIP, f"DP rank {rank}: {judged[rank][1]}"
