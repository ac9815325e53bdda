"""Every validation rule behind README's flag table, through pretrain_gpt.py's own entry point
(in-process, so the table stays fast): exit code 2, one `pretrain_gpt.py: error:` line naming
the flag, no traceback, and the model never built. tests/integration/test_arguments.py keeps the one real
command-line run."""
import json
import os

import pytest

from tests.support.flag_runs import MERGES, REAL_DATA, SAMPLES, check_one_line, flags

# Written out by hand (not generated from megatron/config/arguments.py's rule tuples, so a flag dropped
# from those tuples fails here): a bad value of each size, count, interval and fraction flag, and
# the error line it must give. Integer flags echo "0", float flags "0.0".
_TIED = {"--train-samples": SAMPLES, "--lr-decay-samples": SAMPLES, "--lr-warmup-samples": SAMPLES}
SINGLE_VALUE_TABLE = [
    ("--micro-batch-size", 0, "--micro-batch-size 0 must be positive"),
    ("--global-batch-size", 0, "--global-batch-size 0 must be positive"),
    ("--train-iters", 0, "--train-iters 0 must be positive"),
    ("--train-samples", 0, "--train-samples 0 must be positive"),
    ("--exit-interval", 0, "--exit-interval 0 must be positive"),
    ("--exit-duration-in-mins", 0, "--exit-duration-in-mins 0.0 must be positive"),
    ("--checkpoint-num-layers", 0, "--checkpoint-num-layers 0 must be positive"),
    ("--lr-decay-iters", 0, "--lr-decay-iters 0 must be positive"),
    ("--lr-decay-samples", 0, "--lr-decay-samples 0 must be positive"),
    ("--save-interval", 0, "--save-interval 0 must be positive"),
    ("--eval-interval", 0, "--eval-interval 0 must be positive"),
    ("--log-interval", 0, "--log-interval 0 must be positive"),
    ("--tensorboard-queue-size", 0, "--tensorboard-queue-size 0 must be positive"),
    ("--tensorboard-log-interval", 0, "--tensorboard-log-interval 0 must be positive"),
    ("--adam-eps", 0, "--adam-eps 0.0 must be positive"),
    ("--layernorm-epsilon", 0, "--layernorm-epsilon 0.0 must be positive"),
    ("--init-method-std", 0, "--init-method-std 0.0 must be positive"),
    ("--loss-scale", 0, "--loss-scale 0.0 must be positive"),
    ("--initial-loss-scale", 0, "--initial-loss-scale 0.0 must be positive"),
    ("--min-loss-scale", 0, "--min-loss-scale 0.0 must be positive"),
    ("--loss-scale-window", 0, "--loss-scale-window 0.0 must be positive"),
    ("--hysteresis", 0, "--hysteresis 0 must be positive"),
    ("--lr", -1, "--lr -1.0 must be >= 0"),
    ("--min-lr", -1, "--min-lr -1.0 must be >= 0"),
    ("--lr-warmup-iters", -1, "--lr-warmup-iters -1 must be >= 0"),
    ("--lr-warmup-samples", -1, "--lr-warmup-samples -1 must be >= 0"),
    ("--eval-iters", -1, "--eval-iters -1 must be >= 0"),
    ("--num-workers", -1, "--num-workers -1 must be >= 0"),
    ("--weight-decay", -1, "--weight-decay -1.0 must be >= 0"),
    ("--clip-grad", -1, "--clip-grad -1.0 must be >= 0"),
    ("--seed", -1, "--seed -1 must be >= 0"),
    ("--zero-stage", -1, "--zero-stage -1 must be >= 0"),
    ("--hidden-dropout", 1.5, "--hidden-dropout 1.5 must be in [0, 1]"),
    ("--attention-dropout", 1.5, "--attention-dropout 1.5 must be in [0, 1]"),
    ("--lr-warmup-fraction", 1.5, "--lr-warmup-fraction 1.5 must be in [0, 1]"),
    ("--sgd-momentum", 1.5, "--sgd-momentum 1.5 must be in [0, 1]"),
    ("--adam-beta1", 1, "--adam-beta1 1.0 must be in [0, 1)"),  # torch's Adam refuses 1.0
    ("--adam-beta2", 1, "--adam-beta2 1.0 must be in [0, 1)"),
]
SINGLE_VALUE_RULES = [pytest.param({**_TIED.get(flag, {}), flag: value}, 1, message, id=f"{flag} {value}")
                      for flag, value, message in SINGLE_VALUE_TABLE]
