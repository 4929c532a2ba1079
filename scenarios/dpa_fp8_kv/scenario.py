"""The dpa-fp8-kv-graph-capture scenario: check for a GPU, write the model, run the ranks, judge."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple, cast

from bisector.builds.native import installed_rocm_version
from bisector.errors import ScenarioError, UsageError
from bisector.machine.compile_cache import (
    SIZE_ENV,
    Start,
    cache_root,
    claim_root,
    compile_env,
    first_start,
    in_use,
    size_cap,
    touch,
)
from bisector.machine.gpus import GPU_VARIABLES, gpu_share
from bisector.machine.probe_env import python_environment
from bisector.process import ProcessResult
from bisector.repo.pins import pins_in_tree
from bisector.seams import FollowUp, Scenario
from bisector.signatures import failure_signature
from scenarios.aiter_mla_probe.sources import SourceUnavailable, held_vllm
from scenarios.base import BaseScenario, Outcome, StepContext, Verdict
from scenarios.dpa_fp8_kv import child, numerics, perf
from scenarios.dpa_fp8_kv.classify import classify, combine, compile_details, details, matched_lines, skip_cause
from scenarios.dpa_fp8_kv.environment import (
    StepProbes,
    aiter_against_pin,
    aiter_switches,
    checkout_pins,
    pin_violations,
)
from scenarios.dpa_fp8_kv.gpu import GpuProbe, probe_nvidia_gpus, probe_rocm_gpus
from scenarios.dpa_fp8_kv.launch import run_ranks
from scenarios.dpa_fp8_kv.model import ModelError, prepare_model
from scenarios.dpa_fp8_kv.options import OPTION_DEFAULTS, Options, parse_options, warm_key
from scenarios.dpa_fp8_kv.plan import CUDA_ENV, Launch, build_plan, step_devices

HELD_OPTIONS = ("vllm_repo", "vllm_ref")  # what a level inside AITER sets (follow_up): vLLM held at one commit


class _Fit(NamedTuple):
    """What a step of this scenario runs on: its environment's variables and versions, platform, GPUs."""

    env: dict
    versions: dict
    platform: str
    probe: GpuProbe
    devices: list[str]


