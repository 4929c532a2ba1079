"""Recorded-style child outputs (shapes from shared/README.md and vLLM's logging), by name."""

AITER_LINE = "(EngineCore_DP0 pid=4242) INFO 11-30 01:02:03 [rocm.py:251] Using AITER MLA backend."
READY = "BISECTOR-ENGINE-READY dp_rank=0"
OK = "BISECTOR-SCENARIO-OK dp_rank=0 sequences=4 tokens=8"
FAULT = ("Memory access fault by GPU node-2 (Agent handle: 0x55d1c2a0) on address 0x7f1a2c000000. "
         "Reason: Unknown.")
HSA = ("HIP runtime: HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware "
       "exception. code: 0x1016")
ENGINE_FAILED = ("RuntimeError: Engine core initialization failed. See root cause above. "
                 "Failed core proc(s): {'EngineCore_DP0': -6}")
TRACEBACK = 'Traceback (most recent call last):\n  File "/tmp/w/child.py", line 70, in <module>'

RECORDS = {
    "loading": "INFO 11-30 01:02:03 [default_loader.py:267] Loading weights took 0.52 seconds",
    "ok": "\n".join([AITER_LINE, "INFO Capturing CUDA graphs (decode, FULL): 100%", READY, OK]),
    "ok-without-aiter": "\n".join(["INFO Using Triton MLA backend.", READY, OK]),
    "fault-in-capture": "\n".join([AITER_LINE, "INFO Capturing CUDA graphs (decode, FULL):  20%", FAULT]),
    "fault-then-engine-failed": "\n".join([AITER_LINE, FAULT, HSA, TRACEBACK, ENGINE_FAILED]),
    "fault-in-decode": "\n".join([AITER_LINE, READY, FAULT]),
    "core-abort": "\n".join([AITER_LINE, TRACEBACK, ENGINE_FAILED]),
    "import-error": "\n".join(["WARNING Failed to import from vllm._C with ImportError('x')" , TRACEBACK,
                               "ModuleNotFoundError: No module named 'aiter'"]),
    "undefined-symbol": "\n".join([TRACEBACK, "ImportError: /src/vllm/vllm/_C.abi3.so: undefined "
                                   "symbol: _ZN3c104cuda9SetDeviceEa"]),
    "oom": "\n".join([AITER_LINE, TRACEBACK, "torch.OutOfMemoryError: HIP out of memory. Tried to "
                      "allocate 2.00 GiB. GPU 0 has a total capacity of 191.98 GiB"]),
    "no-gpu": "\n".join([TRACEBACK, "RuntimeError: No HIP GPUs are available"]),
    "other-error": "\n".join([AITER_LINE, TRACEBACK, "ValueError: unsupported cudagraph_mode FULL",
                              "[rank0]:[W] ProcessGroupNCCL destroyed"]),
}
