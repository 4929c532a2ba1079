#!/usr/bin/env bash
# Issue 35 diagnosis: decode step time jumps between engine starts (~2.1 ms or ~3.2 ms at the same commit).
# Are the engine's processes sharing a physical core? Runs v0.24.0's check=perf alternately pinned (one thread of
# each of 4 physical cores) and unpinned, until LIMIT seconds have passed, printing each run's median steps and,
# since round 6, each repeat's CPU time per step, the machine's steal time and the GPU's SM clock.
# perf_repeats differs per run so the stored verdict of the same question is not served (the build is reused).
#   bash pin.sh LIMIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
START=$(date +%s)
SRC=$PWD/.device/src; [ -e "$SRC" ] || ln -sfn "$PWD" .device/src
cp .device/repo/v024.bundle /tmp/v024.bundle
bash .device/scripts/prepare.sh > $OUT/prepare.out 2>&1 || { tail -30 $OUT/prepare.out; exit 1; }
export PYTHONPATH=$SRC:/tmp/site PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1 BISECTOR_CACHE_DIR=/tmp/bcache
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|NUMA|Model name)"
CPUS=$(python3 -c "
import glob
seen, picked = set(), []
for path in sorted(glob.glob('/sys/devices/system/cpu/cpu[0-9]*/topology/thread_siblings_list'), key=lambda p: int(p.split('/')[5][3:])):
    sib = open(path).read().strip()
    if sib not in seen:
        seen.add(sib); picked.append(path.split('/')[5][3:])
print(','.join(picked[2:6]))")
echo "siblings: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list) ...; pinned runs use $CPUS"
n=0
while [ $(( $(date +%s) - START )) -lt ${1:-400} ]; do
  n=$((n + 1))
  if [ $((n % 2)) = 0 ]; then PIN=(taskset -c $CPUS); how=pinned; else PIN=(); how=unpinned; fi
  t=$(date +%s)
  "${PIN[@]}" python3 -P -m bisector.cli scenario run dpa-fp8-kv-graph-capture --repo /tmp/history --ref v0.24.0 \
    --option platform=cuda --option max_num_seqs=64 --option check=perf --option perf_repeats=$((n + 2)) \
    --option perf_tokens=64 --option perf_batch=32 --build auto --wheels /tmp/wheels --allow-install-into-python \
    --state-dir /tmp/pstate --json /tmp/pin-$n.json > /tmp/pin-$n.out 2>&1
  echo "run $n $how rc=$? wall=$(( $(date +%s) - t ))s: $(python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))['details']['perf']
print('median steps ms', [m.get('step_ms_median') for m in d['measurements']], 'tok/s', round(d['decode_tok_s']),
      'cpu ms/step', [m.get('cpu_ms_per_step') for m in d['measurements']], 'steal ms',
      [m.get('steal_ms') for m in d['measurements']], 'SM MHz', [m.get('sm_clock_mhz') for m in d['measurements']])
" /tmp/pin-$n.json 2>&1 | tail -1)" | tee -a $OUT/pin-figures.txt
done
tail -5 /tmp/pin-1.out
