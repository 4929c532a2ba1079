"""Scenario dpa-fp8-kv-graph-capture: tiny DeepSeek-V3, AITER MLA, FP8 KV cache, full decode graphs."""
from scenarios.dpa_fp8_kv.scenario import DpaFp8KvScenario

__all__ = ["DpaFp8KvScenario"]