class DpaFp8KvScenario(BaseScenario):
    """vLLM on a tiny DeepSeek-V3 with an MLA backend, FP8 KV cache and full decode CUDA graphs.

    Default: one GPU, 128 heads per rank (the data-parallel-attention layout). tp=8 spreads the
    128 heads to 16 per rank, the control that hides the bug; dp=N runs N real data-parallel ranks.
    On ROCm the backend is AITER MLA; on CUDA a CUDA MLA backend (TRITON_MLA unless asked otherwise).
    """

    name = "dpa-fp8-kv-graph-capture"
    description = ("tiny DeepSeek-V3 on an MLA backend (ROCm: AITER MLA) with FP8 KV cache and full "
                   "decode graphs; GPU memory fault (ROCm: or SIGABRT) is bad; with check=numerics also a "
                   "decode that disagrees with a reference run")
    option_defaults = OPTION_DEFAULTS
    default_signature = "auto"  # a long bisection meets other crashes: blame only the bad end's fault
    # what a step's JSON records of its environment (--env per-commit)
    env_versions = ("torch", "pytorch-triton-rocm", "triton", "amd-aiter", "transformers", "numba")
    system_root = Path("/")  # where /dev/kfd and /sys are looked up; tests point it at a fake tree
    runs_in_images = True
    aiter_sensitive = True

    def __init__(self, options=None):
        super().__init__(options)
        self.settings = parse_options(self.options)
        if bool(self.options["vllm_repo"]) != bool(self.options["vllm_ref"]):
            raise ScenarioError("options vllm_repo and vllm_ref go together: they hold vLLM at one commit "
                                "while the repository bisected is AITER")
        if self.options["vllm_ref"].startswith("-"):
            raise ScenarioError(f"option vllm_ref={self.options['vllm_ref']!r}: a ref cannot start with '-'")
        self.probes = StepProbes()  # machine_check's probe serves the step's runs

    @property
    def gpus_per_run(self) -> int:
        return self.settings.gpus

    @property
    def times_alone(self) -> bool:
        """check=perf (one engine process: dp=1) holds a timing gate on a shared GPU (seams.TimesAlone)."""
        return self.settings.check == "perf"

    def environment(self, python: str) -> dict:
        """Python, torch, AITER and Triton in the --python environment, the installed ROCm and the GPUs a step
        sees (a verdict recorded with no device is never served to a step that has one, nor the reverse)."""
        return {**python_environment(python, ("torch", "amd-aiter", "aiter", "triton")),
                "rocm": installed_rocm_version(), "gpus": self.visible_gpus()}

    def visible_gpus(self) -> dict:
        """Per platform this scenario may run on, the GPUs found (their kinds; none: why), and the variables
        that narrow a step to some of them."""
        platforms = ("rocm", "cuda") if self.settings.platform == "auto" else (self.settings.platform,)
        found = {}
        for platform in platforms:
            probe = (probe_rocm_gpus if platform == "rocm" else probe_nvidia_gpus)(self.system_root)
            found[platform] = {"count": len(probe.targets), "kinds": sorted(set(probe.targets)),
                               **({"none": probe.problem} if probe.problem else {})}
        narrowed = {name: os.environ[name] for name in GPU_VARIABLES if name in os.environ}
        return {**found, "visible_devices": narrowed}

    def machine_check(self, ctx: StepContext) -> str | None:
        """Before the build: a usable GPU, a torch of its platform's flavour meeting the checkout's pins, the
        GPUs this step needs (what `run` checks first, so nothing is built for a step that would skip)."""
        held = self._held(ctx)
        if isinstance(held, str):
            return held
        fit = self._fit(held)
        return fit if isinstance(fit, str) else None

    def _fit(self, ctx: StepContext) -> _Fit | str:
        """What the step runs on, or why this machine cannot run it."""
        container = ctx.container  # --image: every process runs inside the commit's image
        env = dict(ctx.env) if container else {**os.environ, **ctx.env}
        versions = self.probes.versions(ctx.python, env, container, ctx.checkout)
        if isinstance(versions, str):
            return versions
        platform, probe = self.resolve_platform(versions)
        if probe.problem:
            return probe.problem
        problems = pin_violations(checkout_pins(ctx.checkout, platform), versions)
        if problems:
            return "environment does not meet the checkout's pins: " + "; ".join(problems)
        try:
            devices = step_devices(env, len(probe.targets))
        except ValueError as exc:
            return str(exc)
        if len(devices) < self.gpus_per_run:
            return f"needs {self.gpus_per_run} GPUs (dp={self.settings.dp} x tp={self.settings.tp}), " \
                   f"this step has {len(devices)}"
        if container and self.settings.dp > 1 and container.network == "none":
            return f"dp={self.settings.dp} runs one container per rank and the ranks talk over TCP: " \
                   f"give --container-network host"
        return _Fit(env, versions, platform, probe, devices)

    def run(self, ctx: StepContext) -> Outcome:
        began = time.time()
        held = self._held(ctx)
        if isinstance(held, str):
            return self._unrun(ctx, held, "machine")
        ctx = held
        fit = self._fit(ctx)
        if isinstance(fit, str):
            return self._unrun(ctx, fit, "machine")
        fitted = time.time()
        container = ctx.container
        env, versions, platform, probe, devices = fit
        platform_env = aiter_switches(ctx.checkout) if platform == "rocm" else CUDA_ENV
        backend = self.settings.backend_for(platform)
        root = cache_root(env)
        try:
            cap = size_cap(env)
        except ValueError as exc:
            return self._unrun(ctx, f"${SIZE_ENV}: {exc}", "machine")
        try:
            claim_root(root)  # a folder of the user's is never the tool's to trim
        except UsageError as exc:
            return self._unrun(ctx, str(exc), "machine")
        try:
            share = gpu_share(env)  # a slot sharing its GPUs (--gpus 0:4) bounds its engines' memory
        except ValueError as exc:
            return self._unrun(ctx, str(exc), "machine")
        settings = self.settings.within_share(share)
        compared = settings.check == "numerics"
        reference, reference_name = settings.reference_for(platform)
        if compared and replace(reference, attention_backend=reference.backend_for(platform)) == \
                replace(settings, attention_backend=backend):
            return self._unrun(ctx, f"option reference={settings.reference}: that is the run under test")
        with tempfile.TemporaryDirectory(prefix="bisector-dpa-fp8-kv-") as tmp, in_use(root, cap):
            work = Path(tmp)
            try:
                model = prepare_model(root, settings, compared, ctx.python, env)
            except ModelError as exc:
                return self._unrun(ctx, str(exc), "machine")
            caches = compile_env(root) if settings.compile_cache else \
                {**compile_env(work / "private-cache"), "VLLM_DISABLE_COMPILE_CACHE": "1"}
            # A private copy, so the child's sys.path[0] holds nothing but itself.
            child_script = Path(shutil.copy(child.__file__, work / "child.py"))
            # in an image, vLLM is the image's own build: the checkout is not put on PYTHONPATH

            def plan(options: Options, first_rank: int = 0) -> list[Launch]:
                return build_plan(options, platform=platform, platform_env={**platform_env, **caches},
                                  python=ctx.python, child_script=child_script, model_dir=model.path,
                                  checkout=None if container else ctx.checkout, devices=devices, base_env=env,
                                  master_port=_free_port(), timeout=ctx.timeout, load_format=model.load_format,
                                  first_rank=first_rank)

            launches = plan(settings)
            # check=numerics: the reference engine runs beside the one under test, on the same GPUs.
            references = plan(reference, first_rank=len(launches)) if compared else []
            mounts = [work, model.path, root] if container else []
            try:  # the node's first engine of these settings starts alone and fills the compile cache
                with first_start(root, warm_key(self.settings, platform, ctx.python)) if settings.compile_cache \
                        else contextlib.nullcontext(Start(lambda: None)) as start:
                    gated = [dataclasses.replace(launch, argv=[*launch.argv, "--start-gate", str(start.gate)])
                             for launch in launches + references] if start.gate else launches + references
                    if share < 1 and self.times_alone:  # its engine start and measurements alone on the GPU
                        gated = [dataclasses.replace(launch, argv=[*launch.argv, "--timing-gate",
                                                                   str(timing_gate(root, devices))])
                                 for launch in gated]
                    started = [dataclasses.replace(launch, argv=container.command(launch.argv, ctx.checkout,
                                                                                  launch.env, mounts=mounts),
                                                   env=dict(os.environ))
                               for launch in gated] if container else gated
                    launched = time.time()
                    results = run_ranks(started, ctx.checkout, work, ctx.cancel, start.up)
                    ended = time.time()
            except OSError as exc:
                return self._unrun(ctx, f"cannot start {ctx.python}: {exc.strerror}", "machine")
            if settings.compile_cache:
                touch(root, "\n".join(result.output for result in results))
        tested, reference_results = results[:len(launches)], results[len(launches):]
        judged = [classify(result, (platform,), (backend,)) for result in tested]
        verdict, reason = combine(tested, judged)
        ranks = [{"rank": launch.rank, "devices": launch.env["CUDA_VISIBLE_DEVICES"],
                  "verdict": rank_verdict.value, "returncode": result.returncode,
                  "timed_out": result.timed_out}
                 for launch, result, (rank_verdict, _) in zip(launches, tested, judged)]
        timed_out = verdict is Verdict.SKIP and any(result.timed_out for result in tested)
        failed = next((result for result, (judged_verdict, _) in zip(tested, judged)
                       if judged_verdict is Verdict.BAD), None)
        signature = failure_signature(failed.output, failed.returncode) if failed else None
        found = {"platform": platform, "attention_backend": backend, "gpu_targets": list(probe.targets),
                 "heads_per_rank": settings.heads_per_rank, "torch": versions["torch"],
                 **({"gpu_share": share} if share < 1 else {}),
                 **(self._aiter_details(ctx.checkout, versions.get("aiter")) if platform == "rocm" else {}),
                 "seconds": round(tested[0].seconds, 1), "ranks": ranks,
                 **details(tested[0].output, (backend,)), "check": settings.check, "model": model.as_details(),
                 "compile": {"cache": str(root / "compile") if settings.compile_cache else "off",
                             **compile_details(tested[0].output)}}
        phases = {"probe": fitted - began, "prepare": launched - fitted,
                  **child_phases(tested[0].output, launched, ended)}
        log = _merged_log(launches + references, results)
        if compared and verdict is Verdict.GOOD:
            verdict, reason, extra, lines = _numerics_verdict(settings, backend, reference, reference_name,
                                                              platform, reference_results[0], tested[0])
            found.update(extra)
            signature = numerics.SIGNATURE if verdict is Verdict.BAD else None
            log += "\n" + "\n".join(lines) + "\n"
        elif compared:
            found["reference"] = {"name": reference_name, "not_compared": "the run under test did not finish"}
        measured: dict[str, float] = {}
        if settings.check == "perf" and verdict is Verdict.GOOD:  # a good run's measurements (docs/perf.md)
            measured, extra = perf.metrics(tested[0].output)
            found.update(extra)
            if not measured:
                verdict, reason = Verdict.SKIP, "perf: the engine printed no measurement"
        _write_log(ctx.log_path, log)
        cause = skip_cause(judged) if verdict is Verdict.SKIP else None
        return Outcome(verdict, reason, str(ctx.log_path), found, cause, metrics=measured, timed_out=timed_out,
                       phases=phases, signature=signature)

    def calibrated_options(self, good_details: list[dict]) -> dict[str, str]:
        """check=numerics: the bounds the good end's clean pairs call for (`scenario calibrate`)."""
        if self.settings.check != "numerics":
            return {}
        return numerics.calibrated_bounds([details["numerics"] for details in good_details
                                           if "numerics" in details])

    def follow_up(self, dependency: str) -> FollowUp | None:
        """Inside AITER this scenario runs the held vLLM commit (vllm_repo/vllm_ref) with the same options
        against each AITER commit, which the level's world installs per commit (WorldSettings.for_level). The
        continuation printed for running by hand is that level: this scenario, these options, the level's world
        options (bisector.engine.follow.level_argv)."""
        if dependency != "aiter":
            return None
        kept = {key: value for key, value in self.options.items() if key not in HELD_OPTIONS}
        return FollowUp(hold=lambda repo, commit: cast(
            Scenario, DpaFp8KvScenario({**kept, "vllm_repo": repo, "vllm_ref": commit})))

    def _aiter_details(self, checkout: Path, installed: str | None) -> dict:
        """The AITER installed beside the checkout's pin; in a level inside AITER (the world's "aiter" says
        which commit it installed) the held vLLM commit's pin beside it, which differs by design."""
        if not self.options["vllm_ref"]:
            return {"aiter": aiter_against_pin(checkout, installed)}
        pin = pins_in_tree(checkout).get("aiter")
        return {"held_vllm": {"repo": self.options["vllm_repo"], "ref": self.options["vllm_ref"],
                              "pins_aiter": pin.ref if pin else None, "aiter_installed": installed}}

    def _held(self, ctx: StepContext) -> StepContext | str:
        """The step as it runs: in a level inside AITER (vllm_ref given) the checkout is the AITER commit (the
        world installed it), and vLLM is the held commit's tree with its build when the world hands one over
        (ctx.held_tree), else its sources; else ctx itself. A string: why not."""
        if not self.options["vllm_ref"]:
            return ctx
        if ctx.held_tree is not None:
            return dataclasses.replace(ctx, checkout=ctx.held_tree)
        try:
            tree = held_vllm(self.options["vllm_repo"], self.options["vllm_ref"])
        except SourceUnavailable as exc:
            return f"held vLLM: {exc}"
        return dataclasses.replace(ctx, checkout=tree)

    def classify_log(self, output: str, returncode: int | None) -> Outcome:
        """The verdict this scenario gives a saved child output (returncode -N: killed by signal N).

        platform=auto judges by both platforms' signatures and backends, as the log's origin is unknown.
        """
        platforms = ("rocm", "cuda") if self.settings.platform == "auto" else (self.settings.platform,)
        backends = tuple(dict.fromkeys(self.settings.backend_for(platform) for platform in platforms))
        result = ProcessResult(returncode, False, 0.0, output)
        verdict, reason = classify(result, platforms, backends)
        signature = failure_signature(output, returncode) if verdict is Verdict.BAD else None
        return Outcome(verdict, reason, None, {"platforms": list(platforms), "attention_backends": list(backends),
                                               "matched": matched_lines(output, platforms, backends),
                                               **details(output, backends)}, signature=signature)

    def resolve_platform(self, versions: dict) -> tuple[str, GpuProbe]:
        """The platform to run on and its GPUs; the probe's problem says why none is usable.

        auto: ROCm when /dev/kfd is there and torch is a ROCm build, CUDA when torch is a CUDA build and
        the NVIDIA driver lists a GPU.
        """
        wanted = self.settings.platform
        candidates = ("rocm", "cuda") if wanted == "auto" else (wanted,)
        problems = []
        for platform in candidates:
            runtime = versions.get("torch_hip" if platform == "rocm" else "torch_cuda")
            probe = (probe_rocm_gpus if platform == "rocm" else probe_nvidia_gpus)(self.system_root)
            if probe.problem:
                problems.append(f"{platform}: {probe.problem}")
            elif not runtime:
                problems.append(f"{platform}: torch {versions.get('torch')} here is no "
                                f"{'ROCm' if platform == 'rocm' else 'CUDA'} build")
            else:
                return platform, probe
        if not (versions.get("torch_hip") or versions.get("torch_cuda") or any("torch" in p for p in problems)):
            torch = versions.get("torch")  # a CPU torch: said too, so one line names all that is missing
            problems.append(f"torch {torch} here is neither a ROCm nor a CUDA build" if torch else "no torch here")
        return candidates[0], GpuProbe((), "no usable GPU (" + "; ".join(problems) + ")")

    def _unrun(self, ctx: StepContext, reason: str, cause: str | None = None) -> Outcome:
        """Skip without running anything, for cause (bisector.record.store.CAUSES; None: the commit's options); the
        log says why in one line."""
        _write_log(ctx.log_path, reason + "\n")
        return Outcome(Verdict.SKIP, reason, str(ctx.log_path), cause=cause)


