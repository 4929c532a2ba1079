#!/usr/bin/env bash
# Round 8, after the hunts: where the GPU child's 15-22 s of imports go. Installs vLLM 0.24.0 into /tmp/site
# (device_install.sh), then times `import torch` and `from vllm import LLM, SamplingParams` in fresh
# interpreters (the first cold, then warm page cache), and the 25 slowest modules by `python -X importtime`.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
bash .device/device_install.sh .device > $OUT/install.out 2>&1 || { tail -5 $OUT/install.out; exit 1; }
export PYTHONPATH=/tmp/site
for i in 1 2 3; do
  python3 -c "
import time; t0 = time.time()
import torch; t1 = time.time()
from vllm import LLM, SamplingParams; t2 = time.time()
from vllm.engine.arg_utils import EngineArgs; t3 = time.time()
print('run $i: import torch %.1f s, vllm (torch loaded) %.1f s, EngineArgs %.1f s' % (t1 - t0, t2 - t1, t3 - t2))"
done | tee $OUT/imports.txt
python3 -X importtime -c "from vllm import LLM, SamplingParams" 2> $OUT/importtime.txt
sort -t'|' -k2 -n -r $OUT/importtime.txt | head -25 | tee $OUT/importtime-top.txt
