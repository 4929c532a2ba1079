"""Built worlds for `run --follow-pins`: a vLLM-shaped repository whose commits pin an AITER-shaped one, and a
scenario that judges either (the first level: the vLLM checkout against the AITER it pins; a level inside
AITER: the AITER checkout against the vLLM commit held), as aiter-mla-probe does, without torch.

A commit is bad when its vLLM side says `buggy` and its AITER side says `wide`. Run as a script, it runs
`bisector run --follow-pins` in-process with this scenario (the kill-and-resume test needs it in a process
of its own): `python follow_pins_world.py VLLM AITER STATE GOOD BAD`; killed_when_blocked kills such a run (or any
run whose held steps block the same way) inside its second level. stand_in_aiter: an AITER package that builds and
installs for real, for the GPU scenario's worlds.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bisector.repo.pins import pins_in_tree  # noqa: E402
from bisector.seams import FollowUp  # noqa: E402
from scenarios.base import BaseScenario, Outcome, StepContext, Verdict  # noqa: E402

IDENTITY = {"GIT_AUTHOR_NAME": "AITER Dev", "GIT_AUTHOR_EMAIL": "dev@aiter.invalid",
            "GIT_COMMITTER_NAME": "Rewriter", "GIT_COMMITTER_EMAIL": "rewrite@aiter.invalid"}
BLOCK = "FOLLOW_PINS_BLOCK"  # a folder: the third held-mode step waits there until killed
AITER_SETUP = "from setuptools import setup\nsetup(name='amd-aiter', version=open('VERSION').read().strip(), " \
              "packages=['aiter'])\n"


def git(repo: Path, *args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **IDENTITY, **(env or {})}).stdout.strip()


def _show(repo: str, ref: str, path: str) -> str:
    return git(Path(repo), "show", f"{ref}:{path}")


class PinnedState(BaseScenario):
    """vllm.txt says buggy and aiter.txt says wide: bad. The first level reads aiter.txt at the ref the
    checkout pins (docker/Dockerfile.rocm_base) in aiter_repo; a held level reads vllm.txt at vllm_ref."""

    name = "pinned-state"
    needs_build = False
    option_defaults = {"aiter_repo": "", "vllm_repo": "", "vllm_ref": ""}

    def run(self, ctx: StepContext) -> Outcome:
        checkout = Path(ctx.checkout)
        if self.options["vllm_repo"]:
            self._maybe_block(checkout)
            vllm, aiter = _show(self.options["vllm_repo"], self.options["vllm_ref"], "vllm.txt"), \
                (checkout / "aiter.txt").read_text()
        else:
            pin = pins_in_tree(checkout)["aiter"]
            vllm, aiter = (checkout / "vllm.txt").read_text(), _show(self.options["aiter_repo"], pin.ref, "aiter.txt")
        bad = "buggy" in vllm and "wide" in aiter
        return Outcome(Verdict.BAD if bad else Verdict.GOOD, f"vllm {vllm.strip()}, aiter {aiter.strip()}")

    def follow_up(self, dependency: str) -> FollowUp | None:
        return FollowUp(repo=self.options["aiter_repo"], hold=lambda repo, commit: PinnedState(
            {"vllm_repo": repo, "vllm_ref": commit}))

    block_variable = BLOCK

    def _maybe_block(self, checkout: Path) -> None:
        """With $block_variable set to a folder: count held steps there; the third one says so and waits until
        the folder holds `release` (never, for a test that kills it)."""
        folder = os.environ.get(self.block_variable)
        if not folder:
            return
        count = len(list(Path(folder).glob("held-*"))) + 1
        (Path(folder) / f"held-{count}").write_text(str(checkout))
        if count == 3:
            (Path(folder) / "blocked").write_text(str(os.getpid()))
            while not (Path(folder) / "release").exists():
                time.sleep(0.05)


def dockerfile(ref: str) -> str:
    return f'ARG BASE_IMAGE=rocm/dev-ubuntu-22.04\nARG AITER_BRANCH="{ref}"\nARG AITER_REPO="/nowhere"\n'


def commit(repo: Path, message: str, files: dict[str, str], date: str, env: dict | None = None) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--allow-empty", "-m", message,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, **(env or {})})
    return git(repo, "rev-parse", "HEAD")


def init(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    return path


@dataclass
class World:
    vllm: Path
    aiter: Path
    v: list[str]           # vLLM commits, oldest first
    a: dict[str, str]      # AITER commits by name


def date(n: int) -> str:
    return f"2026-01-{n + 1:02d}T00:00:00+00:00"


def vllm_history(path: Path, steps: list[tuple[str, str]]) -> list[str]:
    """One vLLM commit per (pinned AITER ref, vllm.txt)."""
    init(path)
    return [commit(path, f"vLLM change {n} (#{100 + n})", {"docker/Dockerfile.rocm_base": dockerfile(ref),
                                                          "vllm.txt": state + "\n"}, date(n))
            for n, (ref, state) in enumerate(steps)]


def aiter_line(repo: Path, names: list[str], wide_from: str | None, start: int, subject: str = "AITER {}",
               tags: dict[str, str] | None = None) -> dict[str, str]:
    """AITER commits named names on the current branch; aiter.txt says wide from wide_from on."""
    shas, wide = {}, False
    for n, name in enumerate(names):
        wide = wide or name == wide_from
        shas[name] = commit(repo, subject.format(name) + f" (#{n + start})", {"aiter.txt": "wide\n" if wide
                                                                              else "narrow\n"}, date(start + n))
        for tag, at in (tags or {}).items():
            if at == name:
                git(repo, "tag", tag)
    return shas


def shared_world(root: Path, wide_from: str = "a5", vllm_state: str = "buggy") -> World:
    """AITER a0..a8 on one history, v1.0 at a1, v2.0 at a8; vLLM c0..c5 pin v1.0 until c3 bumps to v2.0."""
    aiter = init(root / "aiter")
    a = aiter_line(aiter, [f"a{n}" for n in range(9)], wide_from, 0, tags={"v1.0": "a1", "v2.0": "a8"})
    v = vllm_history(root / "vllm", [("v1.0" if n < 3 else "v2.0", vllm_state) for n in range(6)])
    return World(root / "vllm", aiter, v, a)


def rewritten_world(root: Path) -> World:
    """ROCm/aiter's shape: o0..o3 (v1.0 at o3) on an old root; the new root repeats them (same subject,
    author and author date, another committer) as n0..n3, then n4..n9 (wide from n6), v2.0 at n9."""
    aiter = init(root / "aiter")
    git(aiter, "checkout", "-q", "--orphan", "old")
    a = aiter_line(aiter, ["o0", "o1", "o2", "o3"], None, 0, subject="AITER work {}", tags={"v1.0": "o3"})
    git(aiter, "checkout", "-q", "--orphan", "main")
    git(aiter, "rm", "-rfq", ".")
    for n, name in enumerate(["o0", "o1", "o2", "o3"]):
        a[f"n{n}"] = commit(aiter, f"AITER work {name} (#{n})", {"aiter.txt": "narrow\n"}, date(n),
                            env={"GIT_COMMITTER_DATE": date(20)})
    a.update(aiter_line(aiter, [f"n{n}" for n in range(4, 10)], "n6", 4, tags={"v2.0": "n9"}))
    v = vllm_history(root / "vllm", [("v1.0" if n < 3 else "v2.0", "buggy") for n in range(6)])
    return World(root / "vllm", aiter, v, a)


def unrelated_world(root: Path, wide_from: str) -> World:
    """Two histories with nothing in common: o0..o3 (v1.0 at o1, v1.1 at o3), then n0..n5 (v1.2 at n1,
    v1.3 at n3, v2.0 at n5, and a release candidate v1.3-rc1 at n2 that is no release)."""
    aiter = init(root / "aiter")
    git(aiter, "checkout", "-q", "--orphan", "old")
    a = aiter_line(aiter, ["o0", "o1", "o2", "o3"], wide_from, 0, subject="old AITER {}",
                   tags={"v1.0": "o1", "v1.1": "o3"})
    git(aiter, "checkout", "-q", "--orphan", "main")
    git(aiter, "rm", "-rfq", ".")
    a.update(aiter_line(aiter, [f"n{n}" for n in range(6)], wide_from if wide_from.startswith("n") else "n0",
                        10, subject="new AITER {}", tags={"v1.2": "n1", "v1.3-rc1": "n2", "v1.3": "n3",
                                                          "v2.0": "n5"}))
    v = vllm_history(root / "vllm", [("v1.0" if n < 3 else "v2.0", "buggy") for n in range(6)])
    return World(root / "vllm", aiter, v, a)


def stand_in_aiter(repo, commits: int, flag: str, flagged_from: int) -> dict[int, str]:
    """AITER a1..a<commits> in repo (conftest's RepoBuilder): an amd-aiter package that builds into a wheel, tagged
    v0.1.12 at a1 and v0.1.13 at the last; its aiter module says flag = True from a<flagged_from> on, and COMMIT = n.
    The commits by n."""
    a = {}
    for n in range(1, commits + 1):
        files = {"aiter/__init__.py": f"{flag} = {n >= flagged_from}\nCOMMIT = {n}\n"}
        if n == 1:
            files |= {"setup.py": AITER_SETUP, "VERSION": "0.1.12\n", "requirements.txt": ""}
        if n == commits:
            files["VERSION"] = "0.1.13\n"
        a[n] = repo.commit(f"AITER a{n}", files)
        if n in (1, commits):
            repo.git("tag", "v0.1.12" if n == 1 else "v0.1.13")
    return a


def killed_when_blocked(argv: list[str], env: dict[str, str], block: Path, wait_for: Callable, seconds: float) -> None:
    """Run argv in a session of its own until its third held step says `blocked` in block (the second level's
    step waits there), then kill its whole process group; fails when it never gets there."""
    killed = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert wait_for(lambda: (block / "blocked").exists() or killed.poll() is not None, seconds), \
        "the second level never reached its third step"
    assert killed.poll() is None, killed.communicate()
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()


def main(vllm: str, aiter: str, state: str, good: str, bad: str) -> None:
    from bisector.engine.config import RunConfig
    from bisector.engine.run import run_bisection

    result = run_bisection(RunConfig(repo=Path(vllm), good=good, bad=bad, state_dir=Path(state),
                                     scenario=PinnedState({"aiter_repo": aiter}), follow_pins=True))
    print(json.dumps(result.to_json(published=True)))
    sys.exit(result.exit_code)


if __name__ == "__main__":
    main(*sys.argv[1:])
