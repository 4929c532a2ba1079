#!/usr/bin/env bash
# Call 4: install vLLM 0.24.0 + deps into /tmp/site, the wheel for --build precompiled, then (a): the planted
# crash history bisected again, now with the shared compile cache (BISECTOR_CACHE_DIR) and stable model dir.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SRC=$PWD/.device/src
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
bash .device/device_install.sh .device > $OUT/install.out 2>&1 || { tail -20 $OUT/install.out; exit 1; }
tail -2 $OUT/install.out
export PYTHONPATH=/tmp/site
python3 -c "import sys, torch, transformers, safetensors, git, setuptools_scm, setuptools_rust; print(sys.executable, torch.__version__, transformers.__version__, safetensors.__version__, git.__version__)" || exit 1
W=/tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
python3 .device/scripts/repack_wheel.py /tmp/site $W || exit 1
for sha in $(python3 -c "import json; [print(c['sha']) for f in ('/tmp/history.json', '/tmp/history-silent.json') for c in json.load(open(f))]"); do
  mkdir -p /tmp/wheels/$sha && ln -sf $W /tmp/wheels/$sha/
done
export PYTHONPATH=$SRC:/tmp/site PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1 BISECTOR_CACHE_DIR=/tmp/bcache
B="python3 -P -m bisector.cli"
t=$(date +%s)
$B run --repo /tmp/history --good v0.24.0 --bad history --scenario dpa-fp8-kv-graph-capture \
  --option platform=cuda --option max_num_seqs=64 --gpus 0 --wheels /tmp/wheels --build auto \
  --state-dir /tmp/state --json $OUT/bisect-cc.json --markdown $OUT/bisect-cc.md > $OUT/bisect-cc.out 2>&1
echo "bisect rc=$? wall=$(( $(date +%s) - t ))s"; tail -14 $OUT/bisect-cc.out
$B cache list --repo /tmp/history --state-dir /tmp/state 2>&1 | tail -2
$B report latest --repo /tmp/history --state-dir /tmp/state --format html -o $OUT/bisect-cc.html
tar czf $OUT/logs-cc.tar.gz -C /tmp/state logs; du -sh /tmp/bcache/*
