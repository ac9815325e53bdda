#!/usr/bin/env bash
# The launch script from the discussion that started this project (8 layers, hidden 512, seq 1024,
# GPT-2 vocab: the "52M model"), with its layout as variables. Expected startup lines:
#   TP=1, any PP: estimated model parameters: 0.051500032
#   TP=2, any PP: estimated model parameters: 0.051565568   (vocab padded to 50432)
#   always:       estimated model parameters without embeddings: 0.025220096
# On GPUs it trains in fp16 as the original did; without CUDA it falls back to fp32 on CPU ranks.
# Without DATA_PATH it trains on --mock-data with the GPT-2 vocab size, so the counts above hold.
#   N_GPUS=2 TP_SIZE=1 PP_SIZE=2 bash examples/pretrain_gpt_seed_52m.sh
set -euo pipefail
cd "$(dirname "$0")/.."

N_GPUS=${N_GPUS:-2}
TP_SIZE=${TP_SIZE:-2}
PP_SIZE=${PP_SIZE:-1}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-1}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-16}
ZERO_STAGE=${ZERO_STAGE:-1}
TRAIN_SAMPLES=${TRAIN_SAMPLES:-100}
EXIT_INTERVAL=${EXIT_INTERVAL:-200}
CHECKPOINT_PATH=${CHECKPOINT_PATH:-checkpoints/gpt2_52m}
TENSORBOARD_PATH=${TENSORBOARD_PATH:-output_dir/tensorboard_52m}

NLAYERS=8
NHIDDEN=512
NHEADS=8
SEQ_LEN=1024
VOCAB_SIZE=50257

if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  PRECISION_ARGS="--fp16"
  FP16_CONFIG='"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1, "initial_scale_power": 12},'
  BACKEND=nccl
else
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  PRECISION_ARGS=""   # fp32: --fp16 needs CUDA
  FP16_CONFIG=""
  BACKEND=gloo
fi

if [ -n "${DATA_PATH:-}" ]; then
  DATA_ARGS="--data-path $DATA_PATH --vocab-file ${VOCAB_FILE:?set VOCAB_FILE} --merge-file ${MERGE_FILE:?set MERGE_FILE}"
else
  DATA_ARGS="--mock-data --vocab-size $VOCAB_SIZE"
fi

config_json=$(mktemp --suffix=.json)
trap 'rm -f "$config_json"' EXIT
cat <<EOT > "$config_json"
{
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "train_batch_size": $GLOBAL_BATCH_SIZE,
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": $ZERO_STAGE},
  $FP16_CONFIG
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
EOT

# the seed run's pipeline split (4 | 4 layers at PP=2: DeepSpeed's type:transformer, both forks'
# default), so the per-stage numbers compare with its log; this project's default balances FLOPs
PARTITION_ARGS="--pp-partition-method type:transformer"

deepspeed --num_gpus "$N_GPUS" --master_port "${MASTER_PORT:-6777}" pretrain_gpt.py \
  --tensor-model-parallel-size "$TP_SIZE" --pipeline-model-parallel-size "$PP_SIZE" \
  --distributed-backend $BACKEND $PARTITION_ARGS \
  --num-layers $NLAYERS --hidden-size $NHIDDEN --num-attention-heads $NHEADS \
  --seq-length $SEQ_LEN --max-position-embeddings $SEQ_LEN \
  --micro-batch-size "$MICRO_BATCH_SIZE" --rampup-batch-size 2 2 1_000 --global-batch-size "$GLOBAL_BATCH_SIZE" \
  --train-samples "$TRAIN_SAMPLES" \
  --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 \
  --lr 1e-4 --lr-warmup-samples 5 --clip-grad 1.0 --weight-decay 1e-1 \
  $PRECISION_ARGS --partition-activations --seed 42 $DATA_ARGS \
  --exit-interval "$EXIT_INTERVAL" --log-interval 10 --save-interval 50 --eval-interval 100 --eval-iters 10 \
  --checkpoint-activations \
  --save "$CHECKPOINT_PATH" --load "$CHECKPOINT_PATH" \
  --tensorboard-dir "$TENSORBOARD_PATH" --tensorboard-queue-size 5 \
  --log-timers-to-tensorboard --log-batch-size-to-tensorboard --log-validation-ppl-to-tensorboard \
  --deepspeed --deepspeed_config "$config_json" --zero-stage "$ZERO_STAGE" --deepspeed-activation-checkpointing \
  "$@"
