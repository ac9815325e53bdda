"""The one lines the forks' GPT scripts meet (issue 39 item 7) and the flag table's published
scripts' outcomes (tests/data/published_scripts/flag_table), shared by the unit test that
validates them and the integration test that runs them shrunk."""

# --- issue 39 item 7: the refusals the forks' GPT scripts meet, word for word ---------------------

ITEM_7 = [
    ({"--fp8-hybrid": None}, "--fp8-hybrid: FP8 training (Transformer Engine on a Hopper GPU) is not supported by "
                             "this trainer; use --bf16"),
    ({"--fp8-margin": 0}, "--fp8-margin: FP8 training (Transformer Engine on a Hopper GPU) is not supported by this "
                          "trainer; use --bf16"),
    ({"--num-layers-per-virtual-pipeline-stage": 2},
     "--num-layers-per-virtual-pipeline-stage: interleaved virtual pipeline stages (DeepSpeed's pipeline engine runs "
     "one stage per rank) is not supported by this trainer; drop the flag; --pipeline-model-parallel-size sets the "
     "stages"),
    ({"--use-distributed-optimizer": None}, "--use-distributed-optimizer: Megatron's distributed optimizer (ZeRO is "
                                            "the equivalent) is not supported by this trainer; use --zero-stage 1"),
    ({"--profile": "pt", "--profile_steps": "2,3"}, "--profile: the torch profiler is not supported by this "
                                                    "trainer; drop the flag (the log line has the iteration time)"),
    # Megatron-LM's spelling, a switch (examples/llama/train_llama3_8b_h100_fp8.sh)
    ({"--profile": None}, "--profile: the torch profiler is not supported by this trainer; drop the flag (the log "
                          "line has the iteration time)"),
    ({"--vision-pretraining": None}, "--vision-pretraining: a flag of vision (ViT, DINO, image classification / "
                                     "segmentation) models; this trainer is GPT pretraining (pretrain_gpt.py): drop "
                                     "the flag"),
]


UNRECOGNIZED = ("unrecognized arguments: {} (not flags of this trainer: check the spelling, or drop them; "
                "pretrain_gpt.py --help lists the flags it takes)")
PUBLISHED = {  # script -> its one line (None: it validates)
    # every flag known (W&B included); it stops where the script's own tokenizer file is missing here
    "argonne_llama2_wandb": "--tokenizer-model ./tmp/tokenizer.model: not a local file or directory; nothing is "
                            "downloaded here (no network): save the tokenizer to a directory first (e.g. "
                            "huggingface-cli download NAME --local-dir DIR) and pass DIR",
    "deepspeedai_gpt3_functional_test_vp2": ITEM_7[2][1],
    "megatron_lm_gpt3_175b": "--step-batch-size-schedule: Megatron-LM's batch-size schedule in tokens is not "
                             "supported by this trainer; use --rampup-batch-size",
    "megatron_lm_mixtral_8x7b": "argument --tokenizer-type: invalid choice: 'Llama2Tokenizer' (choose from "
                                "'GPT2BPETokenizer', 'NullTokenizer', 'PretrainedFromHF', 'HFTokenizer', "
                                "'GPTSentencePieceTokenizer')",
    # BigScience's prefix-LM experiment with --reset-attention-mask (its pretrain_prefix_lm.py's flags)
    "bigscience_tr6c_350M_prefix_lm_reset_attention": "--loss-on-targets-only: a flag of prefix-LM / multitask "
                                                      "finetuning (BigScience) models; this trainer is GPT "
                                                      "pretraining (pretrain_gpt.py): drop the flag",
    # Megatron-LM's newer scripts (d98e8a64): each stops at the parser, before its issue-39 flags matter
    "megatron_lm_deepseek_v3_fsdp_wandb": "argument --tokenizer-type: invalid choice: 'HuggingFaceTokenizer' "
                                          "(choose from 'GPT2BPETokenizer', 'NullTokenizer', 'PretrainedFromHF', "
                                          "'HFTokenizer', 'GPTSentencePieceTokenizer')",
    "megatron_lm_gpt3_15b_8t_release": UNRECOGNIZED.format(
        "--no-rope-fusion, --save-retain-interval, --async-save, --use-persistent-ckpt-worker"),
    "megatron_lm_gpt3_gdn_tp2": UNRECOGNIZED.format(
        "--no-rope-fusion, --apply-wd-to-qk-layernorm, --attention-output-gate, --experimental-attention-variant, "
        "--linear-attention-freq, --linear-conv-kernel-dim, --linear-key-head-dim, --linear-value-head-dim, "
        "--linear-num-key-heads, --linear-num-value-heads, --moe-ffn-hidden-size, "
        "--moe-shared-expert-intermediate-size, --moe-shared-expert-gate, --moe-router-dtype, --deterministic-mode"),
    "megatron_lm_gptoss_20b": UNRECOGNIZED.format(
        "--no-rope-fusion, --rope-type, --export-force-local-attention, --quick-geglu, --glu-linear-offset, "
        "--softmax-type, --window-attn-skip-freq, --activation-func-clamp-value, --window-size, --enable-gpt-oss, "
        "--moe-ffn-hidden-size, --moe-router-dtype, --moe-z-loss-coeff, --moe-permute-fusion, "
        "--disable-bf16-reduced-precision-matmul, --moe-per-layer-logging"),
    "megatron_lm_llama3_8b_fp8": "--decoupled-lr: a separate learning rate for the embedding and output layers is "
                                 "not supported by this trainer; drop the flag",
    "megatron_lm_llama3_8b_fsdp_fp8": UNRECOGNIZED.format(
        "--use-megatron-fsdp, --data-parallel-sharding-strategy, --init-model-with-meta-device, --use-nccl-ub, "
        "--fsdp-double-buffer, --fsdp-manual-registration, --logging-level"),
}
# the world size each script is validated at (its layout and batch sizes must fit it); default 128
WORLD = {"argonne_llama2_wandb": 16,  # TP 2 x PP 2 x DP 4: 32 = 4 micro-batches x 4 x 2 accumulation
         "megatron_lm_llama3_8b_fp8": 8, "megatron_lm_llama3_8b_fsdp_fp8": 8,  # one node of 8 GPUs
         "megatron_lm_gptoss_20b": 8, "megatron_lm_gpt3_gdn_tp2": 8,
         "bigscience_tr6c_350M_prefix_lm_reset_attention": 16,  # 4 nodes of 4 GPUs, TP 4
         "megatron_lm_deepseek_v3_fsdp_wandb": 64, "megatron_lm_gpt3_15b_8t_release": 64}
