"""Judge one child's run from its exit and its log. Pure.

Every check reads one line at a time, after vLLM's `(EngineCore pid=N) ` / `(EngineCore_DP0 pid=N) `
prefix is stripped, with substring tests only: the time is linear in the log's size.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from bisector.process import ProcessResult
from scenarios.base import Verdict
from scenarios.dpa_fp8_kv.child import OK_MARKER, READY_MARKER

ABORT_CODES = (-6, 134)  # SIGABRT as Python reports it, as a shell reports it
KILL_CODES = (-9, 137)  # SIGKILL, likewise: sent from outside (the OOM killer, a kill of a hung step)
OUTSIDE_KILL = "killed by SIGKILL from outside (OOM killer?)"
NO_GPU = "no GPU"
# Faults the hardware raised, as a parent process sees them; one line each.
MEMORY_FAULTS = {
    "rocm": ("Memory access fault by GPU node-", "HSA_STATUS_ERROR_MEMORY_FAULT",
             "HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION"),
    "cuda": ("an illegal memory access was encountered", "misaligned address",
             "unspecified launch failure", "device-side assert triggered"),
}
HARDWARE_EXCEPTION = ("HSA_STATUS_ERROR_EXCEPTION", "0x1016")  # ROCm: both on one line
SKIP_CAUSES = (
    (NO_GPU, ("No HIP GPUs are available", "No CUDA GPUs are available", "hipErrorNoDevice",
                "CUDA driver initialization failed")),
    ("out of GPU memory", ("HIP out of memory", "CUDA out of memory", "OutOfMemoryError",
                           "hipErrorOutOfMemory", "No available memory for the cache blocks")),
    ("build problem", ("undefined symbol", "hipErrorNoBinaryForGpu", "invalid device function",
                       "no kernel image is available")),
)
# Compiled modules a checkout gets from its build: missing means a build problem. (vllm/_version.py is
# generated too, but vLLM only warns without it.)
EXTENSION_MODULES = ("vllm._C", "vllm._moe_C", "vllm._rocm_C", "vllm._flashmla", "vllm.cumem_allocator",
                     "vllm.vllm_flash_attn._vllm_fa")
IMPORT_ERRORS = ("ModuleNotFoundError: ", "ImportError: ")
CAUSE_ORDER = [label for label, _ in SKIP_CAUSES] + ["import error"]
ENGINE_CORE_FAILED = "Failed core proc(s): {"
DOWNGRADE = "; setting cudagraph_mode="  # vLLM's warning when it lowers the requested mode
NO_FULL_DECODE = ("PIECEWISE", "NONE")  # downgrade targets that capture no full decode graph
ENGINE_FAILED = "Engine core initialization failed"  # the frontend's line; the cause is above it
_PREFIX = re.compile(r"\((?:\w{1,40} )?pid=\d{1,10}\) ")  # vLLM's process prefix, matched at line start
# vLLM's logger prefix: `ERROR 11-30 12:47:16 [core.py:1231] `, matched at line start.
_LOGGER = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{1,6})? "
                     r"\[[^\]\n]{1,120}\] ")


def strip_prefix(line: str) -> str:
    """line without vLLM's leading `(EngineCore_DP0 pid=42) `-style process prefixes and, for the
    lines of a logged traceback, the logger's `ERROR 11-30 12:47:16 [core.py:1231] ` before the text."""
    for _ in range(3):
        match = _PREFIX.match(line)
        if not match:
            break
        line = line[match.end():]
    logged = _LOGGER.match(line)
    return line[logged.end():] if logged and logged.group(0).startswith("ERROR") else line


@dataclass(frozen=True)
class Evidence:
    """What one rank's log shows, gathered in one pass."""

    memory_faults: list[str]  # before the OK marker
    hardware_exceptions: list[str]  # a lone HSA 0x1016 line (ROCm)
    ready: bool
    ok_line: str | None
    backend_line: str | None
    downgrade: str | None
    skip_causes: list[tuple[str, str]]
    core_abort: str | None
    last_error: str | None
    last_line: str | None


def selection_lines(backend: str) -> tuple[str, ...]:
    """vLLM's own lines for having selected backend: 'Using ROCM_AITER_MLA backend' (ROCm, 0.19+),
    'Using AttentionBackendEnum.TRITON_MLA backend.' (CUDA, --attention-backend), 'Using TRITON_MLA
    attention backend out of …' (CUDA's own choice), and 'Using AITER MLA backend' (ROCm before 0.19)."""
    lines = (f"Using {backend} backend", f"Using AttentionBackendEnum.{backend} backend",
             f"Using {backend} attention backend")
    return lines + (("Using AITER MLA backend",) if backend == "ROCM_AITER_MLA" else ())


