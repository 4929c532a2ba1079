#!/usr/bin/env bash
# Call 4, part 2: `bisector scenario run` on real vLLM 0.24.0 (precompiled from the wheel), then on the
# import-error and planted-fault commits. Every log goes to $OUT/logs.tar.gz.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SRC=$PWD/.device/src
export PYTHONPATH=$SRC:/tmp/site
B="python3 -P -m bisector.cli"
sha() { python3 -c "import json; print(json.load(open('/work/main/.device/scripts/../scripts/history.json'.replace('/work/main/.device/scripts/../scripts', '.device/scripts')))[$1]['sha'])"; }
STATE=/tmp/state
run() { local name=$1; shift; local t=$(date +%s); $B scenario run dpa-fp8-kv-graph-capture --repo /tmp/history \
  --option platform=cuda --state-dir $STATE --json $OUT/$name.json "$@" > $OUT/$name.out 2>&1; local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s) - t ))s"; cat $OUT/$name.out; }
# (1) the precompiled path for real: setup.py develop with VLLM_USE_PRECOMPILED from the wheel (offline pip)
export PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1
mv $OUT/s1-v024-precompiled.out /tmp/ 2>/dev/null; run s1-v024-precompiled --ref v0.24.0 --build precompiled --wheels /tmp/wheels
if grep -q "build failed" $OUT/s1-v024-precompiled.out; then
  # fallback (not needed on the H200 run): the python strategy fed from the wheel
  STATE=/tmp/state-seeded
  python3 $SRC/bench/seed_wheel_artifacts.py --repo /tmp/history --ref v0.24.0 --state-dir $STATE \
    --wheel /tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
  run s1b-v024-python --ref v0.24.0 --build python
fi
echo $STATE > /tmp/state-used
run s2-c5-import-error --ref $(sha 5) --build auto --wheels /tmp/wheels
run s3-c8-planted --ref $(sha 8) --build auto --wheels /tmp/wheels
run s4-c8-planted-bf16kv --ref $(sha 8) --build auto --wheels /tmp/wheels --option kv_cache_dtype=auto --option max_num_seqs=64
tar czf $OUT/logs-scenarios.tar.gz -C $STATE logs 2>/dev/null; ls -la $OUT
