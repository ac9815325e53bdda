"""The remaining flags of the forks' published GPT scripts (megatron/config/fork_features.py): features this
trainer does not have end in one line naming the flag, from the whole published lists and from a
hand-written table; Megatron-LM's --recompute-* spellings are --checkpoint-activations (trainer and
tools/param_count.py); --log-params-norm and --log-num-zeros-in-grad report the model's own numbers,
recomputed here with plain torch."""
import contextlib
import io
import os

import pytest

from tests.support.distributed import run_distributed
from tests.support.flag_runs import check_one_line, flags
from tests.support.published_scripts import HERE, for_the_tool, load, param_count_module

PUBLISHED = os.path.join(HERE, "data", "published_scripts")
NOT_SUPPORTED = "is not supported by this trainer; drop the flag"


# --- a published script with a feature this trainer lacks: one line, the first such flag --------

@pytest.mark.parametrize("name, line", [
    ("microsoft_compression_125M_dense_kd", f"--kd: knowledge distillation (Microsoft) {NOT_SUPPORTED}"),
    ("microsoft_offload_pp_350M", f"--cpu-optimizer: DeepSpeed's CPU Adam (the optimizer step on the CPU) "
                                  f"{NOT_SUPPORTED}"),
    ("microsoft_zero_bubble_1.3b", f"--enable-zbh1-pipeline: the zero-bubble pipeline schedule {NOT_SUPPORTED}"),
    ("microsoft_fpdt_6.7B_32k", f"--ds-sequence-parallel-fpdt: FPDT (DeepSpeed-Ulysses sequence parallelism) "
                                f"{NOT_SUPPORTED}"),
    ("bigscience_tr14_2B7_mup", f"--mup: muP parametrization (BigScience tr14) {NOT_SUPPORTED}"),
])
def test_published_script_with_a_missing_feature_is_one_line(name, line):
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    from megatron.runtime.refusal import ConfigError
    argv = load(os.path.join(PUBLISHED, name + ".txt"))
    with pytest.raises(ConfigError) as refused:
        validate_args(parse_args(args_list=argv), world_size=64, cuda_available=True)
    assert str(refused.value) == line


# --- the same through pretrain_gpt.py, flag by flag: exit 2, one line, nothing built ------------

