"""Failure signatures: what kind of failure a bad run was, so a bisection blames only the fault it hunts.

A signature is a short normalised text, "fault kind [phase]": addresses, node numbers, pids and other
numbers are stripped, so the same fault on two commits has the same signature. `--signature auto` takes
the first bad run's signature as the run's; a later bad run with another signature is a skip
("different failure: …"), as syzbot reports unrelated crashes around a culprit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from bisector.record.results import SignatureRecord

PREFIX_CHARS = 400  # only a line's head is examined: scanning stays linear in the output size
# Fault kinds by the substring that shows them (ROCm and CUDA as a parent process sees them).
FAULT_KINDS = (
    ("Memory access fault by GPU", "GPU memory access fault"),
    ("HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION", "GPU memory aperture violation"),
    ("HSA_STATUS_ERROR_MEMORY_FAULT", "GPU memory access fault"),
    ("an illegal memory access was encountered", "GPU illegal memory access"),
    ("misaligned address", "GPU misaligned address"),
    ("unspecified launch failure", "GPU unspecified launch failure"),
    ("device-side assert triggered", "GPU device-side assert"),
)
# What the process was doing when a marker line was its last progress before the failure.
PHASES = (
    ("Capturing CUDA graph", "during CUDA-graph capture"),
    ("Capturing cudagraph", "during CUDA-graph capture"),
    ("Graph capturing finished", "after CUDA-graph capture"),
)
ENGINE_PREFIX = re.compile(r"\((?:\w{1,40} )?pid=\d{1,10}\) ")  # vLLM's "(EngineCore_DP0 pid=12) "
EXCEPTION_LINE = re.compile(r"((?:\w{1,60}\.){0,6}\w{0,60}(?:Error|Exception|Interrupt|Exit)):")
ENGINE_FAILED = "Engine core initialization failed"
NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


def normalise(text: str) -> str:
    """Text with addresses and numbers replaced by N, whitespace collapsed, at most 160 characters."""
    return " ".join(NUMBERS.sub("N", text).split())[:160]


def failure_signature(output: str, returncode: int | None) -> str:
    """The signature of a failed run from its output and exit: a GPU fault kind, else the last
    exception type, else the signal or exit code; with the phase when a known progress marker
    preceded a GPU fault."""
    fault, exception, phase = None, None, None
    for raw in output.splitlines():
        line = ENGINE_PREFIX.sub("", raw[:PREFIX_CHARS], count=1)
        if fault is None:
            for marker, label in PHASES:
                if marker in line:
                    phase = label
            for marker, kind in FAULT_KINDS:
                if marker in line:
                    fault = kind
                    break
        match = EXCEPTION_LINE.match(line.strip())
        if match and ENGINE_FAILED not in line:  # the frontend's echo hides the engine's real cause
            exception = match.group(1)
    if fault:
        return f"{fault} {phase}" if phase else fault
    if exception:
        return exception
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exit {returncode}"


@dataclass
class SignatureRule:
    """Which bad runs count as the fault hunted: any, one matching a regex, or (auto) the first seen's."""

    mode: str = "any"               # any | auto | regex
    pattern: str | None = None      # the regex, for mode regex
    learned: str | None = field(default=None)

    @classmethod
    def parse(cls, text: str) -> "SignatureRule":
        """From --signature: 'any', 'auto', or a regular expression (ValueError when it is not one)."""
        if text in ("any", "auto"):
            return cls(text)
        try:
            re.compile(text)
        except re.error as exc:
            raise ValueError(f"--signature {text!r} is not a regular expression: {exc}") from None
        return cls("regex", text)

    def learn(self, signature: str) -> None:
        """auto: the first bad run's signature becomes the run's."""
        if self.mode == "auto" and self.learned is None:
            self.learned = signature

    def accepts(self, signature: str) -> bool:
        if self.mode == "regex" and self.pattern is not None:
            return re.search(self.pattern, signature) is not None
        return self.mode == "any" or self.learned is None or signature == self.learned

    def record(self) -> SignatureRecord:
        return SignatureRecord(mode=self.mode, pattern=self.pattern, signature=self.learned)
