#!/usr/bin/env bash
# Round 4 (issues 30-33) on the H200: the GPU scenario on real vLLM 0.24.0 with the merged code — the machine
# checked before the build, no install into the shared --python without --allow-install-into-python, the GPUs a
# step sees in the verdict key, machine-caused skips never cached. Call 4, after xfer.sh p1, p2 and p3 (parts of 45M);
# this one carries the dependency wheels, the release bundle and the scripts, and
# runs the checkout itself as the code under test (.device/src links to it).
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
ln -sfn "$PWD" .device/src && cp .device/repo/v024.bundle /tmp/v024.bundle
bash .device/scripts/prepare.sh > $OUT/prepare.out 2>&1 || { tail -30 $OUT/prepare.out; exit 1; }
tail -3 $OUT/prepare.out
SRC=$PWD/.device/src
export PYTHONPATH=$SRC:/tmp/site PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1
B="python3 -P -m bisector.cli"
C8=$(python3 -c "import json; print(json.load(open('$OUT/history.json'))[8]['sha'])")
run() { local name=$1; shift; local t=$(date +%s); $B scenario run dpa-fp8-kv-graph-capture --repo /tmp/history \
  --option platform=cuda --option max_num_seqs=64 --state-dir /tmp/state --json $OUT/$name.json "$@" \
  > $OUT/$name.out 2>&1; echo "$name rc=$? wall=$(( $(date +%s) - t ))s"; tail -3 $OUT/$name.out; }
run t1-no-opt-in --ref v0.24.0 --build precompiled --wheels /tmp/wheels
run t2-good --ref v0.24.0 --build precompiled --wheels /tmp/wheels --allow-install-into-python
run t3-good-again --ref v0.24.0 --build precompiled --wheels /tmp/wheels --allow-install-into-python
CUDA_VISIBLE_DEVICES=none run t4-no-gpu-visible --ref v0.24.0 --build precompiled --wheels /tmp/wheels --allow-install-into-python
run t5-c8-planted --ref $C8 --build auto --wheels /tmp/wheels --allow-install-into-python
$B cache list --repo /tmp/history --state-dir /tmp/state > $OUT/cache-list.out 2>&1; cat $OUT/cache-list.out
tar czf $OUT/logs-trust.tar.gz -C /tmp/state logs 2>/dev/null; ls -la $OUT