REFUSALS = [
    ({"--kd": None}, "--kd: knowledge distillation (Microsoft) is not supported by this trainer; drop the flag"),
    ({"--load-teacher": "teacher"}, "--load-teacher: knowledge distillation (Microsoft) is not supported by this "
                                    "trainer; drop the flag"),
    ({"--num-experts-teacher": [1, 8]}, "--num-experts-teacher: knowledge distillation (Microsoft) is not "
                                        "supported by this trainer; drop the flag"),
    ({"--mos": None}, "--mos: Mixture-of-Students distillation (Microsoft) is not supported by this trainer; "
                      "drop the flag"),
    ({"--mup-attn-mult": 10}, "--mup-attn-mult: muP parametrization (BigScience tr14) is not supported by this "
                              "trainer; drop the flag"),
    ({"--no-train": 1}, "--no-train: an evaluation-only run (BigScience tr7b) is not supported by this trainer; "
                        "drop the flag"),
    ({"--no-train": None}, "--no-train: an evaluation-only run (BigScience tr7b) is not supported by this trainer; "
                           "drop the flag"),
    ({"--use-bnb-optimizer": None}, "--use-bnb-optimizer: bitsandbytes' 8-bit Adam is not supported by this "
                                    "trainer; drop the flag"),
    ({"--enable-zbh1-exact-semantics": None}, "--enable-zbh1-exact-semantics: the zero-bubble pipeline schedule is "
                                              "not supported by this trainer; drop the flag"),
    ({"--ds-sequence-parallel-fpdt-chunk-size": 1024}, "--ds-sequence-parallel-fpdt-chunk-size: FPDT "
                                                       "(DeepSpeed-Ulysses sequence parallelism) is not supported by "
                                                       "this trainer; drop the flag"),
    ({"--reset-iteration": None}, "--reset-iteration: resetting the loaded iteration and sample counters (use "
                                  "--finetune to start at 0) is not supported by this trainer; drop the flag"),
    ({"--use-checkpoint-args": None}, "--use-checkpoint-args: taking the model's flags from the checkpoint (pass "
                                      "them; --load checks them) is not supported by this trainer; drop the flag"),
    # issue 31: Argonne's AuroraGPT launchers and Microsoft's data-efficiency examples
    ({"--word-embedding-init-std": 0.01}, "--word-embedding-init-std 0.01 acts with --adjust-word-embedding-init only "
                                          "(Argonne's fork ignores it otherwise): add --adjust-word-embedding-init "
                                          "or drop the flag"),
    ({"--word-embedding-init-std": 0, "--adjust-word-embedding-init": None},
     "--word-embedding-init-std 0.0 must be positive"),
    ({"--accumulate-allreduce-grads-in-fp32": None, "--bf16": None},
     "--accumulate-allreduce-grads-in-fp32 with bf16 weights needs ZeRO: DeepSpeed accumulates bf16 gradients in "
     "fp32 only in its ZeRO / BF16 optimizers (at stage 0 it refuses the mix); use --zero-stage 1"),
    ({"--random-ltd": None}, "--random-ltd: random layerwise token dropping (Microsoft's data efficiency) is not "
                             "supported by this trainer; drop the flag"),
    ({"--train-shuffle-idx-path": "s.npy"}, "--train-shuffle-idx-path: precomputed index files (Microsoft's data "
                                            "efficiency) is not supported by this trainer; drop the flag"),
    ({"--transformer-impl": "transformer_engine"}, "--transformer-impl transformer_engine: Transformer Engine is not "
                                                   "supported by this trainer; use local (the default)"),
    ({"--dataloader-type": "cyclic"}, "--dataloader-type cyclic: the multi-epoch random sampler is not supported "
                                      "by this trainer; use single (the default for GPT in both forks)"),
    ({"--recompute-granularity": "full"}, "--recompute-granularity full needs --recompute-method uniform or block "
                                          "(the fork's model refuses it without one too)"),
    ({"--recompute-granularity": "full", "--recompute-method": "uniform", "--activations-checkpoint-method": "block"},
     "--recompute-granularity full and --activations-checkpoint-method are two spellings of one thing: give one "
     "of them"),
    ({"--recompute-granularity": "selective", "--recompute-method": "uniform"},
     "--recompute-method goes with --recompute-granularity full, not selective: drop one of them"),
    ({"--recompute-num-layers": 0}, "--recompute-num-layers 0 must be > 0"),
    ({"--log-num-zeros-in-grad": None, "--bf16": None},
     "--log-num-zeros-in-grad is supported for fp32 runs without ZeRO only (DeepSpeed's fp16 / bf16 / ZeRO "
     "optimizers hold the gradient in flat partitions): drop the flag"),
    ({"--log-num-zeros-in-grad": None, "--zero-stage": 1},
     "--log-num-zeros-in-grad is supported for fp32 runs without ZeRO only (DeepSpeed's fp16 / bf16 / ZeRO "
     "optimizers hold the gradient in flat partitions): drop the flag"),
    ({"--log-params-norm": None, "--zero-stage": 3, "--no-pipeline-parallel": None},
     "--log-params-norm does not work with ZeRO stage 3 (its parameters are partitioned): use --zero-stage 0, 1 "
     "or 2, or drop the flag"),
]


@pytest.mark.parametrize("changes, line", REFUSALS, ids=[" ".join(c) for c, _ in REFUSALS])
def test_refusal_is_one_line(changes, line, entry_point):
    flag = next(iter(changes))
    assert check_one_line(entry_point, flags(changes), 1, flag) == f"pretrain_gpt.py: error: {line}"


# --- --recompute-granularity full --recompute-method M = --activations-checkpoint-method M -------

def _validated(changes):
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    return validate_args(parse_args(args_list=flags(changes)), world_size=1, cuda_available=False)


RECOMPUTE_ONLY = {"given_flags", "recompute_granularity", "recompute_method", "recompute_num_layers"}


@pytest.mark.parametrize("method", ["uniform", "block"])
def test_recompute_full_is_the_activations_checkpoint_method(method):
    """Everything downstream (model, memory table, FLOPs) reads the validated args: Microsoft's
    spelling and the older one give the same ones."""
    spelled = vars(_validated({"--recompute-granularity": "full", "--recompute-method": method,
                               "--recompute-num-layers": 2}))
    older = vars(_validated({"--activations-checkpoint-method": method, "--activations-checkpoint-num-layers": 2}))
    assert (spelled["checkpoint_activations"], spelled["activations_checkpoint_method"],
            spelled["checkpoint_num_layers"]) == (True, method, 2)
    assert {k: v for k, v in spelled.items() if k not in RECOMPUTE_ONLY} == \
        {k: v for k, v in older.items() if k not in RECOMPUTE_ONLY}


