#!/usr/bin/env bash
# Issue 35 on the H200: a performance hunt on real vLLM 0.24.0. A history of eight Python-only commits
# (bench/gpu_fault_history.py --variant perf) plants a decode slowdown at p5: the sampler sleeps a pause per
# step, sized here to about 6 % of the measured decode step. `dpa-fp8-kv-graph-capture --option check=perf`
# measures decode tok/s (full CUDA graphs, after a warm-up; the batch over the median timed engine step) and
# time to first token inside each engine start; `steps` prints each repeat's method, median step and its IQR;
# `bisector run --metric decode_tok_s --higher-is-better` must name p5.
#
# SHAPE=gpu (round 7, the default): a GPU-bound decode (16 layers, 128 sequences of 1,500+ prompt tokens: each
# step reads a long KV cache) and the pause planted as GPU work (torch.cuda._sleep at the measured SM clock), so
# the VM's CPU drift (round 6) hides behind the GPU under vLLM's async scheduling. SHAPE=cpu: round 6's tiny
# CPU-bound decode (32 short sequences); there PAUSE_KIND=busy plants the pause as CPU work and
# METRIC=cpu_ms_per_step DIRECTION=--lower-is-better hunts the CPU time per step instead of wall-time throughput.
#
# Phases, one device call each (a call is capped at 10 minutes; the machine must stay warm between them):
#   bash perf.sh prepare   install vLLM 0.24.0 (prepare.sh), measure v0.24.0, build the history, measure p5
#   bash perf.sh hunt [S]  start the hunt in the background (unless it runs) and wait for it up to S seconds (560)
#   bash perf.sh wait [S]  wait for the running hunt up to S seconds more (the same as hunt once it runs)
#   bash perf.sh report    the reports (text, JSON with every sample, Markdown, HTML with the plot, SVG)
#   bash perf.sh go [S]    prepare, then the hunt until S seconds (570) have passed since the call began, then report
# SLOTS=N: N steps share the GPU (--gpus 0:N --jobs N): engines start side by side (the GPU's timing gate held
# shared), each step measures alone (the gate held alone), imports and shutdowns overlap; the KV cache option is
# N x 4G, as the slot's share divides it (4G each, as with one slot). Round 8 ran SLOTS=2 with the gate held alone
# from engine start to the end of the measurements; round 9 SLOTS=2 (734 s for the hunt) and, after the gate
# change, SLOTS=3 (525 s). PAUSE_US=N [MHZ=M]: prepare plants N us without measuring v0.24.0 first (round 7
# measured 1,139-1,147 us at 1,980 MHz).
# Each run starts an engine (about 30-40 s with the compile cache warm); round 9's hunts took 21 runs (the ends
# 5 and 6, probes 4, 3 and 3): `go` then `wait`, the calls back to back.
set -x
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
ln -sfn "$PWD" .device/src 2>/dev/null
SRC=$PWD/.device/src
export PYTHONPATH=$SRC:/tmp/site PIP_NO_BUILD_ISOLATION=0 PIP_NO_DEPS=1 PIP_NO_INDEX=1 BISECTOR_CACHE_DIR=/tmp/bcache
B="python3 -P -m bisector.cli"
BEGAN=$(date +%s)
if [ "${SHAPE:-gpu}" = gpu ]; then
  BATCH=128; PAUSE_KIND=${PAUSE_KIND:-gpu}
  KV=$(( 4 * ${SLOTS:-1} ))G  # the slot's share of the GPU scales it back to 4G each
  SHAPED=(--option layers=16 --option perf_prompt_tokens=1500 --option max_model_len=2048
          --option kv_cache_memory_bytes=$KV --option max_num_seqs=$BATCH --option perf_batch=$BATCH)
else
  BATCH=32; SHAPED=(--option max_num_seqs=64 --option perf_batch=$BATCH)
