#!/usr/bin/env bash
# A tiny mixture-of-experts GPT (DeepSpeed-MoE, Megatron-DeepSpeed's MoE flags) on the bundled
# corpus on 4 CPU ranks: DP=4, 4 experts in every other layer spread over EP=2 ranks, top-2
# routing (gloo, fp32, about a minute). TP=1: with TP>1 DeepSpeed's MoE gathers tokens in a way
# gloo refuses, so MoE with TP>1 needs CUDA ranks. Prints the total and the active parameter count,
# logs the load-balancing `moe loss`, saves expert files per EP rank; run again with a larger
# TRAIN_ITERS to resume.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=data/corpus_text_document
VOCAB=data/gpt2-vocab.json
MERGES=data/gpt2-merges.txt
CHECKPOINT_PATH=${CHECKPOINT_PATH:-checkpoints/gpt_moe_tiny}
TENSORBOARD_PATH=${TENSORBOARD_PATH:-output_dir/tensorboard_moe}
TRAIN_ITERS=${TRAIN_ITERS:-20}

if [ ! -f "$DATA.idx" ]; then  # written last by preprocess_data.py: present means complete
  python tools/preprocess_data.py --input data/corpus.jsonl --output-prefix data/corpus \
    --vocab-file "$VOCAB" --merge-file "$MERGES" --append-eod --workers 2
fi

export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
deepspeed --num_gpus 4 --master_port "${MASTER_PORT:-29500}" pretrain_gpt.py \
  --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --no-pipeline-parallel \
  --num-layers 4 --hidden-size 128 --num-attention-heads 4 \
  --seq-length 128 --max-position-embeddings 128 \
  --num-experts 4 --expert-interval 2 --topk 2 --moe-expert-parallel-size 2 \
  --moe-train-capacity-factor 1.0 --moe-eval-capacity-factor 1.0 --moe-min-capacity 4 --moe-loss-coeff 0.01 \
  --micro-batch-size 4 --global-batch-size 16 --train-iters "$TRAIN_ITERS" \
  --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 4 --lr-decay-iters 100 \
  --clip-grad 1.0 --weight-decay 0.1 --seed 42 \
  --data-path "$DATA" --vocab-file "$VOCAB" --merge-file "$MERGES" --split 949,50,1 \
  --log-interval 5 --eval-interval 10 --eval-iters 2 \
  --save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH" --save-interval 10 \
  --tensorboard-dir "$TENSORBOARD_PATH" \
  --deepspeed --deepspeed_config examples/ds_config_tiny_cpu.json \
  "$@"
