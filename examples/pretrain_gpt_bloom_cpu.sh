#!/usr/bin/env bash
# A tiny BLOOM-style model on the bundled corpus, TP=2 x PP=2 on 4 CPU ranks (gloo, fp32): the
# quickstart (pretrain_gpt_tiny_cpu.sh) with BigScience's variant flags: ALiBi positions (no
# learned table; each TP rank biases its own heads with their slopes), a LayerNorm after the word
# embedding, GeLU MLP, tied output layer. Later flags win, so these override the quickstart's.
#   bash examples/pretrain_gpt_bloom_cpu.sh                 # iterations 1..40, saves at 20 and 40
#   TRAIN_ITERS=60 bash examples/pretrain_gpt_bloom_cpu.sh  # loads iteration 40, trains to 60
set -euo pipefail
cd "$(dirname "$0")/.."
export CHECKPOINT_PATH=${CHECKPOINT_PATH:-checkpoints/gpt_bloom_tiny}
export TENSORBOARD_PATH=${TENSORBOARD_PATH:-output_dir/tensorboard_bloom}
exec bash examples/pretrain_gpt_tiny_cpu.sh --num-attention-heads 8 --position-embedding-type alibi --embed-layernorm "$@"