fi
GPU=(--option platform=cuda --option check=perf --option perf_repeats=3 --option perf_tokens=64 "${SHAPED[@]}")
BUILD=(--build auto --wheels /tmp/wheels --allow-install-into-python)
median() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['details']['perf'][sys.argv[2]])" "$@"; }
steps() { python3 -c "
import json, sys
for m in json.load(open(sys.argv[1]))['details']['perf']['measurements']:
    print(' ', m.get('method'), 'median step', m.get('step_ms_median'), 'ms, IQR', m.get('step_ms_iqr'), 'ms, mean',
          m.get('step_ms_mean'), 'ms over', m.get('steps'), 'steps:', round(m.get('decode_tok_s', 0)), 'tok/s; cpu',
          m.get('cpu_ms_per_step'), 'ms/step, steal', m.get('steal_ms'), 'ms, SM', m.get('sm_clock_mhz'), 'MHz')" "$@"; }

clock() { python3 -c "
import json, statistics, sys
mhz = [m['sm_clock_mhz'] for m in json.load(open(sys.argv[1]))['details']['perf']['measurements'] if m.get('sm_clock_mhz')]
print(round(statistics.median(mhz)) if mhz else 1980)" "$@"; }

PHASE=${1:-prepare}
case "$PHASE" in go) PHASES="prepare hunt report";; wait) PHASES="wait report";; *) PHASES=$PHASE;; esac
[ "${SLOTS:-1}" -gt 1 ] && GPUS=(--gpus 0:$SLOTS --jobs $SLOTS) || GPUS=(--gpus 0)
for PHASE in $PHASES; do
case "$PHASE" in
prepare)
  if [ ! -f /tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl ]; then  # slots.sh prepared it already
    cp .device/repo/v024.bundle /tmp/v024.bundle
    bash .device/scripts/prepare.sh > $OUT/prepare.out 2>&1 || { tail -30 $OUT/prepare.out; exit 1; }
    tail -3 $OUT/prepare.out
  fi
  if [ -n "$PAUSE_US" ]; then
    PAUSE=$PAUSE_US; MHZ=${MHZ:-1980}; echo "planted pause $PAUSE us (${PAUSE_KIND:-sleep}) at $MHZ MHz, as given"
  else
  t=$(date +%s)
  $B scenario run dpa-fp8-kv-graph-capture --repo /tmp/history --ref v0.24.0 "${GPU[@]}" "${BUILD[@]}" \
    --state-dir /tmp/pstate --json $OUT/perf-base.json > $OUT/perf-base.out 2>&1
  echo "base rc=$? wall=$(( $(date +%s) - t ))s"; tail -3 $OUT/perf-base.out
  TOK_S=$(median $OUT/perf-base.json decode_tok_s) || exit 1
  steps $OUT/perf-base.json
  # a decode step makes perf_batch tokens: its time is the batch / tok/s; the pause is 6 % of it
  PAUSE=$(python3 -c "print(max(20, round(0.06 * $BATCH / $TOK_S * 1e6)))")
  MHZ=$(clock $OUT/perf-base.json)
  echo "v0.24.0 decode $TOK_S tok/s, ttft $(median $OUT/perf-base.json ttft_ms) ms, SM $MHZ MHz: planted pause" \
       "${PAUSE} us (${PAUSE_KIND:-sleep})"
  fi
  rm -rf /tmp/perf-history
  python3 $SRC/bench/gpu_fault_history.py --release-repo /tmp/vllm-024 --out /tmp/perf-history --variant perf \
    --pause-us $PAUSE --pause-kind ${PAUSE_KIND:-sleep} --gpu-clock-mhz $MHZ --json $OUT/perf-history.json || exit 1
  cp $OUT/perf-history.json /tmp/perf-history.json  # for the report, a later call
  W=/tmp/whl/vllm-0.24.0-cp38-abi3-manylinux_2_28_x86_64.whl
  for sha in $(python3 -c "import json; [print(c['sha']) for c in json.load(open('$OUT/perf-history.json'))]"); do
    mkdir -p /tmp/wheels/$sha && ln -sf $W /tmp/wheels/$sha/
  done
  if [ "$PHASES" = prepare ] && [ -z "$PAUSE_US" ]; then  # go: the hunt measures p5 among the others
    P5=$(python3 -c "import json; print(json.load(open('$OUT/perf-history.json'))[5]['sha'])")
    t=$(date +%s)
    $B scenario run dpa-fp8-kv-graph-capture --repo /tmp/perf-history --ref $P5 "${GPU[@]}" "${BUILD[@]}" \
      --state-dir /tmp/pstate --json $OUT/perf-p5.json > $OUT/perf-p5.out 2>&1
    echo "p5 rc=$? wall=$(( $(date +%s) - t ))s: decode $(median $OUT/perf-p5.json decode_tok_s) tok/s"
    steps $OUT/perf-p5.json
  fi
  ;;
