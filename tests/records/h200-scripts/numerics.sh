#!/usr/bin/env bash
# Call 5: check=numerics on the clean v0.24.0 (b), the silent culprit under check=crash, and (c): the silent
# history bisected with check=numerics, its bounds learned from the clean TRITON_MLA/FLASHMLA pair of (b).
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SRC=$PWD/.device/src
export PYTHONPATH=$SRC:/tmp/site PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1 BISECTOR_CACHE_DIR=/tmp/bcache
B="python3 -P -m bisector.cli"
C="--option platform=cuda --option max_num_seqs=64 --state-dir /tmp/state --build auto --wheels /tmp/wheels"
one() { local name=$1; shift; local t=$(date +%s); $B scenario run dpa-fp8-kv-graph-capture --repo /tmp/history $C \
  --json $OUT/$name.json "$@" > /tmp/n-out/$name.out 2>&1; local rc=$?
  echo "$name rc=$rc wall=$(( $(date +%s) - t ))s"; tail -3 /tmp/n-out/$name.out; return $rc; }
mkdir -p /tmp/n-out
one b1-triton-vs-flashmla --ref v0.24.0 --option check=numerics
[ $? -le 1 ] && grep -q '"token_agreement"' $OUT/b1-triton-vs-flashmla.json || { tail -60 /tmp/n-out/b1-triton-vs-flashmla.out; tail -80 $(ls -t /tmp/state/logs/*.log | head -1); exit 1; }
BOUNDS=$(python3 -P -c "
import json; from scenarios.dpa_fp8_kv.numerics import calibrated_bounds
d = json.load(open('$OUT/b1-triton-vs-flashmla.json'))['details']['numerics']
print(' '.join(f'--option {k}={v}' for k, v in calibrated_bounds([d]).items()))")
echo "bounds learned from b1: $BOUNDS"
CULPRIT=$(python3 -c "import json; print(next(c['sha'] for c in json.load(open('/tmp/history-silent.json')) if c['role'] == 'silent-bug'))")
SILENT_TIP=$(git -C /tmp/history rev-parse silent)
one b2-triton-vs-eager --ref v0.24.0 --option check=numerics --option reference=eager
one b3-flashmla-vs-eager --ref v0.24.0 --option check=numerics --option attention_backend=FLASHMLA --option reference=eager
one c1-silent-culprit-crash-check --ref $CULPRIT
t=$(date +%s)
$B run --repo /tmp/history --good v0.24.0 --bad silent --scenario dpa-fp8-kv-graph-capture $C --gpus 0 \
  --option check=numerics $BOUNDS --json $OUT/bisect-numerics.json --markdown $OUT/bisect-numerics.md > /tmp/n-out/bisect-numerics.out 2>&1
echo "bisect rc=$? wall=$(( $(date +%s) - t ))s"; tail -16 /tmp/n-out/bisect-numerics.out
$B report latest --repo /tmp/history --state-dir /tmp/state --format html -o /tmp/n-out/bisect-numerics.html
du -sh /tmp/bcache/*; tar czf $OUT/logs-numerics.tar.gz /tmp/state/logs /tmp/n-out 2>/dev/null
ls -la $OUT