def gather(output: str, platforms: tuple[str, ...], backends: tuple[str, ...]) -> Evidence:
    faults_wanted = tuple(marker for platform in platforms for marker in MEMORY_FAULTS[platform])
    selected = tuple(line for backend in backends for line in selection_lines(backend))
    faults, exceptions, causes = [], [], []
    ready = False
    ok_line = backend_line = downgrade = core_abort = last_error = last_line = None
    for raw in output.splitlines():
        line = strip_prefix(raw.strip())
        if not line:
            continue
        last_line = line
        if OK_MARKER in line:
            ok_line = ok_line or line
        if READY_MARKER in line:
            ready = True
        if ok_line is None:
            fault = next((marker for marker in faults_wanted if marker in line), None)
            if fault:
                faults.append(_after_progress_bar(line, fault))
        if "rocm" in platforms and all(marker in line for marker in HARDWARE_EXCEPTION):
            exceptions.append(line)
        if backend_line is None and any(marker in line for marker in selected):
            backend_line = line
        if downgrade is None and DOWNGRADE in line:
            downgrade = line
        if ENGINE_CORE_FAILED in line:
            core_abort = line[line.index(ENGINE_CORE_FAILED):]
        for label, markers in SKIP_CAUSES:
            if any(marker in line for marker in markers):
                causes.append((label, line))
        if _missing_extension(line):
            causes.append(("build problem", line))
        if line.startswith(IMPORT_ERRORS):
            causes.append(("import error", line))
        if _is_exception_line(line) and (last_error is None or ENGINE_FAILED not in line):
            last_error = line  # the frontend's "Engine core initialization failed" only if nothing else
    return Evidence(list(dict.fromkeys(faults)), exceptions, ready, ok_line, backend_line, downgrade, causes,
                    core_abort, last_error, last_line)


def classify(result: ProcessResult, platforms: tuple[str, ...] = ("rocm",),
             backends: tuple[str, ...] = ("ROCM_AITER_MLA",)) -> tuple[Verdict, str]:
    """Memory fault → bad; OK marker on the backend → good (teardown after it does not count);
    ROCm SIGABRT → bad; anything else → skip, saying why."""
    evidence = gather(result.output, platforms, backends)
    phase = "during decode" if evidence.ready else "during engine start-up/graph capture"
    if evidence.memory_faults:
        return Verdict.BAD, f"GPU memory fault {phase}: " + " | ".join(evidence.memory_faults[:3])
    if evidence.ok_line:
        if evidence.backend_line is None:
            return Verdict.SKIP, (f"decode finished but the log never says vLLM selected "
                                  f"{' or '.join(backends)}, so this run did not test it")
        if evidence.downgrade and evidence.downgrade.rsplit("=", 1)[-1].strip(" .") in NO_FULL_DECODE:
            return Verdict.SKIP, f"decode finished without full decode graphs: {evidence.downgrade}"
        return Verdict.GOOD, (f"graph capture and a decode step finished on {' or '.join(backends)}: "
                              f"{evidence.ok_line}")
    if evidence.hardware_exceptions:
        return Verdict.SKIP, f"hardware exception, not a memory fault: {evidence.hardware_exceptions[0]}"
    if "rocm" in platforms and (result.returncode in ABORT_CODES
                                or _core_aborted(evidence.core_abort)):
        where = evidence.core_abort or f"exit {result.returncode}"
        return Verdict.BAD, f"SIGABRT {phase}: {where}"
    if result.timed_out:
        return Verdict.SKIP, f"timed out after {result.seconds:.0f}s {phase}"
    if result.returncode in KILL_CODES or _core_killed(evidence.core_abort):
        last = evidence.core_abort or evidence.last_error or evidence.last_line or "no output"
        return Verdict.SKIP, f"{OUTSIDE_KILL} {phase}: no verdict; {last}"
    if evidence.skip_causes:
        label, line = min(evidence.skip_causes, key=lambda cause: CAUSE_ORDER.index(cause[0]))
        return Verdict.SKIP, f"{label}: {line}"
    last = evidence.last_error or evidence.last_line or "no output"
    return Verdict.SKIP, f"{_exit_text(result)} before the marker: {last}"


def matched_lines(output: str, platforms: tuple[str, ...], backends: tuple[str, ...]) -> list[str]:
    """The lines a verdict on output rests on, in a fixed order (faults first), without duplicates."""
    evidence = gather(output, platforms, backends)
    lines = [*evidence.memory_faults, *evidence.hardware_exceptions, evidence.backend_line,
             evidence.downgrade, evidence.ok_line, evidence.core_abort,
             *(line for _, line in evidence.skip_causes)]
    return list(dict.fromkeys(line for line in lines if line))


