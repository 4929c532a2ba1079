"""A performance hunt goes on inside AITER with --follow-pins (tests/follow_pins_world.py's built histories):
the slowdown the vLLM answer's pin bump brought is hunted among AITER's commits with the same metric."""
from __future__ import annotations

import random

import pytest
from follow_pins_world import PinnedState, shared_world

from bisector.engine.config import RunConfig
from bisector.engine.run import run_bisection
from bisector.record.results import PinChange
from bisector.repo import pins
from bisector.search.perf import Direction, PerfSettings
from scenarios.base import Outcome, StepContext, Verdict

pytest.importorskip("scipy", reason="performance hunts need scipy (the `perf` extra)")

pytestmark = pytest.mark.integration


class PinnedSpeed(PinnedState):
    """PinnedState as a throughput: 8 % slower where it would be bad, 2 % seeded noise per run."""

    name = "pinned-speed"
    seen: dict[str, int] = {}

    def run(self, ctx: StepContext) -> Outcome:
        judged = super().run(ctx)
        key = str(ctx.checkout) + judged.reason
        run = PinnedSpeed.seen[key] = PinnedSpeed.seen.get(key, 0) + 1
        noise = random.Random(f"{judged.reason}/{run}").gauss(0, 0.02)
        speed = 1000 * (0.92 if judged.verdict is Verdict.BAD else 1.0) * (1 + noise)
        return Outcome(Verdict.GOOD, f"{speed:.1f} tok/s", metrics={"tok_s": speed})

    def follow_up(self, dependency: str):
        follow = super().follow_up(dependency)
        held = follow.hold
        return type(follow)(repo=follow.repo, hold=lambda repo, commit: PinnedSpeed(held(repo, commit).options))


def test_a_slowdown_from_a_pin_bump_is_hunted_inside_aiter(tmp_path):
    world = shared_world(tmp_path)
    result = run_bisection(RunConfig(repo=world.vllm, good=world.v[0], bad=world.v[-1], state_dir=tmp_path / "state",
                                     scenario=PinnedSpeed({"aiter_repo": str(world.aiter)}), follow_pins=True,
                                     perf=PerfSettings("tok_s", Direction.HIGHER)))
    assert result.culprit.sha == world.v[3] and result.perf.change.relative < -0.04
    assert result.pin_change.continuation.endswith(  # the same hunt, by hand
        " --metric tok_s --higher-is-better --min-change 1 --warmup 0 --max-samples 20")
    [inside] = result.levels
    assert inside.culprit.sha == world.a["a5"], inside.stopped
    assert inside.perf.settings.metric == "tok_s" and inside.perf.change.relative < -0.04
    assert all(len(entry.samples) >= 3 for entry in inside.perf.commits)
    assert result.exit_code == 0


@pytest.mark.unit
def test_the_continuation_printed_for_running_the_aiter_level_by_hand_keeps_the_metric_options():
    change = PinChange(name="aiter", old="v1.0", new="v2.0")
    settings = PerfSettings("decode_tok_s", Direction.HIGHER, min_change=0.05, warmup=1, max_samples=12)
    assert pins.continuation_argv(change, ("/src/vllm", "abc123"), "/src/aiter", {"check": "perf"}, perf=settings) == [
        "bisector", "run", "--repo", "/src/aiter", "--good", "v1.0", "--bad", "v2.0", "--scenario", "aiter-mla-probe",
        "--option", "vllm_repo=/src/vllm", "--option", "vllm_ref=abc123", "--option", "check=perf",
        "--metric", "decode_tok_s", "--higher-is-better", "--min-change", "5", "--warmup", "1", "--max-samples", "12"]
    either_way = pins.continuation_argv(change, ("/src/vllm", "abc123"), "/src/aiter", perf=PerfSettings("ttft_ms"))
    assert either_way[-8:] == ["--metric", "ttft_ms", "--min-change", "1", "--warmup", "0", "--max-samples", "20"]