def _numerics_verdict(settings, backend: str, reference, reference_name: str, platform: str,
                      reference_result: ProcessResult, tested: ProcessResult) -> tuple[Verdict, str, dict, list[str]]:
    """The verdict of check=numerics once the run under test finished: skip when the reference did
    not, else the comparison's. Also the details and the lines the log ends with."""
    reference_backend = reference.backend_for(platform)
    ref_verdict, ref_reason = classify(reference_result, (platform,), (reference_backend,))
    about = {"name": reference_name, "attention_backend": reference_backend,
             "enforce_eager": reference.enforce_eager, "kv_cache_dtype": reference.kv_cache_dtype,
             "verdict": ref_verdict.value, "compile": compile_details(reference_result.output)}
    if ref_verdict is not Verdict.GOOD:
        return Verdict.SKIP, f"reference run ({reference_name}) did not finish: {ref_reason}", \
            {"reference": about}, [f"===== numerics: not compared: the reference run: {ref_reason}"]
    mine, theirs = numerics.decoded(tested.output), numerics.decoded(reference_result.output)
    if mine is None or theirs is None:
        which = "run under test" if mine is None else "reference run"
        return Verdict.SKIP, f"numerics: the {which} printed no decode record", {"reference": about}, []
    try:
        comparison = numerics.compare(mine, theirs, settings.numerics_topk)
    except ValueError as exc:
        return Verdict.SKIP, f"numerics: {exc}", {"reference": about}, []
    agrees, reason = numerics.judge(comparison, settings.min_token_agreement, settings.min_topk_overlap,
                                    backend, reference_name)
    extra: dict[str, object] = {
        "reference": about,
        "numerics": {**comparison.summary(), "min_token_agreement": settings.min_token_agreement,
                     "min_topk_overlap": settings.min_topk_overlap,
                     "disagreeing": len(comparison.disagreeing(settings.min_topk_overlap)),
                     "worst": comparison.worst(), "per_sequence": comparison.sequences}}
    return (Verdict.GOOD if agrees else Verdict.BAD), reason, extra, \
        numerics.report_lines(comparison, backend, reference_name)


