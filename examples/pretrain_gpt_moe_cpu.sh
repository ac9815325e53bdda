#!/usr/bin/env bash
# A tiny mixture-of-experts GPT (DeepSpeed-MoE, Megatron-DeepSpeed's MoE flags) on the bundled
# corpus on 4 CPU ranks: the quickstart (pretrain_gpt_tiny_cpu.sh) with MoE's flags, which override
# its layout (later flags win): TP=2 x DP=2 on the pipeline engine (PP=1), 4 experts in every
# other layer spread over EP=2 ranks, top-2 routing (gloo, fp32, about a minute). Prints the total
# and the active parameter count, logs the load-balancing `moe loss`, saves expert files per EP
# rank; run again with a larger TRAIN_ITERS to resume.
set -euo pipefail
cd "$(dirname "$0")/.."
export CHECKPOINT_PATH=${CHECKPOINT_PATH:-checkpoints/gpt_moe_tiny}
export TENSORBOARD_PATH=${TENSORBOARD_PATH:-output_dir/tensorboard_moe}
export TRAIN_ITERS=${TRAIN_ITERS:-20}
exec bash examples/pretrain_gpt_tiny_cpu.sh \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 \
  --num-experts 4 --expert-interval 2 --topk 2 --moe-expert-parallel-size 2 \
  --moe-train-capacity-factor 1.0 --moe-eval-capacity-factor 1.0 --moe-min-capacity 4 --moe-loss-coeff 0.01 \
  --eval-interval 10 --save-interval 10 \
  "$@"