hunt|wait)
  # The hunt runs in the background (its output under /tmp/pout), so a call's 10-minute cap does not stop it:
  # this phase starts it unless it runs already, waits until it ends or S seconds have passed, and copies its
  # output to $OUT. Call `wait [S]` again (within 30 s: the machine keeps /tmp only while warm) until it ends.
  t=$(date +%s)
  [ "$PHASES" = "$PHASE" ] && LIMIT=${2:-560} || LIMIT=$(( ${2:-570} - (t - BEGAN) ))
  mkdir -p /tmp/pout
  if ! { [ -f /tmp/pout/pid ] && kill -0 "$(cat /tmp/pout/pid)" 2>/dev/null; } && [ ! -f /tmp/pout/rc ]; then
    setsid bash -c '"$@" > /tmp/pout/perf-hunt.out 2>&1; echo $? > /tmp/pout/rc' hunt \
      $B run --repo /tmp/perf-history --good v0.24.0 --bad history --scenario dpa-fp8-kv-graph-capture \
      "${GPU[@]}" "${BUILD[@]}" "${GPUS[@]}" --metric ${METRIC:-decode_tok_s} ${DIRECTION:---higher-is-better} \
      --min-change 2 --max-samples 12 --state-dir /tmp/pstate --json /tmp/pout/perf-hunt.json \
      --markdown /tmp/pout/perf-hunt.md < /dev/null &
    echo $! > /tmp/pout/pid
  fi
  while [ ! -f /tmp/pout/rc ] && [ $(( $(date +%s) - t )) -lt $LIMIT ]; do sleep 5; done
  cp /tmp/pout/perf-hunt.* $OUT/ 2>/dev/null
  if [ -f /tmp/pout/rc ]; then echo "hunt ended rc=$(cat /tmp/pout/rc)"; else echo "hunt still running: call 'wait'"; fi
  tail -25 /tmp/pout/perf-hunt.out
  [ -f /tmp/pout/rc ] || exit 0  # no report yet
  ;;
report)
  $B report latest --repo /tmp/perf-history --state-dir /tmp/pstate --format html -o $OUT/perf-hunt.html
  $B report latest --repo /tmp/perf-history --state-dir /tmp/pstate --format json -o $OUT/perf-hunt.json
  $B report latest --repo /tmp/perf-history --state-dir /tmp/pstate > $OUT/perf-hunt.txt
  python3 -c "
import json, sys; sys.path.insert(0, '$SRC')
from bisector.report.perf import svg
from bisector.search.perf import PerfRecord
data = json.load(open('$OUT/perf-hunt.json'))
culprit = (data.get('first_bad') or {}).get('sha')
open('$OUT/perf-hunt.svg', 'w').write(svg(PerfRecord.from_json(data['perf']), data['range'], culprit))
print('culprit', culprit, 'planted', json.load(open('/tmp/perf-history.json'))[5]['sha'])"
  head -20 $OUT/perf-hunt.txt
  python3 -c "
import json  # where each step's seconds went (details.phases, since round 7)
for s in json.load(open('$OUT/perf-hunt.json'))['steps']:
    print(s['sha'][:12], s['role'], s['seconds'], s['details'].get('phases'))" | tee $OUT/perf-phases.txt | tail -5
  tar czf $OUT/logs-perf.tar.gz -C /tmp/pstate logs 2>/dev/null; ls -la $OUT
  ;;
esac
done