def timing_gate(root: Path, devices: list[str]) -> Path:
    """The lock file the steps sharing these GPUs of this host hold shared to start an engine and alone to
    measure (child.hold_timing_gate); named by host too, as a cache root may be shared between nodes."""
    gates = root / "timing"
    gates.mkdir(parents=True, exist_ok=True)
    return gates / f"{socket.gethostname()}-gpu-{'-'.join(devices)}.lock"


def child_phases(output: str, launched: float, ended: float) -> dict[str, float]:
    """Seconds per part of a rank's child, from its PHASE_MARKER lines (child.mark_phase: each names the part
    it ends, with the wall clock); launched: when it was started, ended: when it and its peers were gone.
    The last marked part to the end is "shutdown"; a child that marked nothing is one part, "child"."""
    parts: dict[str, float] = {}
    since = launched
    for line in output.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == child.PHASE_MARKER:
            try:
                stamp = float(words[2])
            except ValueError:
                continue
            parts[words[1]] = parts.get(words[1], 0.0) + stamp - since
            since = stamp
    return {**parts, "shutdown": ended - since} if parts else {"child": ended - launched}


def _merged_log(launches: list[Launch], results: list[ProcessResult]) -> str:
    sections = []
    for launch, result in zip(launches, results):
        dp_env = " ".join(f"{key}={value}" for key, value in sorted(launch.env.items())
                          if key.startswith(("VLLM_DP_", "VLLM_ROCM_USE_AITER", "HIP_VISIBLE",
                                             "CUDA_VISIBLE", "VLLM_USE_FLASHINFER")))
        sections.append(f"===== rank {launch.rank}: {dp_env}\n===== argv: {launch.argv}\n{result.output}")
    return "\n".join(sections)


def _write_log(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
