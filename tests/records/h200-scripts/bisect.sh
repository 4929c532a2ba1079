#!/usr/bin/env bash
# Call 5: bisector run over the planted history on the H200; JSON + HTML + markdown reports, all logs.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SRC=$PWD/.device/src
export PYTHONPATH=$SRC:/tmp/site
B="python3 -P -m bisector.cli"
STATE=$(cat /tmp/state-used 2>/dev/null || echo /tmp/state)
t=$(date +%s)
$B run --repo /tmp/history --good v0.24.0 --bad history --scenario dpa-fp8-kv-graph-capture \
  --option platform=cuda --option max_num_seqs=64 --gpus 0 --build auto --wheels /tmp/wheels \
  --state-dir $STATE --json $OUT/bisect.json --markdown $OUT/bisect.md > $OUT/bisect.out 2>&1
echo "bisect rc=$? wall=$(( $(date +%s) - t ))s"; cat $OUT/bisect.out
$B report latest --repo /tmp/history --state-dir $STATE --format html -o $OUT/bisect.html
tar czf $OUT/logs-bisect.tar.gz -C $STATE logs; ls -la $OUT
