#!/usr/bin/env bash
# Call 4, part 1: install vLLM 0.24.0 + deps into /tmp/site, the release repo, the history, the wheel.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
SRC=$PWD/.device/src
date -u +%FT%TZ; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import sys, torch, transformers; print(sys.executable, torch.__version__, torch.version.cuda, transformers.__version__)"
ls /proc/driver/nvidia/gpus /dev/nvidia* 2>&1 | head
bash .device/device_install.sh .device || exit 1
export PYTHONPATH=/tmp/site
rm -rf /tmp/vllm-024 /tmp/history && git clone -q /tmp/v024.bundle /tmp/vllm-024 && git -C /tmp/vllm-024 tag | head
python3 $SRC/bench/gpu_fault_history.py --release-repo /tmp/vllm-024 --out /tmp/history --json $OUT/history.json || exit 1
W=/tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
python3 .device/scripts/repack_wheel.py /tmp/site $W || exit 1
for sha in $(python3 -c "import json; [print(c['sha']) for c in json.load(open('$OUT/history.json'))]"); do
  mkdir -p /tmp/wheels/$sha && ln -sf $W /tmp/wheels/$sha/
done
python3 -c "import git, setuptools_scm, setuptools_rust; print('git', git.__version__)"
