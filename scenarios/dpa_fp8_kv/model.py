"""The scenario's model dir: content-addressed under the tool's cache root, written once, shared.

A stable path matters: vLLM's compile cache is keyed by the model path among other things, so a fresh
temporary dir per step would compile from scratch every time. The dir is named by the hash of what is in
it (config.json, and for seeded weights their seed, scale and generator format), so a changed config
gets another dir and nothing is ever rewritten in place.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from bisector.machine.compile_cache import publish
from scenarios.dpa_fp8_kv import weights
from scenarios.dpa_fp8_kv.config import deepseek_v3_config
from scenarios.dpa_fp8_kv.options import Options

WEIGHTS_SEED = 0
WEIGHTS_SCALE = 0.05  # the scale at which the issue measured attention moving the logits on the H200
GENERATE_TIMEOUT = 600.0


class ModelError(RuntimeError):
    """The model dir could not be written or does not hold what its name promises."""


@dataclass(frozen=True)
class Model:
    path: Path
    load_format: str  # "dummy" (config only) or "safetensors"
    written: bool  # this step wrote it
    weights: dict | None  # weights.json: seed, scale, tensors, parameters, sha256

    def as_details(self) -> dict:
        return {"dir": str(self.path), "load_format": self.load_format, "written_by_this_step": self.written,
                **({"weights": self.weights} if self.weights else {})}


def config_text(options: Options) -> str:
    return json.dumps(deepseek_v3_config(options), indent=2) + "\n"


def model_key(options: Options, seeded: bool) -> str:
    """16 hex of sha256 over config.json and, for seeded weights, their recipe."""
    recipe = {"config": hashlib.sha256(config_text(options).encode()).hexdigest(),
              "weights": {"seed": WEIGHTS_SEED, "scale": WEIGHTS_SCALE, "format": weights.FORMAT} if seeded else None}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def prepare_model(root: Path, options: Options, seeded: bool, python: str,
                  env: Mapping[str, str] | None = None) -> Model:
    """The model dir for options under root/models: config.json only (vLLM's dummy weights), or with
    seeded weights generated once in python. ModelError when generating or checking them fails."""
    text = config_text(options)

    def fill(tmp: Path) -> None:
        (tmp / "config.json").write_text(text)
        if seeded:
            _generate(tmp, python, env)

    try:
        path, written = publish(root, model_key(options, seeded), fill)
    except OSError as exc:
        raise ModelError(f"cannot write the model dir under {root / 'models'}: {exc}") from None
    if (path / "config.json").read_text() != text:
        raise ModelError(f"{path}/config.json is not the config its name stands for: remove {path}")
    if not seeded:
        return Model(path, "dummy", written, None)
    manifest = _checked_manifest(path)
    return Model(path, "safetensors", written, manifest)


def _generate(model_dir: Path, python: str, env: Mapping[str, str] | None) -> None:
    script = Path(shutil.copy(weights.__file__, model_dir / ".weights.py"))
    try:
        done = subprocess.run([python, str(script), "--model-dir", str(model_dir), "--seed", str(WEIGHTS_SEED),
                               "--scale", str(WEIGHTS_SCALE)], capture_output=True, text=True,
                              timeout=GENERATE_TIMEOUT, env=None if env is None else dict(env), cwd=model_dir)
    except OSError as exc:
        raise ModelError(f"cannot start {python} to write the seeded weights: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise ModelError(f"writing the seeded weights took over {GENERATE_TIMEOUT:.0f}s") from None
    finally:
        script.unlink(missing_ok=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"writing the seeded weights failed in {python}: {last}")


def _checked_manifest(model_dir: Path) -> dict:
    """weights.json, after checking that model.safetensors still has the sha256 it records."""
    try:
        manifest = json.loads((model_dir / "weights.json").read_text())
        digest = hashlib.sha256()
        with open(model_dir / "model.safetensors", "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except (OSError, ValueError) as exc:
        raise ModelError(f"{model_dir}: seeded weights unreadable ({exc}): remove the dir") from None
    if digest.hexdigest() != manifest.get("sha256"):
        raise ModelError(f"{model_dir}/model.safetensors does not match the sha256 in weights.json: remove the dir")
    return manifest
