"""What every command that judges commits asks (run, backport, scenario run|calibrate, shell): SharedConfig."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bisector.builds.base import BuildConfig
from bisector.builds.builder import NoBuild
from bisector.machine.envs import EnvSettings
from bisector.process import DEFAULT_LOG_LIMIT
from bisector.seams import DEFAULT_PYTHON
from bisector.world.world import WorldSettings


@dataclass(kw_only=True)
class SharedConfig:
    """The settings run and backport share: the repository and its record, how each commit is judged
    (JudgeSpec.for_run reads them), and --follow-pins."""

    repo: Path
    state_dir: Path | None = None
    log_limit: int = DEFAULT_LOG_LIMIT  # bytes kept of each step's log (head and tail)
    no_cache: bool = False             # judge every commit again (still recording the verdicts)
    reuse_verdicts: bool = False       # serve a command's verdicts of earlier runs too (engine.driver.CacheUse)
    command_line: Sequence[str] = ()   # how the user asked for this run, stored and shown in reports
    python: str = DEFAULT_PYTHON       # the interpreter scenarios run in (and builds and environments stand on)
    builder: BuildConfig = field(default_factory=NoBuild)  # --build and its options
    timeout: float | None = None
    repeat: int = 1
    envs: EnvSettings = field(default_factory=EnvSettings)  # --env shared | per-commit
    world: WorldSettings = field(default_factory=WorldSettings)  # --image, --aiter
    follow_pins: bool = False          # when the answer moves a pin, go on bisecting inside the dependency