SHAPE_RULES = [pytest.param({flag: 0}, 1, flag, id=f"{flag} 0")
               for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                            "--ffn-hidden-size", "--max-position-embeddings", "--make-vocab-size-divisible-by",
                            "--vocab-size", "--tensor-model-parallel-size", "--pipeline-model-parallel-size")]
SHAPE_RULES += [pytest.param({flag: "drop"}, 1, flag, id=f"{flag} missing")
                for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length")]


def param(changes, world, flag, name):
    return pytest.param(changes, world, flag, id=name)


COMBINATION_RULES = [
    param({"--micro-batch-size": "drop"}, 1, "--micro-batch-size", "micro batch missing"),
    param({"--lr": "drop"}, 1, "--lr", "lr missing"),
    param({"--seed": 2 ** 32}, 1, "--seed", "seed beyond numpy"),
    param({"--zero-stage": 4}, 1, "--zero-stage", "zero stage 4"),
    param({"--initial-loss-scale": 1000}, 1, "--initial-loss-scale", "loss scale not a power of 2"),
    param({"--min-lr": 0.1}, 1, "--min-lr", "min lr above lr"),
    param({"--tensor-model-parallel-size": 3}, 3, "--num-attention-heads", "heads vs tp"),
    param({"--hidden-size": 66}, 1, "--hidden-size", "hidden vs heads"),
    param({"--ffn-hidden-size": 255, "--tensor-model-parallel-size": 2}, 2, "--ffn-hidden-size", "ffn vs tp"),
    param({"--pipeline-model-parallel-size": 8}, 8, "--num-layers", "layers vs pp"),
    param({"--seq-length": 64}, 1, "--seq-length", "seq beyond positions"),
    param({"--tensor-model-parallel-size": 2}, 3, "--tensor-model-parallel-size", "world size vs tp x pp"),
    param({"--no-pipeline-parallel": None, "--pipeline-model-parallel-size": 2}, 2, "--no-pipeline-parallel",
          "no pipeline with pp"),
    param({"--optimizer": "lamb"}, 1, "--optimizer", "optimizer"),
    param({"--global-batch-size": 6}, 4, "--global-batch-size", "global batch vs micro x dp"),
    param({**SAMPLES, "--rampup-batch-size": [2, 2]}, 1, "--rampup-batch-size", "rampup two values"),
    param({**SAMPLES, "--rampup-batch-size": ["two", 2, 100]}, 1, "--rampup-batch-size", "rampup not a number"),
    param({**SAMPLES, "--rampup-batch-size": [2, 0, 100]}, 1, "--rampup-batch-size", "rampup zero increment"),
    param({**SAMPLES, "--rampup-batch-size": [2, 2, 0]}, 1, "--rampup-batch-size", "rampup zero samples"),
    param({**SAMPLES, "--rampup-batch-size": [16, 2, 100]}, 1, "--rampup-batch-size", "rampup start above batch"),
    param({**SAMPLES, "--rampup-batch-size": [4, 3, 100]}, 1, "--rampup-batch-size", "rampup increment"),
    param({**SAMPLES, "--rampup-batch-size": [2, 2, 100]}, 2, "--rampup-batch-size", "rampup vs micro x dp"),
    param({"--rampup-batch-size": [2, 2, 100]}, 1, "--rampup-batch-size", "rampup needs samples"),
    param({"--train-samples": 100}, 1, "--train-iters", "iters and samples"),
    param({"--train-iters": "drop"}, 1, "--train-iters", "no length"),
    param({"--lr-warmup-samples": 8}, 1, "--train-iters", "iters with warmup samples"),
    param({**SAMPLES, "--lr-decay-iters": 8}, 1, "--train-samples", "samples with decay iters"),
    param({"--lr-warmup-fraction": 0.1, "--lr-warmup-iters": 2}, 1, "--lr-warmup-fraction", "two warmups"),
    param({"--fp16": None, "--bf16": None}, 1, "--fp16", "fp16 and bf16"),
    param({"--fp16": None}, 1, "--fp16", "fp16 on cpu"),
    param({"--checkpoint-activations": None, "--deepspeed-activation-checkpointing": None,
           "--contigious-checkpointing": None}, 1, "--contigious-checkpointing", "contiguous without partition"),
    param({"--vocab-file": "nope.json"}, 1, "--vocab-file", "vocab file missing"),
    param({"--merge-file": "nope.txt"}, 1, "--merge-file", "merge file missing"),
    param({"--vocab-size": "drop"}, 1, "--vocab-size", "mock data without vocab"),
    param({**REAL_DATA}, 1, "--data-path", "data path missing"),
    param({**REAL_DATA, "--data-path": "corpus", "--merge-file": "drop"}, 1, "--merge-file", "bpe without merges"),
    param({**REAL_DATA, "--data-path": "nowhere/corpus_text_document"}, 1, "--data-path", "data files missing"),
    param({**REAL_DATA, "--data-path": "x", "--split": "90,a"}, 1, "--split", "split format"),
    param({"--deepspeed_config": "nope.json"}, 1, "--deepspeed_config", "ds config missing"),
    param({"--zero-stage": 2}, 1, "--zero-stage", "zero 2 with the pipeline engine"),
]
# ds_config contents that disagree with the flags (the file is written by the test)
DS_CONFIG_RULES = [
    param({"train_batch_size": 32}, 1, "--global-batch-size", "ds train batch"),
    param({"train_micro_batch_size_per_gpu": 4}, 1, "--micro-batch-size", "ds micro batch"),
    param({"gradient_accumulation_steps": 2}, 1, "--global-batch-size", "ds accumulation"),
    param({"fp16": {"enabled": True}}, 1, "--fp16", "ds fp16"),
    param({"bf16": {"enabled": True}}, 1, "--bf16", "ds bf16"),
    param({"zero_optimization": {"stage": 5}}, 1, "--deepspeed_config", "ds zero stage 5"),
    param("{not json", 1, "--deepspeed_config", "ds invalid json"),
]



@pytest.mark.parametrize("changes, world_size, flag", SINGLE_VALUE_RULES + SHAPE_RULES + COMBINATION_RULES)
def test_rule(changes, world_size, flag, entry_point):
    check_one_line(entry_point, flags(changes), world_size, flag)


@pytest.mark.parametrize("config, world_size, flag", DS_CONFIG_RULES)
def test_ds_config_rule(config, world_size, flag, entry_point, tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    check_one_line(entry_point, flags({"--deepspeed_config": path}), world_size, flag)


def test_rules_after_the_tokenizer_and_before_the_model(entry_point, tmp_path):
    """Caught once torch.distributed is up (the tokenizer reads its files, the checkpoint its
    layout) but still before the model is built."""
    not_json = tmp_path / "vocab.json"
    not_json.write_text("{'a': 0")
    check_one_line(entry_point, flags({"--vocab-size": "drop", "--vocab-file": not_json, "--merge-file": MERGES}),
                   1, "--vocab-file")
    no_eod = tmp_path / "no_eod.json"
    no_eod.write_text(json.dumps({"a": 0, "b": 1}))
    check_one_line(entry_point, flags({"--vocab-size": "drop", "--vocab-file": no_eod, "--merge-file": MERGES}),
                   1, "--vocab-file")
    check_one_line(entry_point, flags({"--vocab-size": 1}), 1, "--vocab-size")

    ckpt = tmp_path / "ckpt"
    os.makedirs(ckpt / "global_step3")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("three")
    check_one_line(entry_point, flags({"--load": ckpt}), 1, "--load")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")
    check_one_line(entry_point, flags({"--load": ckpt}), 1, "--load")  # no layout file: not ours
    saved = {"num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 512, "num_attention_heads": 4,
             "padded_vocab_size": 640, "max_position_embeddings": 32, "tensor_model_parallel_size": 1,
             "pipeline_model_parallel_size": 1, "ds_pipeline_enabled": True}
    (ckpt / "global_step3" / "megatron_layout.json").write_text(json.dumps(saved))
    line = check_one_line(entry_point, flags({"--load": ckpt}), 1, "--load")
    assert "hidden_size: saved 128 vs now 64, ffn_hidden_size: saved 512 vs now 256" in line


def test_flag_table_lists_every_flag():
    """The flag audit stays true: a new flag must be placed in docs/flags.md's table (or its
    "accepted, no effect" row)."""
    import re

    from megatron.config.arguments import build_parser
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "flags.md")) as f:
        readme = f.read()
    table = readme[readme.index("| group | flags |"):readme.index("The ds_config and the flags must agree")]
    deepspeed_own = {"--deepscale", "--deepscale_config", "--local-rank"}  # aliases users do not pass
    flags = {o for action in build_parser()._actions for o in action.option_strings if o.startswith("--")}
    missing = {f for f in flags - deepspeed_own - {"--help"} if not re.search(re.escape(f) + r"(?![-\w])", table)}
    assert missing == set()
    # a merge that left both sides of a conflict would list flags twice, under markers
    assert re.findall(r"^(?:<{7}|={7}|>{7})(?: .*)?$", readme, re.M) == []
