#!/usr/bin/env bash
# One lent-GPU session on an H200 (issues 9 and 10), prepared 2026-11-29; about 6 minutes. In order of value:
#  1. real training steps (hetpart run --no-emulation) on a GPU the project has never fitted or measured: held-out
#     rows for experiments/data/h200_runs.jsonl (recompute none/selective/full at one width, two micro-batches at a
#     wider one; the runtime runs fp32 whatever the plan's precision, so there is no bf16 run; each record carries
#     the runtime's own prediction, from unit times its rank measured on the GPU, and its measured peak memory);
#  1b. one block timed three ways (experiments/device/unit_timing.py), and two ranks on one GPU refused;
#  2. a measured profile of the same shrunken model (hetpart calibrate on CUDA, fp32, the run's width and sequence)
#     so that the runs can be predicted from it afterwards (issue 9 item 2, on a GPU);
#  3. torch.utils.checkpoint's host cost on CUDA (bench_host_ops --recompute-host --device cuda) against the CPU's
#     compute.RECOMPUTE_HOST;
#  4. the caching allocator's reserve over what tensors hold at a pipeline stage's peak (bench_allocator
#     --measure): evidence for memory.FRAGMENTATION_FRACTION (ASSUMED 5%).
# Run from the repository root on the device machine; writes under $OUT (or ./out). Every step has its own limit,
# so a slow one costs its own result and not the others'. At most 7 files come back (the tool returns 8). The first
# session (2026-11-29) lost six of its seven runs to the CPU-timed in-run profile (fixed) and its allocator step to
# the call's limit: call with timeout_s 540 and read session.log. DO_UNIT=0, DO_CAL=0, DO_HOST=0, DO_ALLOC=0 stop before that step.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for p in costmodel envs policies runtime experiments; do ln -sfn ../$p hetpart/$p; done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
HP=(python3 -c 'import sys; from hetpart.cli.app import _entry; sys.argv[0] = "hetpart"; _entry()')
LOG="$OUT/session.log"
TMP=$(mktemp -d)  # plans, step logs: not under $OUT, whose files come back eight at most
say() { echo "$*" | tee -a "$LOG"; }
DEV=${DEVICE:-cuda}
GPU=${GPU:-H200-141GB}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1 | tee -a "$LOG"
printf 'name: one-gpu\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: %s, intra_node: NVLink4, nic: IB-NDR}\n' "$GPU" > "$TMP/c.yaml"
W1=${W1:-1024}; W2=${W2:-2048}; SEQ=${SEQ:-512}; GB=${GB:-16}; STEPS=${STEPS:-6}
# width micro-batch recompute precision
RUNS=${RUNS:-"$W1 4 none fp32
$W1 4 selective fp32
$W1 4 full fp32
$W1 1 none fp32
$W2 1 none fp32
$W2 4 none fp32"}
i=0
while read -r H MB RC PR; do
  [ -z "$H" ] && continue
  i=$((i + 1))
  printf '{"global_batch": %d, "micro_batch": %d, "seq_len": %d, "schedule": "1f1b", "recompute": "%s", "precision": "%s", "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 14], "devices": ["0/0/0"], "tp": 1}]}]}\n' \
    "$GB" "$MB" "$SEQ" "$RC" "$PR" > "$TMP/p.json"
  t0=$(date +%s)
  timeout ${RUN_TIMEOUT:-60} "${HP[@]}" run "$TMP/p.json" --model gpt2-small --cluster "$TMP/c.yaml" --hidden-size "$H" \
    --no-emulation --steps "$STEPS" --warmup 2 --log-every 0 --out "$OUT/h200_runs_new.jsonl" > "$TMP/run.log" 2>&1
  rc=$?; say "run $i h=$H mb=$MB recompute=$RC precision=$PR rc $rc in $(( $(date +%s) - t0 )) s"
  grep -v USDT "$TMP/run.log" | tail -n 6 | tee -a "$LOG"
done <<< "$RUNS"
[ "${DO_UNIT:-1}" = 1 ] || exit 0
t0=$(date +%s)  # one block: issue time, one synchronised call (the profile's clock), back-to-back (a step)
timeout ${UNIT_TIMEOUT:-90} python3 experiments/device/unit_timing.py "$DEV" "$W1" "$SEQ" "$OUT/unit_timing.json" \
  > "$TMP/unit.log" 2>&1
say "unit_timing rc $? in $(( $(date +%s) - t0 )) s"; grep -v USDT "$TMP/unit.log" | tail -n 3 | cut -c1-1500 | tee -a "$LOG"
printf '{"global_batch": 8, "micro_batch": 2, "seq_len": 256, "schedule": "1f1b", "recompute": "none", "precision": "fp32", "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 7], "devices": ["0/0/0"], "tp": 1}, {"layers": [7, 14], "devices": ["0/0/1"], "tp": 1}]}]}\n' > "$TMP/pp.json"
printf 'name: two-gpu\nnodes:\n  - {count: 1, gpus_per_node: 2, gpu: %s, intra_node: NVLink4, nic: IB-NDR}\n' "$GPU" > "$TMP/c2.yaml"
timeout 60 "${HP[@]}" run "$TMP/pp.json" --model gpt2-small --cluster "$TMP/c2.yaml" --scale tiny --no-emulation \
  --device cuda --steps 1 > "$TMP/refuse.log" 2>&1  # two ranks, one GPU: refused with one line, exit 2
say "two ranks on one GPU with --device cuda: rc $? (2 expected): $(grep -v USDT "$TMP/refuse.log" | tail -n 1)"
[ "${DO_CAL:-1}" = 1 ] || exit 0
t0=$(date +%s)
timeout ${CAL_TIMEOUT:-100} "${HP[@]}" calibrate --cluster "$TMP/c.yaml" --model gpt2-small --scale "$W1" --seq-len "$SEQ" \
  --precision fp32 --micro-batches 1,4 --no-links --no-tensor-parallel --device "$DEV" --out "$OUT/profile_${W1}.json" \
  > "$TMP/cal.log" 2>&1
say "calibrate rc $? in $(( $(date +%s) - t0 )) s"; grep -v USDT "$TMP/cal.log" | tail -n 6 | tee -a "$LOG"
[ "${DO_HOST:-1}" = 1 ] || exit 0
t0=$(date +%s)
timeout ${HOST_TIMEOUT:-90} python3 -m hetpart.experiments.bench_host_ops --recompute-host --device "$DEV" \
  --out "$OUT/recompute_host_cuda.json" > "$TMP/host.log" 2>&1
say "recompute-host rc $? in $(( $(date +%s) - t0 )) s"; grep -v USDT "$TMP/host.log" | tail -n 8 | tee -a "$LOG"
[ "${DO_ALLOC:-1}" = 1 ] || exit 0
t0=$(date +%s)
timeout ${ALLOC_TIMEOUT:-150} python3 -m hetpart.experiments.bench_allocator --measure ${QUICK:+--quick} \
  --out "$OUT/allocator.json" > "$TMP/alloc.log" 2>&1
say "allocator rc $? in $(( $(date +%s) - t0 )) s"; grep -v USDT "$TMP/alloc.log" | tail -n 12 | tee -a "$LOG"
rm -rf "$TMP"
