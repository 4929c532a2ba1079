"""The engine, room by room (import each module itself; this package re-exports nothing):

- config:   RunConfig, what `bisector run` was asked
- state:    the state dir (where it may go, that it is writable), the run lock, the opened state and builder
- judge:    Judge, how one checked-out commit gets its verdict (build, scenario, --repeat, --signature)
- driver:   RunContext, the one loop that asks a search policy what to test next and records each step
- ranges:   the asked range validated and resolved (ends, merge bases, commits)
- planning: `bisector run --plan`, the first commits and their builds, nothing run
- run:      the orchestration: run_bisection (seeds, prefilter, follow-ups, the result), judge_one, calibrate
"""
