#!/usr/bin/env bash
# Call 3: the last payload part, the vLLM 0.24.0 release repo (bundle), both planted histories in one repo:
# branch `history` (the crash history) and branch `silent` (bench/gpu_fault_history.py --variant silent).
set -x
cp .device/p3/* /tmp/parts/ && ls /tmp/parts
SRC=$PWD/.device/src
rm -rf /tmp/vllm-024 /tmp/history /tmp/history-silent
git clone -q .device/repo/v024.bundle /tmp/vllm-024 && git -C /tmp/vllm-024 tag
python3 $SRC/bench/gpu_fault_history.py --release-repo /tmp/vllm-024 --out /tmp/history --json /tmp/history.json || exit 1
python3 $SRC/bench/gpu_fault_history.py --release-repo /tmp/vllm-024 --out /tmp/history-silent --variant silent \
  --json /tmp/history-silent.json || exit 1
git -C /tmp/history fetch -q /tmp/history-silent history:silent && git -C /tmp/history branch -a
cp /tmp/history.json /tmp/history-silent.json $OUT/
