#!/usr/bin/env bash
# Issue 37 on the H200: wall time to the answer of a 30-commit planted-crash history over real vLLM 0.24.0 with
# 1, 2 and 4 slots on GPU 0 (`--gpus 0`, `--gpus 0:2`, `--gpus 0:4`), back to back on one machine. Every run
# starts cold in the same way: its own state dir (no verdicts, no built artifacts) and its own compile cache
# ($BISECTOR_CACHE_DIR), as the ~340 s one-slot figure of round 4 did.
#
#   bash .device/scripts/slots.sh [GPUS...]     (default: 0 0:2 0:4)
#
# A device call lasts 10 minutes at most: give one or two specs a call (call 1: `0`, which also prepares;
# call 2: `0:2`; call 3: `0:4`) on the same warm machine; the history and wheels in /tmp are made once.
# Writes under $OUT: slots-figures.txt (one line a run), slots-<spec>.{out,json}, slots-<spec>-gpu-memory.csv
# (nvidia-smi every 2 s), logs-slots-<spec>.tar.gz (step, build and build-ahead logs), history30.json.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1  # the device reaches no index: the precompiled build installs offline
START=$(date +%s)
SRC=$PWD/.device/src
[ -e "$SRC" ] || ln -sfn "$PWD" .device/src
if [ ! -f /tmp/history30.json ]; then
  if [ ! -f /tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl ] || [ ! -d /tmp/vllm-024 ]; then  # perf.sh made them
    [ -f .device/repo/v024.bundle ] && cp .device/repo/v024.bundle /tmp/v024.bundle
    bash .device/scripts/prepare.sh > $OUT/prepare.out 2>&1 || { tail -30 $OUT/prepare.out; exit 1; }
    tail -3 $OUT/prepare.out
  fi
  # 30 commits: 9 harmless ones, the 12 of bench/gpu_fault_history.py (the planted fault is its c8: c17 here),
  # 9 harmless ones; each harmless one appends a comment line to vllm/utils/math_utils.py
  PYTHONPATH=/tmp/site python3 - <<'EOF' || exit 1
import json, sys
from pathlib import Path
sys.path.insert(0, ".device/src/bench")
import gpu_fault_history as history

def note(n):
    return ("harmless", f"[Doc] math utils: note {n}",
            [(history.MATH_UTILS, None, f"# Note {n}: the split-KV helpers below size the MLA decode buffers.\n")])

planned = [note(n) for n in range(1, 10)] + history.COMMITS + [note(n) for n in range(10, 19)]
commits = history.build(Path("/tmp/vllm-024"), Path("/tmp/history30"), "v0.24.0", planned)
assert len(commits) == 31 and [c["n"] for c in commits if c["role"] == "planted-fault"] == [17]
Path("/tmp/history30.json").write_text(json.dumps(commits, indent=2) + "\n")
EOF
  W=/tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
  for sha in $(python3 -c "import json; [print(c['sha']) for c in json.load(open('/tmp/history30.json'))]"); do
    mkdir -p /tmp/wheels/$sha && ln -sf $W /tmp/wheels/$sha/
  done
fi
cp /tmp/history30.json $OUT/history30.json
export PYTHONPATH=$SRC:/tmp/site
B="python3 -P -m bisector.cli"
PLANTED=$(python3 -c "import json; print([c['sha'] for c in json.load(open('/tmp/history30.json')) if c['role'] == 'planted-fault'][0])")
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $OUT/slots-figures.txt
for spec in ${@:-0 0:2 0:4}; do
  name=slots-${spec//:/x}
  rm -rf /tmp/state-$name /tmp/cache-$name
  $B run --repo /tmp/history30 --good v0.24.0 --bad history --scenario dpa-fp8-kv-graph-capture \
    --option platform=cuda --option max_num_seqs=64 --gpus $spec --wheels /tmp/wheels --build auto --plan \
    --state-dir /tmp/state-$name > $OUT/$name-plan.out 2>&1
  nvidia-smi --query-gpu=timestamp,memory.used,utilization.gpu --format=csv -l 2 > $OUT/$name-gpu-memory.csv 2>&1 &
  SMI=$!
  left=$(( 590 - ($(date +%s) - START) ))
  t=$(date +%s.%N)
  BISECTOR_CACHE_DIR=/tmp/cache-$name timeout $left $B run --repo /tmp/history30 --good v0.24.0 --bad history \
    --scenario dpa-fp8-kv-graph-capture --option platform=cuda --option max_num_seqs=64 --gpus $spec \
    --wheels /tmp/wheels --build auto --state-dir /tmp/state-$name --json $OUT/$name.json > $OUT/$name.out 2>&1
  rc=$?
  wall=$(python3 -c "import time; print(f'{time.time() - $t:.1f}')")
  kill $SMI
  python3 - "$spec" "$rc" "$wall" "$OUT/$name.json" "$PLANTED" /tmp/state-$name /tmp/cache-$name \
    >> $OUT/slots-figures.txt <<'EOF'
import glob, json, sys
from pathlib import Path
spec, rc, wall, result, planted, state, cache = sys.argv[1:]
line = f"--gpus {spec:<4} rc={rc} wall={wall}s"
if Path(result).is_file():
    data = json.loads(Path(result).read_text())
    culprit = (data.get("culprit") or {}).get("sha", "")
    seconds = [step["seconds"] for step in data["steps"]]
    line += (f" culprit={culprit[:12]} planted={'yes' if culprit == planted else 'NO'} rounds={data['rounds']} "
             f"steps={len(data['steps'])} step_seconds={','.join(f'{s:.0f}' for s in seconds)}")
ahead = glob.glob(f"{state}/logs/*/ahead/*.log")
warm = [path for path in glob.glob(f"{cache}/compile/warm/*") if not path.endswith(".lock")]
line += f" build_ahead_logs={len(ahead)} compile_warm_marks={len(warm)}"
print(line)
EOF
  tail -1 $OUT/slots-figures.txt
  tail -4 $OUT/$name.out
  tar czf $OUT/logs-$name.tar.gz -C /tmp/state-$name logs 2>/dev/null
done
cat $OUT/slots-figures.txt; ls -la $OUT
