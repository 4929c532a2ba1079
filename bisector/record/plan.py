"""`bisector run --plan`'s answer, typed: the commits a run would test first, the build and world each needs,
their cost; `to_json()`/`from_json()` as in bisector.record.results."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from bisector.record.results import _shas, end_json


def _minutes(stored: Sequence[int] | None) -> tuple[int, int]:
    """A planned step's (low, high) minutes as to_json wrote them; (0, 0) in a plan written before them."""
    return (int(stored[0]), int(stored[1])) if stored else (0, 0)


@dataclass(kw_only=True, frozen=True)
class PlannedCommand:
    """A build command a planned step would run."""

    label: str
    argv: tuple[str, ...]
    env: dict[str, str]


@dataclass(kw_only=True, frozen=True)
class PlannedStep:
    """A commit `bisector run --plan` would test, and the build it needs."""

    sha: str
    role: str
    native: str  # hash of the native build inputs
    build: str   # the build strategy
    reason: str
    commands: tuple[PlannedCommand, ...] = ()
    world: str = ""     # the image it runs in (and whether it exists), or the AITER it installs
    estimate: str = ""  # what the step costs, in words
    minutes: tuple[int, int] = (0, 0)  # that cost as a range of minutes (builds, pulls, installs)
    cached: str | None = None  # the verdict the record serves it (nothing runs, it costs nothing); None: tested

    @property
    def alternative(self) -> bool:
        """A step that runs only for one verdict of an earlier one (`probe 2 if ... is good`)."""
        return self.role.startswith("probe 2 if ")

    def to_json(self) -> dict:
        return {"sha": self.sha, "role": self.role, "native": self.native, "build": self.build,
                "reason": self.reason, "commands": [{"label": command.label, "argv": list(command.argv),
                                                     "env": command.env} for command in self.commands],
                "world": self.world, "estimate": self.estimate, "minutes": list(self.minutes),
                **({"cached": self.cached} if self.cached else {})}


@dataclass(kw_only=True, frozen=True)
class Plan:
    """`bisector run --plan`: the commits a run would test first and their builds; nothing run."""

    commits: int
    good: tuple[str, ...]
    bad: tuple[str, ...]
    builder: str
    merge_bases: tuple[str, ...] = ()
    probes: tuple[PlannedStep, ...] = ()
    imaged: int | None = None  # --image: how many commits of the range have an image
    skipped_by_user: int = 0   # --skip/--skip-file: how many commits of the range are never tested
    warnings: tuple[str, ...] = ()  # preconditions missing here (a GPU, a wheel, an image), each with what to do
    names: Mapping[str, str] = field(default_factory=dict)  # sha -> the tag or branch naming it (refs.names)
    slots: int = 1             # steps at once (--jobs, --gpus ID:N): the k of each probe round
    rounds: int | None = None  # probe rounds expected with those slots (None: not estimated)
    rounds_one_slot: int | None = None  # and with one
    pin_levels: tuple[str, ...] = ()  # --follow-pins: each pin change in the range and its second level's cost
    endpoint_rounds: int = 0   # rounds the endpoints take before the probes (0: not verified)
    step_seconds: float | None = None  # a step's time: the median of the scenario's earlier steps here (None: none)
    timed_steps: int = 0       # how many earlier steps that median is of
    held_build: str | None = None  # a level inside AITER run by hand: what its held vLLM commit will run with
    cached_rounds: int = 0     # probe rounds the record's verdicts answer (not counted in rounds: nothing runs)

    @property
    def seconds_to_answer(self) -> float | None:
        """The rounds (the endpoints' and the probes') times a step's time; None when either is unknown."""
        if self.rounds is None or self.step_seconds is None:
            return None
        return (self.endpoint_rounds + self.rounds) * self.step_seconds

    @property
    def minutes(self) -> tuple[int, int]:
        """The planned steps' cost in minutes (low, high): every step that surely runs, and of the second
        probes, which run for one verdict of the first, the costlier."""
        sure = [probe.minutes for probe in self.probes if not probe.alternative]
        either = [probe.minutes for probe in self.probes if probe.alternative]
        return (sum(low for low, _ in sure) + max((low for low, _ in either), default=0),
                sum(high for _, high in sure) + max((high for _, high in either), default=0))

    def to_json(self) -> dict:
        return {"commits": self.commits, "good": end_json(self.good), "bad": end_json(self.bad),
                "builder": self.builder, "merge_bases": list(self.merge_bases),
                "probes": [probe.to_json() for probe in self.probes], "imaged": self.imaged,
                "minutes": list(self.minutes), "warnings": list(self.warnings),
                **({"skipped_by_user": self.skipped_by_user} if self.skipped_by_user else {}),
                **({"slots": self.slots, "rounds": self.rounds, "rounds_one_slot": self.rounds_one_slot,
                    "endpoint_rounds": self.endpoint_rounds} if self.rounds is not None else {}),
                **({"step_seconds": self.step_seconds, "timed_steps": self.timed_steps,
                    "seconds_to_answer": self.seconds_to_answer} if self.step_seconds is not None else {}),
                **({"names": dict(self.names)} if self.names else {}),
                **({"pin_levels": list(self.pin_levels)} if self.pin_levels else {}),
                **({"held_build": self.held_build} if self.held_build else {}),
                **({"cached_rounds": self.cached_rounds} if self.cached_rounds else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> Plan:
        return cls(commits=data["commits"], good=_shas(data["good"]), bad=_shas(data["bad"]),
                   builder=data["builder"], merge_bases=tuple(data["merge_bases"]), imaged=data.get("imaged"),
                   skipped_by_user=data.get("skipped_by_user", 0), warnings=tuple(data.get("warnings", ())),
                   names=dict(data.get("names", {})), pin_levels=tuple(data.get("pin_levels", ())),
                   slots=data.get("slots", 1), rounds=data.get("rounds"), rounds_one_slot=data.get("rounds_one_slot"),
                   endpoint_rounds=data.get("endpoint_rounds", 0), step_seconds=data.get("step_seconds"),
                   timed_steps=data.get("timed_steps", 0), cached_rounds=data.get("cached_rounds", 0),
                   probes=tuple(PlannedStep(sha=p["sha"], role=p["role"], native=p["native"], build=p["build"],
                                            reason=p["reason"],
                                            commands=tuple(PlannedCommand(label=c["label"], argv=tuple(c["argv"]),
                                                                          env=c["env"]) for c in p["commands"]),
                                            world=p.get("world", ""), estimate=p.get("estimate", ""),
                                            minutes=_minutes(p.get("minutes")), cached=p.get("cached"))
                                for p in data["probes"]))
