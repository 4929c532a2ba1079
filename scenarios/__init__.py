"""Named reproduction scenarios. `create(name, options)` builds one; `available()` lists them."""
from __future__ import annotations

import os
from typing import Mapping

from scenarios.aiter_mla_probe import AiterMLAProbe
from scenarios.base import Cancelled, Outcome, Scenario, ScenarioAbort, ScenarioError, StepContext, Verdict
from scenarios.dpa_fp8_kv import DpaFp8KvScenario

__all__ = ["Cancelled", "Outcome", "Scenario", "ScenarioAbort", "ScenarioError", "StepContext", "Verdict",
           "available", "create"]


def available() -> dict[str, type[Scenario]]:
    """Scenario classes by name."""
    classes: list[type[Scenario]] = [AiterMLAProbe, DpaFp8KvScenario]
    return {cls.name: cls for cls in classes}


def create(name: str, options: Mapping[str, str] | None = None) -> Scenario:
    """The scenario called name, configured with options (KEY=VALUE strings); ScenarioError when it
    needs GPUs and the environment grants none."""
    found = available()
    if name not in found:
        raise ScenarioError(f"unknown scenario {name!r} (available: {', '.join(sorted(found)) or 'none'})")
    scenario = found[name](options)
    if scenario.gpus_per_run:
        from bisector.executor import GPU_VARIABLES, env_gpus  # here: bisector.executor imports scenarios

        if env_gpus(os.environ) == []:
            given = " ".join(f"{var}={os.environ[var]!r}" for var in GPU_VARIABLES if var in os.environ)
            raise ScenarioError(f"scenario {name!r} needs {scenario.gpus_per_run} GPU(s) per step but {given} "
                                f"grants none (set but empty = no GPUs; unset = all the runner gives)")
    return scenario
