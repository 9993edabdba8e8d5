#!/usr/bin/env bash
# One lent-GPU session (issues 9 and 10), prepared 2026-11-27 without a GPU; about 6-8 minutes on an H100:
#  1. the caching allocator's reserve over what tensors hold, at a pipeline stage's peak, default allocator and
#     expandable segments (bench_allocator --measure): evidence for memory.FRAGMENTATION_FRACTION (ASSUMED 5%),
#     on which the Llama 3 405B published layout's fit turns;
#  2. torch.utils.checkpoint's host cost on CUDA (bench_host_ops --recompute-host --device cuda), against the
#     CPU's compute.RECOMPUTE_HOST (CUDA also saves and restores the device's RNG state);
#  3. three real training steps runs (hetpart run --no-emulation) at one width with recompute none, selective and
#     full: held-out rows for experiments/data/h100_runs.jsonl, the first on a GPU with the runtime's selective
#     recomputation (the attention sublayer, priced since 2026-11-27 from a CPU measurement only).
# Run from the repository root on the device machine; writes under $OUT (or ./out).
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for p in costmodel envs policies runtime experiments; do ln -sfn ../$p hetpart/$p; done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
HP=(python3 -c 'import sys; from hetpart.cli.app import _entry; sys.argv[0] = "hetpart"; _entry()')
nvidia-smi --query-gpu=name,memory.total,clocks.sm,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
timeout ${ALLOC_TIMEOUT:-240} python3 -m hetpart.experiments.bench_allocator --measure ${QUICK:+--quick} \
  --out "$OUT/allocator.json" > "$OUT/allocator.log" 2>&1; echo "allocator rc $?"; tail -n 6 "$OUT/allocator.log"
timeout ${HOST_TIMEOUT:-120} python3 -m hetpart.experiments.bench_host_ops --recompute-host --device cuda \
  --out "$OUT/recompute_host_cuda.json" > "$OUT/recompute_host.log" 2>&1; echo "recompute-host rc $?"
tail -n 3 "$OUT/recompute_host.log"
printf 'name: one-gpu\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: H100-80GB, intra_node: NVLink4, nic: IB-NDR}\n' > "$OUT/c.yaml"
H=${RUN_WIDTH:-1024}
for RC in none selective full; do
  printf '{"global_batch": 16, "micro_batch": 4, "seq_len": 512, "schedule": "1f1b", "recompute": "%s", "precision": "fp32", "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 14], "devices": ["0/0/0"], "tp": 1}]}]}\n' $RC > "$OUT/p_$RC.json"
  timeout ${RUN_TIMEOUT:-150} "${HP[@]}" run "$OUT/p_$RC.json" --model gpt2-small --cluster "$OUT/c.yaml" --hidden-size $H \
    --no-emulation --steps 6 --warmup 2 --log-every 0 --out "$OUT/h100_runs_new.jsonl" > "$OUT/run_$RC.log" 2>&1
  echo "run h=$H recompute=$RC rc $?"; tail -n 2 "$OUT/run_$RC.log"
done
