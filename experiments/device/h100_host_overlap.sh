#!/usr/bin/env bash
# One lent-GPU session (issue 9): host dispatch against device work, tensor-parallel shards and head widths
# (bench_host_overlap --measure), then four more real training steps on the GPU (hetpart run --no-emulation,
# held-out rows for experiments/data/h100_runs.jsonl). Run from the repository root on the device machine;
# writes under $OUT (or ./out). Needs torch with CUDA, transformers, typer, rich, pyyaml, scipy, networkx.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
for p in costmodel envs policies runtime experiments; do ln -sfn ../$p hetpart/$p; done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
HP=(python3 -c 'import sys; from hetpart.cli.app import _entry; sys.argv[0] = "hetpart"; _entry()')
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv | tee "$OUT/gpu.txt"
timeout ${OVERLAP_TIMEOUT:-330} python3 -m hetpart.experiments.bench_host_overlap --measure ${QUICK:+--quick} \
  --out "$OUT/h100_host_overlap.json" > "$OUT/overlap.log" 2>&1; echo "overlap rc $?"
grep -v USDT "$OUT/overlap.log" | tail -n 40
printf 'name: one-h100\nnodes:\n  - {count: 1, gpus_per_node: 1, gpu: H100-80GB, intra_node: NVLink4, nic: IB-NDR}\n' > "$OUT/c.yaml"
for H in ${RUN_WIDTHS:-1536 2048}; do
  for MB in 1 4; do
    printf '{"global_batch": 16, "micro_batch": %d, "seq_len": 512, "schedule": "1f1b", "recompute": "none", "precision": "fp32", "replicas": [{"batch_share": 1.0, "stages": [{"layers": [0, 14], "devices": ["0/0/0"], "tp": 1}]}]}\n' $MB > "$OUT/p.json"
    timeout ${RUN_TIMEOUT:-300} "${HP[@]}" run "$OUT/p.json" --model gpt2-small --cluster "$OUT/c.yaml" --hidden-size $H --no-emulation \
      --steps 6 --warmup 2 --log-every 0 --out "$OUT/h100_runs_new.jsonl" > "$OUT/run_${H}_${MB}.log" 2>&1
    echo "run h=$H mb=$MB rc $?"; tail -n 3 "$OUT/run_${H}_${MB}.log"
  done
done