def test_checkpoint_activations_wins_over_recompute_as_in_the_fork():
    both = _validated({"--recompute-granularity": "full", "--recompute-method": "block", "--recompute-num-layers": 2,
                       "--checkpoint-activations": None, "--checkpoint-num-layers": 3})
    assert (both.activations_checkpoint_method, both.checkpoint_num_layers) == ("uniform", 3)
    assert _validated({"--recompute-granularity": "selective"}).checkpoint_activations is False


def test_selective_recompute_and_other_no_effect_flags_are_named():
    from megatron.config.arguments import parse_args
    from megatron.config.script_flags import no_effect_line
    from megatron.config.validation import validate_args

    def line(changes):
        args = validate_args(parse_args(args_list=flags(changes)), world_size=1, cuda_available=False)
        return no_effect_line(args)
    assert line({"--recompute-granularity": "selective", "--timing-log-level": 2, "--no-load-lr-state": None,
                 "--dataloader-type": "single", "--no-data-sharding": None, "--transformer-impl": "local"}) == (
        "accepted, no effect: --recompute-granularity, --timing-log-level, --no-load-lr-state, --dataloader-type, "
        "--no-data-sharding, --transformer-impl (docs/flags.md, 'Flags accepted with no effect', says why)")
    assert line({"--recompute-granularity": "full", "--recompute-method": "uniform"}) is None  # full has an effect


