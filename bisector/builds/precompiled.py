"""`--build precompiled`: the commit's Python over compiled files from its published wheel."""
from __future__ import annotations

import html.parser
import platform
import re
import threading
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Mapping

from bisector.builds.base import (
    BUILD_IN_PLACE,
    FREE_COST,
    BuildContext,
    BuildResult,
    Command,
    Decision,
    Target,
    keep_outputs,
    run_commands,
)


class Precompiled:
    name = "precompiled"
    cost = FREE_COST

    def __init__(self, context: BuildContext):
        self.cache = context.cache
        self.wheels = WheelSource(context.settings.wheels) if context.settings.wheels else None

    def can_serve(self, target: Target) -> Decision:
        wheel = self.wheels.locate(target.sha) if self.wheels else None
        if not wheel:
            return target.refuse(f"no wheel for {target.sha[:12]}")
        return Decision(self.name, f"native {target.short} not built, wheel {Path(wheel).name}", target.native,
                        tuple(precompiled_plan(target.python, wheel, target.version_env)))

    def prepare(self, target: Target, decision: Decision, log_dir: Path) -> BuildResult:
        built = run_commands(target, decision, log_dir)
        return keep_outputs(self.cache, target, built) if built.ok else built


def precompiled_plan(python: str, wheel: str, version_env: Mapping[str, str] | None = None) -> list[Command]:
    """The commit's tree over compiled files taken from a wheel (vLLM's precompiled path), built in place
    (BUILD_IN_PLACE: nothing installed into python's environment); version_env tells the build its version
    (Target.version_env)."""
    return [Command("develop-precompiled", (python, *BUILD_IN_PLACE),
                    {"VLLM_USE_PRECOMPILED": "1", "VLLM_PRECOMPILED_WHEEL_LOCATION": wheel, **(version_env or {})})]


class WheelSource:
    """Per-commit wheels: a local directory (DIR/<sha>/*.whl or *+g<sha prefix>*.whl) or a URL
    template with {commit} naming a wheel or an index page listing wheels."""

    def __init__(self, spec: str):
        self.spec = spec
        self.is_url = "://" in spec
        if self.is_url and "{commit}" not in spec:
            raise ValueError(f"--wheels URL template needs {{commit}}: {spec}")
        if not self.is_url and not Path(spec).is_dir():
            raise ValueError(f"--wheels is neither a directory nor a URL template: {spec}")
        self.found: dict[str, str | None] = {}
        self.lock = threading.Lock()

    def locate(self, sha: str) -> str | None:
        """Location of sha's wheel (path or URL) if one is available; remembered per commit."""
        with self.lock:
            if sha not in self.found:
                self.found[sha] = self._url(sha) if self.is_url else self._local(sha)
            return self.found[sha]

    def _local(self, sha: str) -> str | None:
        base = Path(self.spec)
        wheels = sorted((base / sha).glob("*.whl"))
        for wheel in sorted(base.glob("*.whl")):
            match = re.search(r"\+g([0-9a-f]{7,40})", wheel.name)
            if match and sha.startswith(match.group(1)):
                wheels.append(wheel)
        return str(wheels[0].resolve()) if wheels else None

    def _url(self, sha: str) -> str | None:
        url = self.spec.replace("{commit}", sha)
        try:
            if url.endswith(".whl"):
                with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10):
                    return url
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = resp.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return None
        links = _wheel_links(page)
        machine = [link for link in links if platform.machine() in link]
        chosen = next(iter(machine or links), None)
        return urllib.parse.urljoin(url, chosen) if chosen else None


def _wheel_links(page: str) -> list[str]:
    links: list[str] = []

    class Parser(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            href = dict(attrs).get("href") or ""
            if tag == "a" and href.split("#")[0].endswith(".whl"):
                links.append(href.split("#")[0])

    Parser().feed(page)
    return links
