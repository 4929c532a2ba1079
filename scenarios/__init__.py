"""Named reproduction scenarios: the built-in ones, plus any an installed package registers.

A package adds a scenario without forking bisector by declaring an entry point in the group
`bisector.scenarios` (name = scenario name, value = `module:Class`); see examples/plugin-scenario/.
Built-in scenarios are imported when asked for, so `from scenarios.base import BaseScenario` stays cheap.
"""
from __future__ import annotations

import os
from importlib.metadata import entry_points
from typing import Mapping

from bisector.errors import ScenarioError
from bisector.machine.gpus import GPU_VARIABLES, env_gpus
from bisector.registry import Registry
from bisector.seams import Scenario

ENTRY_POINT_GROUP = "bisector.scenarios"
BUILT_IN: Registry[type[Scenario]] = Registry("scenario")
BUILT_IN.register("aiter-mla-probe", "scenarios.aiter_mla_probe:AiterMLAProbe")
BUILT_IN.register("dpa-fp8-kv-graph-capture", "scenarios.dpa_fp8_kv:DpaFp8KvScenario")


def available() -> dict[str, type[Scenario]]:
    """Scenario classes by name: built-in, then installed plug-ins (a built-in name is never replaced)."""
    found: dict[str, type[Scenario]] = dict(BUILT_IN.items())
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in found:
            try:
                found[entry.name] = entry.load()
            except Exception:  # a broken plug-in does not hide the others; create() names its error
                continue
    return found


def create(name: str, options: Mapping[str, str] | None = None) -> Scenario:
    """The scenario called name, configured with options (KEY=VALUE strings); ScenarioError when it
    needs GPUs and the environment grants none."""
    found = available()
    for entry in entry_points(group=ENTRY_POINT_GROUP, name=name):
        if name not in found:
            try:
                entry.load()
            except Exception as exc:
                raise ScenarioError(f"scenario plug-in {name!r} ({entry.value}) failed to load: "
                                    f"{type(exc).__name__}: {exc}") from None
    if name not in found:
        raise ScenarioError(f"unknown scenario {name!r} (available: {', '.join(sorted(found)) or 'none'})")
    scenario = found[name](options)  # type: ignore[call-arg]  # every scenario takes its options
    if scenario.gpus_per_run:
        if env_gpus(os.environ) == []:
            given = " ".join(f"{var}={os.environ[var]!r}" for var in GPU_VARIABLES if var in os.environ)
            raise ScenarioError(f"scenario {name!r} needs {scenario.gpus_per_run} GPU(s) per step but {given} "
                                f"grants none (set but empty = no GPUs; unset = all the runner gives)")
    return scenario
