"""Test helper: a directory of fake images served by tests/fakes/docker, and a `getent` that knows the host's
render group, both first on PATH (see FakeDocker.env)."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

FAKES = Path(__file__).resolve().parent  # tests/fakes: the fake docker beside this module
RENDER_GID = "109"
RENDER_DEVICES = "--device /dev/dri/renderD128 --device /dev/dri/renderD136"


def image_key(ref: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", ref)


class FakeDocker:
    """Fake images under root/docker-home; `env` puts the fake docker (and getent) first on PATH."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.home = self.root / "docker-home"
        self.bin = self.root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        shutil.copy2(FAKES / "docker", self.bin / "docker")
        (self.bin / "getent").write_text(f'#!/bin/sh\n[ "$2" = render ] && echo "render:x:{RENDER_GID}:" && '
                                         f'exit 0\nexit 2\n')
        (self.bin / "getent").chmod(0o755)
        for kind in ("registry", "local", "sites"):
            (self.home / kind).mkdir(parents=True, exist_ok=True)
        self.env = {"PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "FAKE_DOCKER_HOME": str(self.home),
                    "BISECTOR_RENDER_DEVICES": RENDER_DEVICES}

    def activate(self, monkeypatch) -> None:
        """This process's environment made `env` (for in-process tests)."""
        for name, value in self.env.items():
            monkeypatch.setenv(name, value)

    def add_image(self, ref: str, site: dict[str, str], labels: dict | None = None, env: dict | None = None,
                  local: bool = False, layer_sizes: tuple[int, ...] = (4_000_000, 1_500_000, 500_000),
                  salt: str = "") -> str:
        """An image the registry has (and, with local, this machine too); site: its Python files. Returns
        its digest."""
        site_dir = self.home / "sites" / (image_key(ref) + salt)
        shutil.rmtree(site_dir, ignore_errors=True)
        for name, text in site.items():
            (site_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (site_dir / name).write_text(text)
        digest = "sha256:" + hashlib.sha256((ref + salt + json.dumps(site, sort_keys=True)).encode()).hexdigest()
        layers = [["sha256:" + hashlib.sha256(f"{digest}{n}".encode()).hexdigest(), size]
                  for n, size in enumerate(layer_sizes)]
        image = {"ref": ref, "digest": digest, "layers": layers, "labels": labels or {}, "env": env or {},
                 "site": str(site_dir)}
        (self.home / "registry" / f"{image_key(ref)}.json").write_text(json.dumps(image))
        if local:
            self.make_local(ref)
        return digest

    def make_local(self, ref: str) -> None:
        """As if someone (not bisector) pulled ref on this machine."""
        image = json.loads((self.home / "registry" / f"{image_key(ref)}.json").read_text())
        size = sum(size for _, size in image["layers"])
        repository = ref.rsplit(":", 1)[0]
        entry = {"Id": "sha256:" + image["digest"].split(":")[1][::-1], "RepoTags": [ref],
                 "RepoDigests": [f"{repository}@{image['digest']}"], "Size": size * 2,
                 "Config": {"Labels": image["labels"], "Env": []}, "_site": image["site"], "_env": image["env"]}
        (self.home / "local" / f"{image_key(ref)}.json").write_text(json.dumps(entry))

    def is_local(self, ref: str) -> bool:
        return (self.home / "local" / f"{image_key(ref)}.json").is_file()

    def remove_from_registry(self, ref: str) -> None:
        (self.home / "registry" / f"{image_key(ref)}.json").unlink()

    def calls(self) -> list[list[str]]:
        path = self.home / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def runs(self) -> list[list[str]]:
        """The `run` argvs, in order (the image check's runs included)."""
        return [call[1:] for call in self.calls() if call[:1] == ["run"]]

    def clear_calls(self) -> None:
        (self.home / "calls.jsonl").unlink(missing_ok=True)


def vllm_site(version: str, broken: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    """An image's Python packages: vLLM at version (its metadata and a module saying whether it is broken)."""
    return {"vllm/__init__.py": f"__version__ = {version!r}\nBROKEN = {broken}\n",
            f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
            **(extra or {})}
