"""Named reproduction scenarios. `create(name, options)` builds one; `available()` lists them."""
from __future__ import annotations

from typing import Mapping

from bisector.process import Cancelled
from scenarios.aiter_mla_probe import AiterMLAProbe
from scenarios.base import Outcome, Scenario, ScenarioAbort, ScenarioError, StepContext, Verdict
from scenarios.dpa_fp8_kv import DpaFp8KvScenario

__all__ = ["Cancelled", "Outcome", "Scenario", "ScenarioAbort", "ScenarioError", "StepContext", "Verdict",
           "available", "create"]


def available() -> dict[str, type[Scenario]]:
    """Scenario classes by name."""
    classes: list[type[Scenario]] = [AiterMLAProbe, DpaFp8KvScenario]
    return {cls.name: cls for cls in classes}


def create(name: str, options: Mapping[str, str] | None = None) -> Scenario:
    """The scenario called name, configured with options (KEY=VALUE strings)."""
    found = available()
    if name not in found:
        raise ScenarioError(f"unknown scenario {name!r} (available: {', '.join(sorted(found)) or 'none'})")
    return found[name](options)
