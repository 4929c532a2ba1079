"""`bisector run --plan`: the commits a run would test first and the build each needs; nothing is run."""
from __future__ import annotations

from bisector.builds.builder import NoBuild
from bisector.engine.config import RunConfig
from bisector.engine.ranges import resolve_range
from bisector.engine.state import choose_state_dir, open_builder, prepare_state_dir
from bisector.results import Plan, PlannedCommand, PlannedStep
from bisector.search import Bisection, Term


def plan_bisection(cfg: RunConfig) -> Plan:
    """The commits a run would test first and the build each needs; runs nothing.

    Endpoints (when verified), the first round's probes, and with one job the second probe for
    either verdict of the first. Builds are decided from git objects and the artifact cache.
    """
    asked = resolve_range(cfg)
    ends, commits = asked.ends, asked.commits
    state_dir = prepare_state_dir(choose_state_dir(asked.repo, cfg.state_dir))
    # a scenario that runs the checkout as it is never builds, whatever --build says
    builder = open_builder(cfg, asked.repo, state_dir) if cfg.scenario.needs_build else NoBuild()
    probes: list[PlannedStep] = []
    planned: set[str] = set()  # native hashes the steps listed so far will have built

    def cost(sha: str) -> float:
        return 0.0 if builder.decide(sha).native in planned else builder.cost(sha)

    def add(sha: str, role: str) -> None:
        decision = builder.decide(sha)
        strategy, reason, commands = decision.strategy, decision.reason, decision.commands
        if decision.native in planned and strategy in ("source", "precompiled"):
            strategy, reason, commands = "reuse", f"native {decision.native[:12]} built by an earlier step", ()
        planned.add(decision.native)
        probes.append(PlannedStep(sha=sha, role=role, native=decision.native, build=strategy, reason=reason,
                                  commands=tuple(PlannedCommand(label=c.label, argv=c.argv, env=c.env)
                                                 for c in commands)))

    if cfg.verify_endpoints:
        for old in ends.olds:
            add(old, f"endpoint ({ends.old_name})")
        add(ends.new, f"endpoint ({ends.new_name})")
    for base in ends.merge_bases:
        add(base, "merge base")
    first = Bisection(commits, ends.new).next_probes(max(1, cfg.jobs), cost=cost)
    for sha in first:
        add(sha, "probe 1")
    if len(first) == 1:
        for term, name in ((Term.OLD, ends.old_name), (Term.NEW, ends.new_name)):
            branch = Bisection(commits, ends.new)
            branch.record(first[0], term)
            for sha in branch.next_probes(1, cost=cost):
                add(sha, f"probe 2 if {first[0][:12]} is {name}")
    return Plan(commits=len(commits), good=asked.good, bad=asked.bad, builder=builder.name,
                merge_bases=ends.merge_bases, probes=tuple(probes))
