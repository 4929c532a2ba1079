"""What the step's Python environment holds, and whether the checkout's own runtime pins accept it.

The probe (bisector.machine.probe_env) runs in the scenario's interpreter and reads package metadata only (no torch
import, so it takes well under a second); StepProbes runs it once per step. The rest is pure.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Mapping

from bisector.machine.probe_env import SCRIPT as PROBE_SCRIPT
from bisector.machine.probe_env import last_error_line, run_probe
from bisector.repo.pins import pins_in_tree
from bisector.seams import ContainerLauncher

PINNED = ("torch", "transformers")  # the runtime pins a wrong environment most often violates
PIN_FILES = {"rocm": ("requirements/common.txt", "requirements/rocm.txt"),
             "cuda": ("requirements/common.txt", "requirements/cuda.txt")}


def probe_environment(python: str, env: Mapping[str, str] | None = None, container: ContainerLauncher | None = None,
                      cwd: Path | None = None) -> dict | str:
    """{'torch', 'transformers', 'aiter', 'torch_cuda', 'torch_hip'} versions (None if absent) of python's
    environment (under env; inside container, from cwd, when given), and its 'sites' (the directories it
    reads them from), or why they could not be read."""
    launch = None
    if container is not None:
        def launch(argv: list[str]) -> list[str]:
            return container.command(argv, cwd or Path("/"), env, mounts=[PROBE_SCRIPT.parent])
    try:
        found = run_probe(python, ("torch", "transformers", "aiter", "amd-aiter"), env, launch=launch)
    except OSError as exc:
        return f"cannot start {python}: {exc.strerror}"
    except subprocess.CalledProcessError as exc:
        return f"cannot read the environment of {python}: {last_error_line(exc)}"
    except subprocess.SubprocessError as exc:
        return f"cannot run {python}: {exc}"
    except ValueError:
        return f"cannot read the environment of {python}: no output"
    versions = found["versions"]
    return {"torch": versions["torch"], "transformers": versions["transformers"],
            "aiter": versions["aiter"] or versions["amd-aiter"],
            "torch_cuda": found["torch"]["cuda"], "torch_hip": found["torch"]["hip"],
            "sites": sorted({*found["sites"], *filter(None, [found["purelib"]])})}


class StepProbes:
    """The environment probe of a step, run once: the answer machine_check got before the build serves the
    step's runs after it while python and the variables are the same (the checkout a build puts on PYTHONPATH
    aside: it holds vLLM, never a distribution probed) and no site directory changed (an install into the
    environment, as a build allowed to install into --python does, adds and removes entries there). One
    answer kept per checkout; inside a container (an image's environment) every call probes."""

    def __init__(self) -> None:
        self._held: dict[Path, tuple[tuple, tuple, dict]] = {}

    def versions(self, python: str, env: Mapping[str, str], container: ContainerLauncher | None,
                 checkout: Path) -> dict | str:
        """probe_environment's answer for the step in checkout, probed only when the held one no longer holds."""
        if container is not None:
            return probe_environment(python, env, container, checkout)
        key = _probe_key(python, env, checkout)
        held = self._held.get(checkout)
        if held is not None and held[0] == key and held[1] == _stamps(held[2]["sites"]):
            return held[2]
        found = probe_environment(python, env, None, checkout)
        if isinstance(found, dict):
            self._held[checkout] = (key, _stamps(found["sites"]), found)
        return found


def _probe_key(python: str, env: Mapping[str, str], checkout: Path) -> tuple:
    """What the probe's answer depends on besides the site directories, the checkout on PYTHONPATH left out."""
    paths = tuple(path for path in env.get("PYTHONPATH", "").split(os.pathsep) if path and Path(path) != checkout)
    return python, paths, tuple(sorted((name, value) for name, value in env.items() if name != "PYTHONPATH"))


def _stamps(sites: list[str]) -> tuple:
    """Each site directory's modification time (None: gone): what an install into it changes."""
    def stamp(site: str) -> int | None:
        try:
            return os.stat(site).st_mtime_ns
        except OSError:
            return None
    return tuple((site, stamp(site)) for site in sites)


def checkout_pins(checkout: Path, platform: str) -> dict[str, tuple[str, str]]:
    """{package: (specifier, file)} for PINNED packages in the checkout's requirements for platform."""
    pins = {}
    for rel in PIN_FILES[platform]:
        path = checkout / rel
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            requirement = line.split("#", 1)[0].split(";", 1)[0].strip()
            name = re.match(r"[A-Za-z0-9_.-]+", requirement)
            if name and name.group(0).lower() in PINNED and requirement[name.end():].strip():
                pins[name.group(0).lower()] = (requirement[name.end():].strip(), rel)
    return pins


def pin_violations(pins: dict[str, tuple[str, str]], versions: dict) -> list[str]:
    """One line per pin the environment does not satisfy (a missing package is a violation)."""
    problems = []
    for name, (specifier, rel) in sorted(pins.items()):
        have = versions.get(name)
        if have is None:
            problems.append(f"{name} {specifier} required by {rel}, not installed")
        elif not satisfies(have, specifier):
            problems.append(f"{name} {specifier} required by {rel}, environment has {have}")
    return problems


def satisfies(version: str, specifier: str) -> bool:
    """PEP 440 comparison for the clause forms vLLM's pins use (==, !=, >=, <=, >, <, ~=, X.*), on
    release numbers; a local part (+cu130) is ignored, as == does for a pin without one."""
    have = _release(version)
    for clause in filter(None, (part.strip() for part in specifier.split(","))):
        match = re.fullmatch(r"(==|!=|>=|<=|~=|>|<)\s*([0-9][0-9A-Za-z.*+!-]*)", clause)
        if not match:
            continue  # an unusual form: do not guess
        op, wanted = match.groups()
        if wanted.endswith(".*"):
            prefix = _release(wanted[:-2])
            same = have[:len(prefix)] == prefix
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        want = _release(wanted)
        width = max(len(have), len(want))
        left, right = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {"==": left == right, "!=": left != right, ">=": left >= right, "<=": left <= right,
              ">": left > right, "<": left < right,
              "~=": left >= right and have[:len(want) - 1] == want[:len(want) - 1]}[op]
        if not ok:
            return False
    return True


def _release(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split("+", 1)[0].split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        numbers.append(int(digits.group(0)))
        if digits.end() < len(part):
            break  # 0rc1, 1a2: the release ends here
    return tuple(numbers)


def aiter_switches(checkout: Path) -> dict[str, str]:
    """ROCm environment: AITER and AITER MLA on; every other VLLM_ROCM_USE_AITER_* switch that the
    checkout's vllm/envs.py defines off, except MLA ones (the bug needs no other AITER kernel, and the
    tiny model's shapes may not suit them)."""
    env = {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MLA": "1"}
    path = checkout / "vllm" / "envs.py"
    text = path.read_text(errors="replace") if path.is_file() else ""
    for name in sorted(set(re.findall(r"\"(VLLM_ROCM_USE_AITER_[A-Z0-9_]+)\"", text))):
        if "MLA" not in name:
            env[name] = "0"
    return env


def aiter_against_pin(checkout: Path, installed: str | None) -> dict:
    """The AITER the checkout pins (docker/Dockerfile.rocm_base) beside the one installed, and whether
    they differ: {} without a pin; a pin that is no version (a branch, a sha) is only reported."""
    pin = pins_in_tree(checkout).get("aiter")
    if pin is None:
        return {}
    found = {"pinned": pin.ref, "installed": installed}
    pinned_version = pin.ref.removeprefix("v")
    if installed and re.fullmatch(r"\d+(\.\d+)+(\.post\d+)?", pinned_version) \
            and installed.split("+")[0] != pinned_version:
        found["mismatch"] = f"the checkout pins AITER {pin.ref}, the environment has {installed}"
    return found
