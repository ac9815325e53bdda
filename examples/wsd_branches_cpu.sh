#!/usr/bin/env bash
# Two training horizons from one run (Megatron-LM's WSD schedule, docs/long-runs.md): a tiny GPT on
# the bundled corpus, one CPU rank, trains its warm-up and stable phase and saves; two cool-downs
# then branch off that one stable-phase checkpoint (a short and a long horizon, each with its own
# --train-iters / --lr-decay-iters and --override-opt_param-scheduler), and tools/compare_runs.py
# draws both (pip install -e ".[plots]"). Each branch's curve starts with the stable phase's.
#   bash examples/wsd_branches_cpu.sh                    # stable to 10, cool-downs to 16 and to 24
#   STABLE=20 SHORT=30 LONG=50 bash examples/wsd_branches_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."

STABLE=${STABLE:-10}    # the stable-phase checkpoint both branches start from
SHORT=${SHORT:-16}      # the horizons: each cools down over its last COOLDOWN iterations
LONG=${LONG:-24}
COOLDOWN=${COOLDOWN:-6}
OUT=${OUT:-output_dir/wsd_branches}
PICTURE=${PICTURE:-$OUT/wsd_branches.png}
DATA=data/corpus_text_document
VOCAB=data/gpt2-vocab.json
MERGES=data/gpt2-merges.txt

if [ ! -f "$DATA.idx" ]; then  # written last by preprocess_data.py: present means complete
  python tools/preprocess_data.py --input data/corpus.jsonl --output-prefix data/corpus \
    --vocab-file "$VOCAB" --merge-file "$MERGES" --append-eod --workers 2
fi
rm -rf "${OUT:?}"  # a rerun starts afresh
mkdir -p "$OUT" "$(dirname "$PICTURE")"

export DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
train() {  # train NAME HORIZON [flags...]: WSD over HORIZON iterations, its last COOLDOWN the cool-down
  local name=$1 horizon=$2
  shift 2
  deepspeed --num_gpus 1 --master_port "${MASTER_PORT:-29500}" pretrain_gpt.py \
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 \
    --micro-batch-size 4 --global-batch-size 16 --train-iters "$horizon" --lr-decay-iters "$horizon" \
    --optimizer adam --lr 3e-3 --min-lr 3e-4 --lr-warmup-iters 2 \
    --lr-decay-style WSD --lr-wsd-decay-style minus_sqrt --lr-wsd-decay-iters "$COOLDOWN" \
    --clip-grad 1.0 --weight-decay 0.1 --seed 42 \
    --data-path "$DATA" --vocab-file "$VOCAB" --merge-file "$MERGES" --split 949,50,1 \
    --log-interval 1 --eval-interval 1000 --eval-iters 1 --log-progress \
    --tensorboard-dir "$OUT/$name" \
    --deepspeed --deepspeed_config examples/ds_config_tiny_cpu.json "$@" >"$OUT/$name.log" 2>&1 \
    || { echo "run $name failed; the end of $OUT/$name.log:"; tail -20 "$OUT/$name.log"; exit 1; }
  grep -h "validation loss at the end of training" "$OUT/$name.log" | sed "s/^/[$name] /" || true
}

# the stable phase: the long horizon's schedule, stopped (and saved) at STABLE, before any cool-down
train stable "$LONG" --save "$OUT/stable_ckpt" --exit-interval "$STABLE"
echo "[stable] saved at iteration $STABLE: $(tail -1 "$OUT/stable_ckpt/progress.txt" | cut -f5-)"
for branch in "short:$SHORT" "long:$LONG"; do
  name=${branch%%:*} horizon=${branch#*:}
  mkdir -p "$OUT/$name" && cp "$OUT"/stable/events.out.tfevents.* "$OUT/$name/"  # the curve from iteration 1
  train "$name" "$horizon" --load "$OUT/stable_ckpt" --save "$OUT/${name}_ckpt" --override-opt_param-scheduler
  echo "[$name] cooled down to iteration $horizon: $(tail -1 "$OUT/${name}_ckpt/progress.txt" | cut -f5-)"
done

python tools/compare_runs.py "$OUT/short" "$OUT/long" --output "$PICTURE" \
  --title "WSD: two cool-downs branched at iteration $STABLE (tiny GPT, bundled corpus)"
