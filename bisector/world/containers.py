"""--image: a run's steps in container images (bisector.world.world opens them when --image is given).

A commit's own image is pulled when not here (a pull that stalls is given up), proven to hold the commit, and
run with vLLM's AMD container flags for the slot's GPUs. In a level inside AITER the held vLLM commit's image
is used, with each step's AITER commit built and installed over it: an image of the tool's own, made once per
AITER commit + image digest + arch and pruned with the images the tool pulled.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import threading
from pathlib import Path
from typing import Iterator, Mapping

from bisector.machine import cachedir
from bisector.machine.probe_env import SCRIPT as PROBE_SCRIPT
from bisector.process import Limits, run_process
from bisector.record.steps import PhaseClock
from bisector.world.aiter import IMAGE_SCRIPT, AiterImageBuild, AiterInstalls, AiterUnavailable
from bisector.world.images import (
    IMAGE_PROBE,
    IMAGE_PYTHON,
    LAYER_REPOSITORY,
    OWNER_LABEL,
    STALL_VARIABLE,
    Container,
    ImageError,
    ImageIndex,
    ImageInfo,
    ImageSettings,
    Proof,
    agent_render_devices,
    amd_gpu_flags,
    container_name,
    inside_gpu_env,
    prove,
    pull_quiet_seconds,
    render_gid,
    slot_render_devices,
    topology_render_devices,
    user_flags,
    write_pull_layers,
)
from bisector.world.place import Place, StepAt

RUNTIME_FAILED = 125  # `docker run` exits 125 (the runtime), 126/127 (the entrypoint): no answer about the build


class ImageSteps:
    """The steps of one run in container images: a commit's own (`image`), or AITER layered over the held
    commit's (`layered`)."""

    def __init__(self, index: ImageIndex, settings: ImageSettings, state_dir: Path, aiter: AiterInstalls | None,
                 repo_root: Path):
        self.index, self.settings, self.state_dir, self.aiter, self.repo_root = \
            index, settings, state_dir, aiter, repo_root

    @contextlib.contextmanager
    def image(self, step: StepAt) -> Iterator[Place]:
        """The commit's own image (pulled, proven) as a container for the step, or why not (no image: skipped,
        or built here with --image-fallback build)."""
        sha, logs, slot_env = step.sha, step.logs, step.slot_env
        info = self.index.info(sha)
        if not info.present:
            if self.settings.fallback == "build":
                yield Place(True, summary=f"no image {info.ref}: built here",
                            details={"image": {"ref": info.ref, "present": False, "fallback": "build"}})
            else:
                yield Place(False, self.index.missing_reason(sha), details={"image": {"ref": info.ref,
                                                                                       "present": False}})
            return
        clock = PhaseClock()
        with self.index.using(info.ref):
            with clock.part("image_pull"):
                local, failure = self._pull(sha, info, logs, step.cancel)
            if local is None:
                yield dataclasses.replace(failure, phases=clock.parts)
                return
            with clock.part("image_proof"):
                proof, log = self._prove(sha, local, logs, step.cancel)
            record = {"ref": local.ref, "digest": local.digest, "id": local.image_id, **dict(proof.found)}
            record.pop("checkouts", None)
            if not proof.ok:
                yield Place(False, proof.reason, log, details={"image": record}, phases=clock.parts)
                return
            try:
                flags = self._flags(slot_env)
            except ValueError as exc:
                yield Place(False, str(exc), details={"image": record})
                return
            home = self.state_dir / "container-home"
            home.mkdir(parents=True, exist_ok=True)
            container = Container(self.index.runtime, local.image_id or local.ref, tuple(flags),
                                  mounts=(str(logs), str(home)), read_only=(str(PROBE_SCRIPT.parent),),
                                  env={"HOME": str(home)}, network=self.settings.network)
            try:
                yield Place(True, container=container, python=IMAGE_PYTHON, slot_env=inside_gpu_env(slot_env),
                            build=False, summary=f"image {local.ref} ({proof.reason})",
                            details={"image": {**record, "proof": proof.reason}}, image_digest=local.digest,
                            phases=clock.parts)
            finally:
                container.cleanup()

    @contextlib.contextmanager
    def layered(self, step: StepAt, held: str) -> Iterator[Place]:
        """The held vLLM commit's image (pulled, proven) with the step's AITER commit built and installed in
        it: an image of the tool's own, made once per AITER commit + image digest + arch; or why not."""
        info = self.index.info(held)
        if not info.present:
            yield Place(False, f"held vLLM {held[:12]}: {self.index.missing_reason(held)}: no image to install "
                               f"AITER {step.sha[:12]} in", details={"image": {"ref": info.ref, "present": False}})
            return
        clock = PhaseClock()
        with self.index.using(info.ref):
            with clock.part("image_pull"):
                local, failure = self._pull(held, info, step.logs, step.cancel)
            if local is None:
                yield failure
                return
            with clock.part("image_proof"):
                proof, log = self._prove(held, local, step.logs, step.cancel)
            record = {"ref": local.ref, "digest": local.digest, "id": local.image_id, **dict(proof.found)}
            record.pop("checkouts", None)
            if not proof.ok:
                yield Place(False, f"held vLLM image: {proof.reason}", log, details={"image": record})
                return
            with contextlib.ExitStack() as stack:
                with clock.part("aiter_layer"):
                    layered, place = stack.enter_context(self._aiter_layer(step, local))
                if layered is None:
                    yield dataclasses.replace(place, details={"image": record, **place.details})
                    return
                try:
                    flags = self._flags(step.slot_env)
                except ValueError as exc:
                    yield Place(False, str(exc), details={"image": record, **place.details})
                    return
                home = self.state_dir / "container-home"
                home.mkdir(parents=True, exist_ok=True)
                container = Container(self.index.runtime, layered.image_id or layered.ref, tuple(flags),
                                      mounts=(str(step.logs), str(home)), read_only=(str(PROBE_SCRIPT.parent),),
                                      env={"HOME": str(home)}, network=self.settings.network)
                try:
                    yield Place(True, container=container, python=IMAGE_PYTHON, slot_env=inside_gpu_env(step.slot_env),
                                build=False, summary=f"{place.summary} over image {local.ref} ({proof.reason})",
                                log_path=place.log_path,
                                details={"image": {**record, "proof": proof.reason, "layered": layered.ref},
                                         **place.details}, image_digest=local.digest, phases=clock.parts)
                finally:
                    container.cleanup()

    @contextlib.contextmanager
    def _aiter_layer(self, step: StepAt, base: ImageInfo) -> Iterator[tuple[ImageInfo | None, Place]]:
        """The image with AITER step.sha built and installed over base, in use for the block (made when not
        here: the source checked out here, built by base's python3 in a container, committed and recorded as
        the tool's own); (None, why not) otherwise. A failed build is remembered: the next step skips at once."""
        assert self.aiter is not None
        try:
            build = self.aiter.plan_image(step.sha, str(self.repo_root), base.digest or base.image_id or base.ref)
        except AiterUnavailable as exc:
            yield None, Place(False, f"AITER {step.sha}: {exc}", details={"aiter": {"commit": step.sha}})
            return
        ref = f"{LAYER_REPOSITORY}:{build.key}"
        with self.index.using(ref):
            with cachedir.locked(self.aiter.root / ".locks" / f"image-{build.key}.lock", cachedir.EXCLUSIVE):
                found = self._find_or_build_layer(build, ref, base, step)
            yield found

    def _find_or_build_layer(self, build: AiterImageBuild, ref: str, base: ImageInfo,
                             step: StepAt) -> tuple[ImageInfo | None, Place]:
        """Under the build key's lock: the layered image ref when here, else built now (or why not)."""
        assert self.aiter is not None
        runtime, label = self.index.runtime, step.sha[:12]
        details = {"aiter": {**build.to_json(), "image": ref}}
        layered = runtime.local([ref]).get(ref)
        if layered is not None:
            if not layer_labels(build).items() <= dict(layered.labels or {}).items():
                return None, Place(False, f"image {ref} is there but not the layer bisector made of AITER "
                                          f"{build.commit[:12]} over {build.base[:19]} (its labels differ): "
                                          f"remove it to let bisector make its own", details=details)
            return layered, Place(True, summary=f"{build.describe()}, layered before", details=details)
        failed = self.aiter.image_failure(build)
        if failed:
            return None, Place(False, f"{build.describe()} failed to build in the image before: {failed['reason']}",
                               failed.get("log"), details=details)
        src, reason, log = self.aiter.image_source(build, step.logs, label)
        if src is None:
            self.aiter.remember_image(build, "failed", reason=reason, log=log)
            return None, Place(False, f"{build.describe()}: {reason}", log, details=details)
        why, log = self._build_layer(build, src, base, ref, step, label)
        layered = runtime.local([ref]).get(ref) if why is None else None
        if layered is None:
            return None, Place(False, f"{build.describe()}: {why or f'{ref} not found after its commit'}", log,
                               details=details)
        self.index.pulled(ref, layered)  # the tool's own: removed least recently used, as pulled images are
        return layered, Place(True, summary=f"{build.describe()}, built and installed", log_path=log, details=details)

    def _build_layer(self, build: AiterImageBuild, src: Path, base: ImageInfo, ref: str, step: StepAt,
                     label: str) -> tuple[str | None, str]:
        """Run IMAGE_SCRIPT in a container of base over src (read-only) and commit it as ref, labelled the tool's
        own; (None, log) when done, else (why not, log). A script that fails is remembered; a runtime that cannot
        start or commit the container, or a killed (cancelled) build, is not. The container and the source are
        removed after."""
        assert self.aiter is not None
        runtime = self.index.runtime
        log = step.logs / f"build-{label}-{build.key[:12]}-4-aiter-image.log"
        name = container_name(f"aiter-{build.key}")
        variables = [arg for key, value in self.aiter.wheel_env(build).items() for arg in ("-e", f"{key}={value}")]
        argv = [runtime.path, "run", "--name", name, "-v", f"{src}:{src}:ro", *variables, "--entrypoint", "/bin/sh",
                base.image_id or base.ref, "-c", IMAGE_SCRIPT, "bisector-aiter-image", str(src)]
        try:
            result = run_process(argv, step.logs, log, cancel=step.cancel)
            if result.returncode != 0:
                last = ([line for line in result.output.splitlines() if line.strip()] or ["no output"])[-1]
                why = f"the build in image {base.ref} exited {result.returncode} ({last.strip()[:200]}; log {log})"
                if result.returncode is not None and 0 < result.returncode < RUNTIME_FAILED:  # the script's own
                    self.aiter.remember_image(build, "failed", reason=why, log=str(log))
                return why, str(log)
            problem = runtime.commit(name, ref, layer_labels(build))
            if problem:
                return f"{runtime.name} commit {ref}: {problem}", str(log)
            self.aiter.remember_image(build, "ok", image=ref, log=str(log))
            return None, str(log)
        finally:
            runtime.kill(name)
            shutil.rmtree(src, ignore_errors=True)

    def _pull(self, sha: str, info: ImageInfo, logs: Path,
              cancel: threading.Event | None) -> tuple[ImageInfo | None, Place]:
        """The image here (pulled when it is not), or why not: a pull that stalls (prints nothing for
        pull_quiet_seconds) is killed and given up, as is a runtime that gives no answer."""
        runtime = self.index.runtime
        try:
            local = runtime.local([info.ref], cancel).get(info.ref)
        except ImageError as exc:
            return None, Place(False, f"cannot ask {runtime.name} for image {info.ref}: {exc}",
                               details={"image": {"ref": info.ref}})
        if local is not None:
            return local, Place(True)
        log = logs / f"pull-{sha[:12]}-{(info.digest or 'image').split(':')[-1][:12]}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        write_pull_layers(log, info)
        quiet = pull_quiet_seconds(info)
        result = run_process([runtime.path, "pull", info.ref], logs, log, Limits(quiet=quiet), cancel=cancel)
        if result.stalled:
            return None, Place(False, f"pull of {info.ref} stalled: no output for {quiet:g} s (the registry stopped "
                                      f"sending; {STALL_VARIABLE} sets how long a pull may be silent)", str(log),
                               details={"image": {"ref": info.ref, "pull_failed": True, "stalled": quiet}})
        try:
            local = runtime.local([info.ref], cancel).get(info.ref) if result.returncode == 0 else None
        except ImageError as exc:
            return None, Place(False, f"pulled {info.ref}, but {exc}", str(log), details={"image": {"ref": info.ref}})
        if local is None:
            last = ([line for line in result.output.splitlines() if line.strip()] or ["no output"])[-1]
            return None, Place(False, f"pull of {info.ref} failed: {last.strip()[:300]}", str(log),
                               details={"image": {"ref": info.ref, "pull_failed": True}})
        self.index.pulled(info.ref, ImageInfo(local.ref, True, True, local.digest, local.image_id,
                                              local.size or info.size, info.layers, local.labels))
        return local, Place(True)

    def _prove(self, sha: str, local: ImageInfo, logs: Path,
               cancel: threading.Event | None) -> tuple[Proof, str]:
        """Run the image's python once (no network, no GPU) to read what it holds; prove it is sha."""
        log = logs / f"image-{sha[:12]}-check.log"
        argv = [self.index.runtime.path, "run", "--rm", "--network", "none", "--entrypoint", IMAGE_PYTHON,
                local.image_id or local.ref, "-c", IMAGE_PROBE]
        result = run_process(argv, logs, log, timeout=300, cancel=cancel)
        found: dict = {}
        for line in reversed(result.output.strip().splitlines()):
            try:
                found = json.loads(line)
                break
            except ValueError:
                continue
        if result.returncode != 0 or not found:
            last = ([line for line in result.output.splitlines() if line.strip()] or ["no output"])[-1]
            return Proof(False, f"cannot read what image {local.ref} holds: {IMAGE_PYTHON} exited "
                                f"{result.returncode} ({last.strip()[:200]})"), str(log)
        return prove(sha, local, found), str(log)

    def _flags(self, slot_env: Mapping[str, str]) -> list[str]:
        """The step's container flags: vLLM's AMD ones for the slot's GPUs (when this machine has AMD GPUs),
        the network, and the invoking user."""
        machine = agent_render_devices()
        if machine is None:
            machine = topology_render_devices()
        flags: list[str] = []
        if machine:
            gid = render_gid()
            if gid is None:
                raise ValueError("this host has no 'render' group (getent group render): it cannot give a "
                                 "container its GPUs")
            flags += amd_gpu_flags(slot_render_devices(slot_env, machine), gid, self.settings.shm_size)
        flags += ["--network", self.settings.network, *user_flags(self.index.runtime)]
        return flags


def layer_labels(build: AiterImageBuild) -> dict[str, str]:
    """The labels of the image layering build: bisector's own, of which AITER commit over which image."""
    return {OWNER_LABEL: "bisector", "org.bisector.world.aiter.commit": build.commit, "org.bisector.base": build.base}

