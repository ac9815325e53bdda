#!/usr/bin/env bash
# A tiny LLaMA-style model on the bundled corpus, TP=2 x PP=2 on 4 CPU ranks (gloo, fp32): the
# quickstart (pretrain_gpt_tiny_cpu.sh) with the variant's flags, which are the Microsoft
# Megatron-DeepSpeed fork's: rotary positions (no learned table), SwiGLU MLP (ffn size: the fork's
# --swiglu default, int(8h/3/64)*64 = 320 for h 128), RMSNorm, grouped-query attention (8 query
# heads sharing 2 key/value heads; each TP rank holds 1 kv head and its 4 query heads), an untied
# output layer and no linear biases. Later flags win, so these override the quickstart's.
#   bash examples/pretrain_gpt_llama_cpu.sh                 # iterations 1..40, saves at 20 and 40
#   TRAIN_ITERS=60 bash examples/pretrain_gpt_llama_cpu.sh  # loads iteration 40, trains to 60
set -euo pipefail
cd "$(dirname "$0")/.."
export CHECKPOINT_PATH=${CHECKPOINT_PATH:-checkpoints/gpt_llama_tiny}
export TENSORBOARD_PATH=${TENSORBOARD_PATH:-output_dir/tensorboard_llama}
exec bash examples/pretrain_gpt_tiny_cpu.sh \
  --num-attention-heads 8 --num-key-value-heads 2 \
  --use-rotary-position-embeddings --no-position-embedding --swiglu --normalization rmsnorm \
  --untie-embeddings-and-output-weights --disable-bias-linear \
  "$@"
