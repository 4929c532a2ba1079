"""Child outputs for the GPU scenario's tests: real ones and public quotes, each with its source.

- tests/records/*.log: outputs of real runs (see `recorded`), with their provenance in the header.
- The ROCm lines below are quoted from public reports (no AMD GPU is at hand); the URL is beside each.
  Markers and vLLM's own INFO lines come from scenarios/dpa_fp8_kv/child.py and vLLM's source.
"""
from pathlib import Path

RECORDS_DIR = Path(__file__).parent / "records"

# https://github.com/vllm-project/vllm/pull/47276 (the report behind the fix): the decode graph capture
# line, then one line per faulting rank.
CAPTURE_47 = "Capturing CUDA graphs (decode, FULL):  92%|█████████▏| 47/51 [00:44<00:03,  1.09it/s]"
FAULT = ("Memory access fault by GPU node-2 (Agent handle: 0x14d58bb0) on address 0x7f4df7c2e000. "
         "Reason: Unknown.")
FAULT_READ_ONLY = ("Memory access fault by GPU node-9 (Agent handle: 0x1511ab90) on address 0x7ecbf7972000. "
                   "Reason: Write access to a read-only page.")
# https://github.com/ROCm/legacy-rocm-build/issues/2153
APERTURE = (":0:rocdevice.cpp :2672: 0696142325 us: 5999 : [tid:0x7f676e4c7640] Device::callbackQueue "
            "aborting with error : HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION: The agent attempted to "
            "access memory beyond the largest legal address. code: 0x29")
# https://github.com/doktor83/SRBMiner-Multi/issues/206
HSA_MEMORY_FAULT = (":0:rocdevice.cpp            :2614: 102457364470 us: 6856 : [tid:0x7fe7bb747700] "
                    "Device::callbackQueue aborting with error : HSA_STATUS_ERROR_MEMORY_FAULT: Agent "
                    "attempted to access an inaccessible address. code: 0x2b")
# https://github.com/iree-org/iree/issues/17872 (the same form on MI325X with AITER:
# https://github.com/ROCm/legacy-rocm-build/issues/6023)
HSA = (":0:rocdevice.cpp            :2893: 90021033577 us: [pid:192145 tid:0x76fa7d3ff640] Callback: "
       "Queue 0x76f676200000 aborting with error : HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation "
       "resulted in a hardware exception. code: 0x1016")
# vLLM's own lines: the ROCm selection line (vllm/platforms/rocm.py, 0.19+), the pre-0.19 one, and the
# frontend's error when an engine core died (vllm/v1/engine/utils.py), here for a SIGABRT.
ROCM_SELECTED = ("(EngineCore_DP0 pid=4242) INFO 05-20 10:00:01 [rocm.py:557] Using ROCM_AITER_MLA backend "
                 "(selected via --attention-backend).")
ROCM_SELECTED_OLD = "(EngineCore_DP0 pid=4242) INFO 05-20 10:00:01 [rocm.py:251] Using AITER MLA backend."
NON_DEFAULT_ARGS = ("INFO 05-20 10:00:00 [utils.py:233] non-default args: {'attention_backend': "
                    "'ROCM_AITER_MLA', 'kv_cache_dtype': 'fp8'}")
ENGINE_FAILED = ("RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {'EngineCore_DP0': -6}")
READY = "BISECTOR-ENGINE-READY dp_rank=0"
OK = "BISECTOR-SCENARIO-OK dp_rank=0 sequences=512 tokens=1024"
TRACEBACK = 'Traceback (most recent call last):\n  File "/tmp/w/child.py", line 70, in <module>'
PREFIX = "(EngineCore_DP0 pid=4242) "

RECORDS = {
    "loading": "INFO 05-20 10:00:03 [default_loader.py:267] Loading weights took 0.52 seconds",
    "ok": "\n".join([NON_DEFAULT_ARGS, ROCM_SELECTED, PREFIX + CAPTURE_47, READY, OK]),
    "ok-without-aiter": "\n".join([NON_DEFAULT_ARGS, READY, OK]),
    "fault-in-capture": "\n".join([ROCM_SELECTED, PREFIX + CAPTURE_47 + FAULT]),
    "fault-then-engine-failed": "\n".join([ROCM_SELECTED, FAULT, FAULT_READ_ONLY, HSA, TRACEBACK,
                                           ENGINE_FAILED]),
    "fault-in-decode": "\n".join([ROCM_SELECTED, READY, FAULT]),
    "aperture": "\n".join([ROCM_SELECTED_OLD, PREFIX + APERTURE, ENGINE_FAILED]),
    "lone-0x1016": "\n".join([ROCM_SELECTED, PREFIX + CAPTURE_47, PREFIX + HSA, ENGINE_FAILED]),
    "ok-then-teardown-abort": "\n".join([ROCM_SELECTED, READY, OK, PREFIX + HSA_MEMORY_FAULT]),
    "core-abort": "\n".join([ROCM_SELECTED, TRACEBACK, ENGINE_FAILED]),
    "import-error": "\n".join([TRACEBACK, PREFIX + "ModuleNotFoundError: No module named 'aiter'"]),
    "undefined-symbol": "\n".join([TRACEBACK, "ImportError: /src/vllm/vllm/_C.abi3.so: undefined "
                                   "symbol: _ZN3c104cuda9SetDeviceEa"]),
    "oom": "\n".join([ROCM_SELECTED, TRACEBACK, PREFIX + "torch.OutOfMemoryError: HIP out of memory. Tried "
                      "to allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB"]),
    "no-gpu": "\n".join([TRACEBACK, "RuntimeError: No HIP GPUs are available"]),
    "other-error": "\n".join([ROCM_SELECTED, TRACEBACK, "ValueError: unsupported cudagraph_mode FULL",
                              "[rank0]:[W] ProcessGroupNCCL destroyed"]),
}


def recorded(name: str) -> tuple[dict, str]:
    """A real run's output from tests/records/NAME.log: ({provenance key: value}, output).

    The file starts with `#: key: value` lines (vLLM version, GPU, date, command, exit code), then a
    `#: output` line; everything after it is the child's output as it was written.
    """
    text = (RECORDS_DIR / f"{name}.log").read_text()
    header, _, output = text.partition("#: output\n")
    provenance = dict(line[3:].split(": ", 1) for line in header.splitlines() if line.startswith("#: "))
    return provenance, output
