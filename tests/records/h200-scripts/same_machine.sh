#!/usr/bin/env bash
# Before/after on one machine: the same commits as steps with --option compile_cache=off (a private empty
# cache per step, as every step had before) and on (the shared cache, warmed by v0.24.0 first).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SRC=$PWD/.device/src
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; uname -r
bash .device/device_install.sh .device > /tmp/install.out 2>&1 || { tail -20 /tmp/install.out; exit 1; }
export PYTHONPATH=/tmp/site
W=/tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
python3 .device/scripts/repack_wheel.py /tmp/site $W || exit 1
for sha in $(python3 -c "import json; [print(c['sha']) for c in json.load(open('/tmp/history.json'))]"); do
  mkdir -p /tmp/wheels/$sha && ln -sf $W /tmp/wheels/$sha/; done
export PYTHONPATH=$SRC:/tmp/site PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1 BISECTOR_CACHE_DIR=/tmp/bcache
B="python3 -P -m bisector.cli"
one() { local name=$1; shift; local t=$(date +%s); $B scenario run dpa-fp8-kv-graph-capture --repo /tmp/history \
  --option platform=cuda --option max_num_seqs=64 --state-dir /tmp/state --build auto --wheels /tmp/wheels \
  --json $OUT/$name.json "$@" > /tmp/$name.out 2>&1; echo "$name rc=$? wall=$(( $(date +%s) - t ))s"
  python3 -c "import json; d=json.load(open('$OUT/$name.json')); print(d['verdict'], d['seconds'], 'child', d['details'].get('seconds'), d['details'].get('compile'))"; }
one r0-v024-on-cold --ref v0.24.0
one r1-c7-off --ref 404995eab4d9 --option compile_cache=off
one r2-c7-on --ref 404995eab4d9
one r3-c9-off --ref 2c0b35e0721e --option compile_cache=off
one r4-c9-on --ref 2c0b35e0721e
tar czf $OUT/logs-same.tar.gz /tmp/state/logs /tmp/*.out 2>/dev/null; ls $OUT
