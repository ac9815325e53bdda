#!/usr/bin/env bash
# A tiny BLOOM-style model on the bundled corpus, TP=2 x PP=2 on 4 CPU ranks (gloo, fp32):
# ALiBi positions (no learned table; each TP rank biases its own heads with their slopes), a
# LayerNorm after the word embedding, GeLU MLP, tied output layer. BigScience's flags.
#   bash examples/pretrain_gpt_bloom_cpu.sh                 # iterations 1..40, saves at 20 and 40
#   TRAIN_ITERS=60 bash examples/pretrain_gpt_bloom_cpu.sh  # loads iteration 40, trains to 60
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=data/corpus_text_document
VOCAB=data/gpt2-vocab.json
MERGES=data/gpt2-merges.txt
CHECKPOINT_PATH=${CHECKPOINT_PATH:-checkpoints/gpt_bloom_tiny}
TENSORBOARD_PATH=${TENSORBOARD_PATH:-output_dir/tensorboard_bloom}
TRAIN_ITERS=${TRAIN_ITERS:-40}

if [ ! -f "$DATA.idx" ]; then  # written last by preprocess_data.py: present means complete
  python tools/preprocess_data.py --input data/corpus.jsonl --output-prefix data/corpus \
    --vocab-file "$VOCAB" --merge-file "$MERGES" --append-eod --workers 2
fi

export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
deepspeed --num_gpus 4 --master_port "${MASTER_PORT:-29500}" pretrain_gpt.py \
  --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \
  --num-layers 4 --hidden-size 128 --num-attention-heads 8 \
  --seq-length 128 --max-position-embeddings 128 \
  --position-embedding-type alibi --embed-layernorm \
  --micro-batch-size 4 --global-batch-size 16 --train-iters "$TRAIN_ITERS" \
  --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 4 --lr-decay-iters 100 \
  --clip-grad 1.0 --weight-decay 0.1 --seed 42 \
  --data-path "$DATA" --vocab-file "$VOCAB" --merge-file "$MERGES" --split 949,50,1 \
  --log-interval 5 --eval-interval 20 --eval-iters 2 \
  --save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH" --save-interval 20 \
  --tensorboard-dir "$TENSORBOARD_PATH" --log-timers-to-tensorboard --log-batch-size-to-tensorboard \
  --log-validation-ppl-to-tensorboard \
  --deepspeed --deepspeed_config examples/ds_config_tiny_cpu.json \
  "$@"
