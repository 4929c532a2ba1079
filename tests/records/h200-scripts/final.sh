#!/usr/bin/env bash
# Final H200 check of the merged code: the GPU scenario on real 0.24.0 and a bisection of the planted history
# with the scenario's default --signature auto (ImportError range c5-c6 must be skips, c8 the culprit).
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
[ -f .device/repo/v024.bundle ] && cp .device/repo/v024.bundle /tmp/v024.bundle
bash .device/scripts/prepare.sh > $OUT/prepare.out 2>&1 || { tail -30 $OUT/prepare.out; exit 1; }
tail -5 $OUT/prepare.out
SRC=$PWD/.device/src
export PYTHONPATH=$SRC:/tmp/site
B="python3 -P -m bisector.cli"
t=$(date +%s)
$B run --repo /tmp/history --good v0.24.0 --bad history --scenario dpa-fp8-kv-graph-capture \
  --option platform=cuda --option max_num_seqs=64 --gpus 0 --wheels /tmp/wheels --build auto \
  --state-dir /tmp/state-final --json $OUT/bisect-final.json --markdown $OUT/bisect-final.md > $OUT/bisect-final.out 2>&1
echo "bisect rc=$? wall=$(( $(date +%s) - t ))s"; tail -25 $OUT/bisect-final.out
$B report latest --repo /tmp/history --state-dir /tmp/state-final --format html -o $OUT/bisect-final.html
tar czf $OUT/logs-final.tar.gz -C /tmp/state-final logs
