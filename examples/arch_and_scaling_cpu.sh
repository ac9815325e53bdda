#!/usr/bin/env bash
# Which architecture reaches the lower loss at equal compute? Trains the tiny GPT-2, BLOOM-style
# (ALiBi, embedding LayerNorm) and LLaMA-style (rotary, SwiGLU, RMSNorm, grouped-query attention,
# untied, no biases) models of the quickstart on the bundled corpus, one CPU rank each, with the
# same budget of gigaflos (6 x non-embedding N x tokens): each run's --train-samples follows from
# its exact N (tools/param_count.py), so a smaller model sees more tokens. Then draws the curves
# and fits L(C) = a C^-alpha + L_inf to each (tools/compare_runs.py; pip install -e ".[plots]").
#   bash examples/arch_and_scaling_cpu.sh        # 400 gigaflos per run: about 3 minutes of CPU time
#   PICTURE=docs/arch_and_scaling.png bash examples/arch_and_scaling_cpu.sh   # the README's picture
#   GIGAFLOS=100 PICTURE=/tmp/quick.png bash examples/arch_and_scaling_cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."

GIGAFLOS=${GIGAFLOS:-400}     # the compute budget of every run
OUT=${OUT:-output_dir/arch_and_scaling}
PICTURE=${PICTURE:-$OUT/arch_and_scaling.png}
DATA=data/corpus_text_document
VOCAB=data/gpt2-vocab.json
MERGES=data/gpt2-merges.txt
SEQ=128
GBS=16  # examples/ds_config_tiny_cpu.json's train_batch_size
MODEL=(--num-layers 4 --hidden-size 128 --num-attention-heads 8 --seq-length "$SEQ" --max-position-embeddings "$SEQ"
       --vocab-file "$VOCAB" --merge-file "$MERGES")
NAMES=(gpt2 bloom llama)
variant_flags() {
  case $1 in
    gpt2) ;;
    bloom) echo --position-embedding-type alibi --embed-layernorm ;;
    llama) echo --num-key-value-heads 2 --use-rotary-position-embeddings --no-position-embedding --swiglu \
                --normalization rmsnorm --untie-embeddings-and-output-weights --disable-bias-linear ;;
  esac
}
minutes() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

if [ ! -f "$DATA.idx" ]; then  # written last by preprocess_data.py: present means complete
  python tools/preprocess_data.py --input data/corpus.jsonl --output-prefix data/corpus \
    --vocab-file "$VOCAB" --merge-file "$MERGES" --append-eod --workers 2
fi
mkdir -p "$OUT" "$(dirname "$PICTURE")"

# equal compute: samples = budget / (6 x seq x N without embeddings), to the nearest global batch
declare -A SAMPLES
for name in "${NAMES[@]}"; do
  # shellcheck disable=SC2046  # the variant's flags are separate words
  n=$(python tools/param_count.py "${MODEL[@]}" $(variant_flags "$name") \
      | sed -n 's/^parameters without embeddings: //p' | tr -d ,)
  SAMPLES[$name]=$(( (GIGAFLOS * 1000000000 / (6 * SEQ * n) + GBS / 2) / GBS * GBS ))
  echo "$name: $n parameters without embeddings -> ${SAMPLES[$name]} samples for $GIGAFLOS gigaflos"
done

export DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
start=$(date +%s)
done_iterations=0
total_iterations=0
for name in "${NAMES[@]}"; do total_iterations=$(( total_iterations + SAMPLES[$name] / GBS )); done
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null' EXIT
for i in "${!NAMES[@]}"; do
  name=${NAMES[$i]}
  samples=${SAMPLES[$name]}
  log="$OUT/$name.log"
  rm -rf "${OUT:?}/$name"  # a rerun starts its curves afresh
  # shellcheck disable=SC2046
  deepspeed --num_gpus 1 --master_port "${MASTER_PORT:-29500}" pretrain_gpt.py "${MODEL[@]}" $(variant_flags "$name") \
    --micro-batch-size 4 --global-batch-size "$GBS" --train-samples "$samples" \
    --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 \
    --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-samples $(( samples / 10 )) \
    --lr-decay-samples "$samples" --clip-grad 1.0 --weight-decay 0.1 --seed 42 \
    --data-path "$DATA" --split 949,50,1 --log-interval 1 --eval-interval 5 --eval-iters 1 \
    --tensorboard-dir "$OUT/$name" \
    --deepspeed --deepspeed_config examples/ds_config_tiny_cpu.json >"$log" 2>&1 &
  pid=$!
  # progress every 10 s: which run of how many, its iteration, and an ETA from the iterations per
  # second so far (checked every second, so that the next run starts as soon as this one ends)
  polls=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    polls=$(( polls + 1 ))
    [ $(( polls % 10 )) -eq 0 ] || continue
    it=$( (grep -o ' iteration *[0-9]*/' "$log" || true) | tail -1 | tr -dc 0-9)
    it=${it:-0}  # still starting
    elapsed=$(( $(date +%s) - start ))
    left=$(( total_iterations - done_iterations - it ))
    eta=$([ $(( done_iterations + it )) -gt 0 ] && minutes $(( elapsed * left / (done_iterations + it) )) || echo "?")
    echo "[run $(( i + 1 ))/${#NAMES[@]} $name] iteration $it/$(( samples / GBS )) | elapsed $(minutes "$elapsed") | ETA $eta"
  done
  wait "$pid" || { echo "run $name failed; the end of $log:"; tail -20 "$log"; exit 1; }
  pid=
  done_iterations=$(( done_iterations + samples / GBS ))
  grep -h "validation loss at the end of training" "$log" | sed "s/^/[$name] /"
done

python tools/compare_runs.py "$OUT/gpt2" "$OUT/bloom" "$OUT/llama" --output "$PICTURE" \
  --title "tiny GPT-2 / BLOOM / LLaMA variants at $GIGAFLOS gigaflos each, bundled corpus" \
  --fit --fit-min-gigaflos $(( GIGAFLOS / 5 ))