def _measured_flops(argvs):
    """FlopCounterMode's count of one forward+backward of the model the trainer builds from each flag
    list (validated args -> GPTConfig.from_args -> GPTModel), on one micro-batch."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel
    measured = []
    for argv in argvs:
        args = validate_args(parse_args(args_list=argv), world_size=1, cuda_available=False)
        model = GPTModel(GPTConfig.from_args(args), seed=1).train()
        tokens = torch.randint(0, 600, (args.micro_batch_size, args.seq_length))
        with FlopCounterMode(display=False) as counter:
            model(tokens, tokens, torch.ones(tokens.shape)).backward()
        measured.append(counter.get_total_flops())
    return measured


def test_recompute_spelling_recomputes_in_the_built_model_and_the_printed_flops_are_measured():
    """Microsoft's --recompute-granularity full --recompute-method M --recompute-num-layers N makes the
    built model recompute (FlopCounterMode sees one more forward of exactly the recomputed layers,
    worked by hand), and tools/param_count.py prints FLOPs per sample equal to the measured count."""
    tool = param_count_module()
    common = {"--attention-impl": "math", "--hidden-dropout": 0, "--attention-dropout": 0}  # math: matmuls seen
    spelled = [{}, *({"--recompute-granularity": "full", "--recompute-method": m, "--recompute-num-layers": 1}
                     for m in ("uniform", "block"))]
    argvs = [flags({**common, **changes}) for changes in spelled]
    [measured] = run_distributed(1, _measured_flops, argvs)
    # BASE: 4 layers, h 64, s 32, micro-batch 2. One layer's forward matmuls per sequence: QKV 6sh^2,
    # scores and context 2 x 2s^2h, projection 2sh^2, MLP 2 x 2sh(4h) = 24sh^2 + 4s^2h
    s, h, b = 32, 64, 2
    layer_forward = 24 * s * h * h + 4 * s * s * h
    assert [m - measured[0] for m in measured] == [0, b * 4 * layer_forward, b * 1 * layer_forward]
    for argv, flops in zip(argvs, measured, strict=True):
        [line] = [ln for ln in tool.report(tool.parse_args(argv)) if ln.startswith("FLOPs per sample")]
        assert line.endswith(f": {flops // b:,}"), (line, flops)


def test_param_count_follows_the_recompute_spelling():
    """Microsoft's rebase/ds_pretrain_gpt_1.3B_megatron_checkpointing.sh passes --recompute-granularity
    full --recompute-method uniform --recompute-num-layers 1: the tool's report (FLOPs with recompute,
    memory with checkpointed activations) is the one of --checkpoint-activations, not of no flag."""
    tool = param_count_module()
    argv = for_the_tool(load(os.path.join(PUBLISHED, "microsoft_rebase_1.3B_megatron_checkpointing.txt")))
    start = argv.index("--recompute-granularity")
    assert argv[start:start + 6] == ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                     "--recompute-num-layers", "1"]
    without = argv[:start] + argv[start + 6:]
    reports = [tool.report(tool.parse_args(a)) for a in (argv, without + ["--checkpoint-activations"], without)]
    assert reports[0] == reports[1] != reports[2]
    assert any("recompute" in ln for ln in reports[0]) and not any("recompute" in ln for ln in reports[2])


# --- --log-params-norm and --log-num-zeros-in-grad: one logged iteration, recomputed here --------

LOGGED = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
          "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "1", "--lr", "1e-2",
          "--mock-data", "--vocab-size", "600", "--hidden-dropout", "0", "--attention-dropout", "0",
          "--eval-iters", "0", "--log-interval", "1", "--no-pipeline-parallel",
          "--untie-embeddings-and-output-weights",  # the rows of tokens not in the batch: exact zeros
          "--log-params-norm", "--log-num-zeros-in-grad", "--timing-log-level", "2"]


def _one_logged_iteration(tensorboard_dir):
    import torch

    import pretrain_gpt
    from megatron.training import Trainer
    from megatron.training.initialize import initialize_megatron

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        args = initialize_megatron(args_list=LOGGED + ["--tensorboard-dir", tensorboard_dir])
        trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.get_batch)
    batch = next(trainer.train_iter)
    # the gradient of this batch with plain autograd, outside the engine; its zeros counted here
    model = trainer.engine.module
    pretrain_gpt.forward_step(batch, model).backward()
    zeros = sum(int((p.grad == 0).sum()) for p in model.parameters())
    for p in model.parameters():
        p.grad = None
    trainer.train_iter, trainer.valid_iters = iter([batch]), None  # that batch again, no evaluation
    with contextlib.redirect_stdout(out):
        stop = trainer.train()
    norm = float(torch.cat([p.detach().double().flatten() for p in model.parameters()]).norm())
    trainer.metrics.close()
    return {"stop": stop, "out": out.getvalue(), "zeros": zeros, "norm": norm}


def test_params_norm_and_zeros_in_grad_are_the_models(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.support.launch import logged_iterations
    [run] = run_distributed(1, _one_logged_iteration, str(tmp_path / "tb"))
    assert run["stop"] == "finished"
    logged = logged_iterations(run["out"])[1]
    assert run["zeros"] > 0
    assert logged["num zeros"] == run["zeros"]
    assert logged["params norm"] == pytest.approx(run["norm"], abs=1e-3)  # printed with 3 decimals
    assert "accepted, no effect: --timing-log-level (docs/flags.md, 'Flags accepted with no effect', says why)" \
        in run["out"].splitlines()
    # the fork's TensorBoard tags: iteration 1, 2 samples, 64 tokens
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    for tag, value in (("num-zeros/num-zeros", run["zeros"]), ("params-norm/params-norm", run["norm"])):
        for suffix, step in (("", 1), (" vs samples", 2), (" vs tokens", 64)):
            [event] = events.Scalars(tag + suffix)
            assert event.step == step and event.value == pytest.approx(value, rel=1e-6)  # stored as float32


# where a flag of NO_EFFECT may be read: its validation (a refused value) and the data path's format check
READ_ONLY_TO_VALIDATE = {"data_impl": {"pretrain_gpt.py", "megatron/data/gpt_dataset.py",
                                       "megatron/data/weighted_split_paths.py", "megatron/data/indexed_dataset.py"},
                         "dataloader_type": {"megatron/config/fork_features.py"},
                         "data_sharding": {"megatron/config/fork_features.py"},
                         "transformer_impl": {"megatron/config/fork_features.py"},
                         "recompute_activations": {"megatron/config/fork_features.py"},
                         "recompute_granularity": {"megatron/config/fork_features.py"}}


def test_no_flag_listed_as_no_effect_is_read_by_the_trainer():
    """A flag the startup line calls 'accepted, no effect' must not steer anything: its dest is read nowhere
    but in argument parsing and the validation that refuses other values (a merge once left
    --pp-partition-method, which picks the pipeline split, in the list)."""
    import re
    from pathlib import Path

    from megatron.config.arguments import build_parser
    from megatron.config.script_flags import NO_EFFECT
    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("megatron/**/*.py"), root / "pretrain_gpt.py"]
    sources = {str(p.relative_to(root)): p.read_text() for p in files
               if p.name not in ("arguments.py", "script_flags.py", "flag_table.py")}
    actions = build_parser()._option_string_actions
    readers = {flag: sorted(path for path, text in sources.items()
                            if re.search(rf"\b{actions[flag].dest}\b", text)
                            and path not in READ_ONLY_TO_VALIDATE.get(actions[flag].dest, ()))
               for flag in NO_EFFECT}
    assert {flag: paths for flag, paths in readers.items() if paths} == {}


# --- Argonne's --adjust-word-embedding-init --word-embedding-init-std ----------------------------

def _embedding_and_reference(config, seed):
    """(word, position) weights of our Embedding built under `seed`, and the same two tensors drawn
    with plain torch.nn.init.normal_ from the same seed: the word embedding at the std the flags
    say, the position table at --init-method-std."""
    import torch

    from megatron.model.language_model import Embedding
    shape = config.shape
    torch.manual_seed(seed)
    built = Embedding(config)
    torch.manual_seed(seed)
    word = torch.nn.init.normal_(torch.empty(shape.padded_vocab_size, shape.hidden_size), 0.0, EMBED_STD)
    position = torch.nn.init.normal_(torch.empty(shape.max_position_embeddings, shape.hidden_size), 0.0, 0.01)
    return built.word_embeddings.weight.detach(), built.position_embeddings.weight.detach(), word, position


EMBED_STD = 0.632455532  # Argonne's AuroraGPT launcher's sqrt(2/5)


def test_adjust_word_embedding_init_draws_the_word_embedding_at_its_std():
    """Argonne's rule: the word embedding (and so the tied output layer) is N(0, --word-embedding-init-std)
    with --adjust-word-embedding-init, N(0, 0.02) with that flag alone whatever --init-method-std is,
    and N(0, --init-method-std) without it; every other weight keeps --init-method-std. Exactly the
    tensors torch.nn.init.normal_ draws from the same seed."""
    import torch

    from megatron.model.config import GPTConfig
    adjusted = GPTConfig.from_args(_validated({"--adjust-word-embedding-init": None, "--word-embedding-init-std":
                                               EMBED_STD, "--init-method-std": 0.01}))
    assert adjusted.word_embedding_init_std == EMBED_STD
    assert GPTConfig.from_args(_validated({"--adjust-word-embedding-init": None, "--init-method-std": 0.01})
                               ).word_embedding_init_std == 0.02
    assert GPTConfig.from_args(_validated({"--init-method-std": 0.01})).word_embedding_init_std is None
    [(word, position, word_ref, position_ref)] = run_distributed(1, _embedding_and_reference, adjusted, 7)
    assert torch.equal(word, word_ref) and torch.equal(position, position_ref)


# --- --accumulate-allreduce-grads-in-fp32: the ds_config's data_types.grad_accum_dtype --------------

def test_accumulate_allreduce_grads_in_fp32_is_the_ds_config_key_deepspeed_reads(tmp_path):
    """The ds_config DeepSpeed is given carries grad_accum_dtype fp32, and DeepSpeed's own parser reads
    fp32 accumulation from it (the engines it builds: tests/integration/test_memory_measured.py); an fp32 run
    takes it as is (its gradients are fp32 already). A ds_config that says otherwise, or the key
    where DeepSpeed's engine would raise (16-bit weights at ZeRO 0), is one line."""
    import json

    import torch
    from deepspeed.runtime.config import DeepSpeedConfig, DtypeEnum

    from megatron.runtime.refusal import ConfigError
    for changes in ({"--bf16": None, "--zero-stage": 1}, {"--zero-stage": 0}):
        config = _validated({"--accumulate-allreduce-grads-in-fp32": None, **changes}).deepspeed_config_dict
        assert config["data_types"] == {"grad_accum_dtype": "fp32"}
        probe = {k: v for k, v in config.items() if k not in ("train_batch_size", "gradient_accumulation_steps")}
        assert DtypeEnum(DeepSpeedConfig(probe).grad_accum_dtype).value == torch.float32
    assert "data_types" not in _validated({"--bf16": None, "--zero-stage": 1}).deepspeed_config_dict
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"data_types": {"grad_accum_dtype": "bf16"}}))
    with pytest.raises(ConfigError) as refused:
        _validated({"--accumulate-allreduce-grads-in-fp32": None, "--bf16": None, "--deepspeed_config": ds})
    assert str(refused.value) == (f"--deepspeed_config {ds}: data_types.grad_accum_dtype=bf16 disagrees with "
                                  f"--accumulate-allreduce-grads-in-fp32; make them match")
    # the key alone, in DeepSpeed's other spelling, where DeepSpeed 0.19.8 raises NotImplementedError
    ds.write_text(json.dumps({"data_types": {"grad_accum_dtype": "float32"}}))
    with pytest.raises(ConfigError) as refused:
        _validated({"--bf16": None, "--deepspeed_config": ds})
    assert str(refused.value).startswith(f"--deepspeed_config {ds}: data_types.grad_accum_dtype=fp32 with bf16 "
                                         f"weights needs ZeRO: ")
    assert _validated({"--bf16": None, "--deepspeed_config": ds, "--zero-stage": 1}).deepspeed_config_dict[
        "data_types"] == {"grad_accum_dtype": "fp32"}  # the canonical name, as the memory table reads it
