#!/usr/bin/env bash
# Call 6 (after numerics.sh): its bound-learning one-liner ran `python3 -c` without -P, so the repo copy's
# older scenarios/ package shadowed .device/src (the line above is fixed since) and (c) ran with the default
# bounds of that code (0.95/0.95), under which the clean pair itself is bad: the run stopped at the endpoint
# check. Here (c) again with the bounds calibrated_bounds() gives for b1's figures (0.883 / 0.955).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SRC=$PWD/.device/src
export PYTHONPATH=$SRC:/tmp/site PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1 BISECTOR_CACHE_DIR=/tmp/bcache
B="python3 -P -m bisector.cli"
BOUNDS=$(python3 -P -c "
import json; from scenarios.dpa_fp8_kv.numerics import calibrated_bounds
print(' '.join(f'--option {k}={v}' for k, v in calibrated_bounds([{'token_agreement': 0.883, 'topk_overlap': 0.955}]).items()))")
echo "bounds: $BOUNDS"
t=$(date +%s)
$B run --repo /tmp/history --good v0.24.0 --bad silent --scenario dpa-fp8-kv-graph-capture --option platform=cuda \
  --option max_num_seqs=64 --state-dir /tmp/state --build auto --wheels /tmp/wheels --gpus 0 --option check=numerics $BOUNDS \
  --json $OUT/bisect-numerics.json --markdown $OUT/bisect-numerics.md > /tmp/n-out/bisect-numerics.out 2>&1
echo "bisect rc=$? wall=$(( $(date +%s) - t ))s"; tail -14 /tmp/n-out/bisect-numerics.out
$B report latest --repo /tmp/history --state-dir /tmp/state --format html -o $OUT/bisect-numerics.html
tar czf $OUT/logs-numerics2.tar.gz /tmp/state/logs /tmp/n-out 2>/dev/null