def details(output: str, backends: tuple[str, ...]) -> dict:
    """What the verdict's details report from a log: the backend line, a cudagraph-mode downgrade."""
    evidence = gather(output, (), backends)
    found = {"backend_selected": evidence.backend_line}
    if evidence.downgrade:
        found["cudagraph_downgrade"] = evidence.downgrade
    return found


# vLLM's torch.compile lines (0.2x): the total, the engine's summary, and whether the compiled model came
# from the cache. "Compiling a graph for compile range" shows in both cases (Inductor's own cache may
# answer it), so it decides nothing; a load failure or a newly saved model is a miss.
# (with the cache disabled vLLM times compile and warm-up together: "torch.compile and initial
# profiling/warmup run together took X s in total")
COMPILE_TOTAL = re.compile(r"torch\.compile (?:and initial profiling/warmup run together )?took ([0-9.]+) s in total")
ENGINE_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s"
                         r"(?: \(compilation: ([0-9.]+) s)?")
COMPILE_HIT = ("Directly load AOT compilation from path", "Directly load the compiled graph(s)")
COMPILE_MISS = ("saved AOT compiled function to", "Compiling model again due to a load failure",
                "Compiling a graph for compile range")


def compile_details(output: str) -> dict:
    """{"cache_hit": True/False/None, "compile_seconds", "engine_init_seconds"} from vLLM's log lines:
    a hit when vLLM loaded the compiled model and saved none; None when it compiled nothing at all
    (eager, or it stopped first). compile_seconds: the engine's "(compilation: X s)", else the
    "torch.compile took X s" total (an engine that fails in graph capture logs only that one)."""
    hit = saved = compiled = False
    total = engine = engine_compile = None
    for line in output.splitlines():
        if "ompil" not in line and "init engine" not in line and "Directly load" not in line:
            continue
        hit = hit or any(marker in line for marker in COMPILE_HIT)
        saved = saved or any(marker in line for marker in COMPILE_MISS[:2])
        compiled = compiled or COMPILE_MISS[2] in line
        found = COMPILE_TOTAL.search(line)
        if found:
            total = float(found.group(1))
        found = ENGINE_INIT.search(line)
        if found:
            engine = float(found.group(1))
            engine_compile = float(found.group(2)) if found.group(2) else None
    cache_hit = (hit and not saved) if (hit or saved or compiled) else None
    return {"cache_hit": cache_hit, "compile_seconds": engine_compile if engine_compile is not None else total,
            "engine_init_seconds": engine}


def _missing_extension(line: str) -> bool:
    """`No module named 'vllm._C'` and the like: a compiled module the build should have provided."""
    start = line.find("No module named '")
    if start < 0:
        return False
    name = line[start + len("No module named '"):].split("'", 1)[0]
    return name.startswith(EXTENSION_MODULES)


def _after_progress_bar(line: str, marker: str) -> str:
    """The fault line without a tqdm bar the fault was printed onto ('… 47/51 [00:44<00:03]Memory …')."""
    before = line[:line.index(marker)]
    return line[len(before):] if "|" in before and before.endswith("]") else line


def skip_cause(judged: list[tuple[Verdict, str]]) -> str | None:
    """Why the ranks' skip is no verdict about the commit (bisector.record.store.CAUSES): a rank killed from outside
    ("external-signal"), a rank that found no GPU ("machine"); None: the commit's own skip."""
    reasons = [reason for verdict, reason in judged if verdict is Verdict.SKIP]
    if any(reason.startswith(OUTSIDE_KILL) for reason in reasons):
        return "external-signal"
    if any(reason.startswith(f"{NO_GPU}: ") for reason in reasons):
        return "machine"
    return None


def _core_killed(line: str | None) -> bool:
    """vLLM's `Failed core proc(s): {'EngineCore_DP0': -9}`: an engine core died of SIGKILL."""
    return line is not None and any(f": -9{end}" in line for end in ("}", ","))


def _core_aborted(line: str | None) -> bool:
    """vLLM's `Failed core proc(s): {'EngineCore_DP0': -6}`: an engine core died of SIGABRT."""
    return line is not None and any(f": -6{end}" in line for end in ("}", ","))


def _is_exception_line(line: str) -> bool:
    """`ValueError: …`, `torch.OutOfMemoryError: …`, `SystemExit` and the like."""
    head = line.split(":", 1)[0]
    name = head.rsplit(".", 1)[-1]
    return (" " not in head and name[:1].isalpha() and name.replace("_", "").isalnum()
            and name.endswith(("Error", "Exception", "Exit")))


def _exit_text(result: ProcessResult) -> str:
    if result.signal_name:
        return f"killed by {result.signal_name}"
    if result.returncode is None:
        return "stopped"
    return f"exit {result.returncode}"


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
