"""Sequence-length curriculum learning (the ds_config's legacy `curriculum_learning`, both forks):
the schedule against DeepSpeed's own CurriculumScheduler, the block's refusals and the disabled
block's note, the FLOPs per sample at a shorter length against FlopCounterMode, and one TP1 x PP2
launch that warms up, evaluates at full length mid-warm-up, saves mid-warm-up and resumes:
the log's seqlen, the TensorBoard tokens / FLOPs / gigaflos against by-hand sums, and the resumed
losses against the uninterrupted run's."""
import copy
import json
import math

import pytest

from megatron.runtime.refusal import ConfigError
from megatron.schedules.curriculum import CurriculumSchedule, parse_curriculum, truncate_sample_batch
from tests.support.distributed import run_distributed
from tests.support.launch import logged_iterations
from tests.support.launcher import TINY, launch
from tests.support.validated_args import validated

LINEAR = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 32,
          "schedule_type": "fixed_linear", "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}
SCHEDULES = [
    # Microsoft's example: min 80 (not a multiple of the step 8 x 3), max 2048, a long warm-up
    dict(LINEAR, min_difficulty=80, max_difficulty=2048, schedule_config={"total_curriculum_step": 300,
                                                                          "difficulty_step": 24}),
    dict(LINEAR, min_difficulty=8, max_difficulty=1024, schedule_type="fixed_root",
         schedule_config={"total_curriculum_step": 200, "difficulty_step": 8, "root_degree": 2}),
    dict(LINEAR, min_difficulty=5, max_difficulty=1000, schedule_type="fixed_root",  # neither a multiple of 16
         schedule_config={"total_curriculum_step": 77, "difficulty_step": 16, "root_degree": 3}),
    dict(LINEAR, min_difficulty=64, max_difficulty=512, schedule_type="fixed_discrete",
         schedule_config={"difficulty": [64, 128, 512, 256], "max_step": [10, 40, 90]}),  # holds at 512
    dict(LINEAR, min_difficulty=64, max_difficulty=512, schedule_type="fixed_discrete",
         schedule_config={"difficulty": [128, 64, 256], "max_step": [20, 50]}),
    dict(LINEAR, min_difficulty=256, max_difficulty=256),  # nothing to warm up
]


@pytest.mark.parametrize("block", SCHEDULES, ids=lambda b: f"{b['schedule_type']}-{b['min_difficulty']}")
def test_schedule_matches_deepspeeds_scheduler(block):
    """Step by step as the forks drive DeepSpeed's scheduler (update_difficulty(step) before each
    iteration), over the warm-up and well past it; our schedule is a function of the step alone."""
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler
    reference = CurriculumScheduler(copy.deepcopy(block))
    ours = parse_curriculum(block, "ds_config", 4096)
    steps = range(1, 400)
    expected = [reference.update_difficulty(step) for step in steps]
    assert [ours.seqlen(step) for step in steps] == expected
    assert set(expected) <= set(ours.seqlens())  # the FLOPs cache covers every length trained


def test_the_launch_schedule_by_hand():
    """The launch below: 8 + 24 x i/6, rounded down to a multiple of 8."""
    ours = parse_curriculum(LINEAR, "ds_config", 32)
    assert [ours.seqlen(i) for i in range(1, 10)] == LAUNCH_SEQLENS + [32]
    assert ours.seqlens() == (8, 16, 24, 32)


def _refusal(block, seq_length=32):
    with pytest.raises(ConfigError) as e:
        parse_curriculum(block, "--deepspeed_config x.json", seq_length)
    line = str(e.value)
    assert "\n" not in line and line.startswith("--deepspeed_config x.json: curriculum_learning")
    return line


def test_refusals_name_the_key_and_the_fix():
    assert "only \"seqlen\"" in _refusal(dict(LINEAR, curriculum_type="vocabularyrarity"))
    assert "fixed_linear, fixed_root, fixed_discrete" in _refusal(dict(LINEAR, schedule_type="custom"))
    assert "exceeds --seq-length 32" in _refusal(dict(LINEAR, max_difficulty=64))
    assert "min_difficulty 24 exceeds max_difficulty 16" in _refusal(dict(LINEAR, min_difficulty=24,
                                                                          max_difficulty=16))
    assert ".min_difficulty None" in _refusal({k: v for k, v in LINEAR.items() if k != "min_difficulty"})
    assert ".max_difficulty 0" in _refusal(dict(LINEAR, max_difficulty=0))
    assert "unknown key(s) difficulty_type" in _refusal(dict(LINEAR, difficulty_type="seqlen"))
    assert "takes exactly difficulty_step, root_degree, total_curriculum_step" in _refusal(
        dict(LINEAR, schedule_type="fixed_root"))
    assert "schedule_config is missing" in _refusal({k: v for k, v in LINEAR.items() if k != "schedule_config"})
    assert ".difficulty_step 0" in _refusal(dict(LINEAR, schedule_config={"total_curriculum_step": 6,
                                                                          "difficulty_step": 0}))
    discrete = dict(LINEAR, schedule_type="fixed_discrete")
    assert "give 1 positive steps" in _refusal(dict(discrete, schedule_config={"difficulty": [8, 16],
                                                                               "max_step": [3, 4]}))
    assert "exceeds --seq-length 32" in _refusal(dict(discrete, schedule_config={"difficulty": [8, 64],
                                                                                 "max_step": [3]}))


def test_validation_takes_the_block_out_of_the_ds_config(tmp_path):
    """Enabled: args.curriculum, and the config DeepSpeed sees has no `curriculum_learning` (it
    would reject it). Disabled (Microsoft's MoE template, BigScience's scripts): dropped with one
    startup note, no curriculum. Refused: one line, before anything is built."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"gradient_clipping": 1.0, "curriculum_learning": LINEAR}))
    args = validated(["--deepspeed_config", path])
    assert args.curriculum == CurriculumSchedule(8, 32, "fixed_linear", 6, 8, 1.0)
    assert "curriculum_learning" not in args.deepspeed_config_dict
    assert not [n for n in getattr(args, "startup_notes", []) if "curriculum" in n]
    path.write_text(json.dumps({"curriculum_learning": dict(LINEAR, enabled=False, max_difficulty=4096)}))
    args = validated(["--deepspeed_config", path])
    assert args.curriculum is None and "curriculum_learning" not in args.deepspeed_config_dict
    [note] = [n for n in args.startup_notes if "curriculum" in n]
    assert note.startswith(f"--deepspeed_config {path}: curriculum_learning is disabled") and "dropped" in note
    path.write_text(json.dumps({"curriculum_learning": dict(LINEAR, max_difficulty=64)}))
    with pytest.raises(ConfigError, match="exceeds --seq-length 32"):
        validated(["--deepspeed_config", path])


def test_truncation_cuts_tokens_labels_and_mask_alike():
    """pretrain_gpt.get_batch on the cut batch gives the full batch's tokens / labels / loss mask
    cut to [:, :s], as the forks cut them."""
    import torch
    text = torch.arange(2 * 33).reshape(2, 33)
    cut = truncate_sample_batch({"text": text}, 8)
    assert torch.equal(cut["text"], text[:, :9])
    assert truncate_sample_batch({"text": text}, 32)["text"] is text


H, LAYERS, PADDED_VOCAB = 64, 2, 640  # tests/support/launcher.py TINY: vocab 600 padded to a multiple of 128


def _by_hand_flops(s):
    """Forward + backward (3 x forward) per sample at length s, no recompute: per layer QKV 6sh^2,
    scores and context 4s^2h, projection 2sh^2, MLP 16sh^2; logits 2shV."""
    return 3 * (LAYERS * (24 * s * H * H + 4 * s * s * H) + 2 * s * H * PADDED_VOCAB)


def _measure_at(seqlens):
    """FlopCounterMode on a real forward+backward of the model built for 32 tokens, fed the first
    s tokens of each sample (what a curriculum iteration trains), and the cache the trainer reads."""
    import argparse

    from torch.utils.flop_counter import FlopCounterMode

    from megatron.model.analytic import analytic_parameter_counts
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel
    from megatron.model.shape import ModelShape
    from megatron.utils import cache_parameter_counts
    shape = ModelShape(num_layers=LAYERS, hidden_size=H, num_attention_heads=4, seq_length=32, vocab_size=600)
    model = GPTModel(GPTConfig(shape, hidden_dropout=0.0, attention_dropout=0.0, attention_impl="math"), seed=1)
    import torch
    measured = {}
    for s in seqlens:
        text = truncate_sample_batch({"text": torch.randint(0, 600, (2, 33))}, s)["text"]
        with FlopCounterMode(display=False) as counter:
            model(text[:, :-1], text[:, 1:], torch.ones(2, s)).backward()
        measured[s] = counter.get_total_flops() // 2
    args = argparse.Namespace(model_shape=shape, checkpoint_activations=False, activations_checkpoint_method=None,
                              checkpoint_num_layers=1, curriculum=parse_curriculum(LINEAR, "ds_config", 32))
    cache_parameter_counts(args, analytic_parameter_counts(shape))
    return measured, dict(args.flops_per_sample_at), dict(args.model_flops_per_sample_at)


def test_flops_per_sample_follow_the_trained_length():
    [(measured, cached, model_cached)] = run_distributed(1, _measure_at, (8, 16, 24, 32))
    assert measured == {s: _by_hand_flops(s) for s in (8, 16, 24, 32)}
    assert cached == measured and model_cached == measured  # no recompute: hardware = model FLOPs


def _no_pipeline_steps(config_path):
    """Three iterations of the Trainer on DeepSpeed's plain engine (--no-pipeline-parallel) with a
    token-based LR schedule: what the model was fed, the tokens counted and the LR reached."""
    import pretrain_gpt
    from megatron.training import Trainer
    from megatron.training.initialize import initialize_megatron

    args = initialize_megatron(args_list=[str(f) for f in TINY + [
        "--no-pipeline-parallel", "--global-batch-size", 4, "--train-iters", 3, "--deepspeed_config", config_path,
        "--lr-warmup-iters", 0, "--lr-warmup-tokens", 40, "--lr-decay-tokens", 1000, "--min-lr", 0]])
    trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.get_batch)
    fed = []
    trainer.engine.module.register_forward_pre_hook(lambda module, inputs: fed.append(inputs[0].size(1)))
    trainer.engine.train()
    lrs = []
    for _ in range(3):
        trainer.train_step()
        lrs.append(trainer.lr_scheduler.get_lr())
    return fed, trainer.progress.consumed_train_tokens, lrs


def test_no_pipeline_engine_trains_the_cut_batches_and_the_lr_follows_the_trained_tokens(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"curriculum_learning": LINEAR}))
    [(fed, tokens, lrs)] = run_distributed(1, _no_pipeline_steps, str(path))
    assert fed == [8, 8, 16, 16, 16, 16]  # two micro-batches per iteration
    assert tokens == 4 * (8 + 16 + 16)
    # warm-up over 40 tokens, then linear decay to 0 at 1000 tokens, by the tokens trained so far
    # (32, 96, 160), not samples x --seq-length (128, 256, 384)
    assert lrs == pytest.approx([3e-3 * 32 / 40, 3e-3 * (1 - 56 / 960), 3e-3 * (1 - 120 / 960)], rel=1e-12)


# --- one real launch: TP1 x PP2, warm-up 8 -> 32 over 6 iterations, save at 3, resume ------------

LAUNCH_SEQLENS = [8, 16, 16, 24, 24, 32, 32, 32]  # iterations 1..8: 8 + 24 x i/6, down to a multiple of 8
ITERS, SAVE_AT, GBS = 8, 3, 4
NO_EMBEDDING = LAYERS * (12 * H * H + 13 * H) + 2 * H  # per layer: QKV, dense, MLP and their biases, 2 norms


def _events(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_warm_up_launch_counts_the_trained_tokens_and_resumes_exactly(tmp_path):
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
                                  "curriculum_learning": LINEAR}))
    common = TINY + ["--pipeline-model-parallel-size", 2, "--global-batch-size", GBS, "--train-iters", ITERS,
                     "--deepspeed_config", config, "--eval-interval", 2, "--eval-iters", 1]
    ckpt = tmp_path / "ckpt"
    proc, ranks = launch(2, common + ["--save", ckpt, "--save-interval", SAVE_AT, "--tensorboard-dir",
                                      tmp_path / "tb", "--log-timers-to-tensorboard", "--peak-tflops", 2],
                         str(tmp_path / "whole"))
    assert ("sequence-length curriculum (ds_config curriculum_learning), fixed_linear: 8 -> 32 tokens over 6 "
            "iterations in steps of 8; training samples cut to it, evaluation at --seq-length 32") in proc.stdout
    # the first iteration's measured memory is of the curriculum's first length, and says so
    assert proc.stdout.count(f"note: the measured activations are of a {LAUNCH_SEQLENS[0]}-token iteration (the "
                             f"curriculum's first); the prediction is for --seq-length 32") == 1
    logged = logged_iterations(proc.stdout)
    assert [int(logged[i]["curriculum seqlen"]) for i in range(1, ITERS + 1)] == LAUNCH_SEQLENS
    tokens = [GBS * sum(LAUNCH_SEQLENS[:i]) for i in range(1, ITERS + 1)]
    assert [int(logged[i]["consumed tokens"]) for i in range(1, ITERS + 1)] == tokens
    last = ranks[1]
    assert last["gigaflos_no_embeds"] == pytest.approx(6 * GBS * sum(LAUNCH_SEQLENS) * NO_EMBEDDING / 1e9,
                                                       rel=1e-12)

    scalars = _events(tmp_path / "tb")
    assert [v for _, v in scalars["seqlen/curriculum_seqlen"]] == LAUNCH_SEQLENS
    assert [step for step, _ in scalars["lm-loss-training/lm loss vs tokens"]] == tokens
    gigaflos = [step for step, _ in scalars["lm-loss-training/lm loss vs gigaflos (without embeddings)"]]
    assert gigaflos == [int(6 * GBS * sum(LAUNCH_SEQLENS[:i]) * NO_EMBEDDING / 1e9) for i in range(1, ITERS + 1)]
    elapsed = [v for _, v in scalars["iteration-time/iteration-time"]]  # one iteration per log line
    tflops = [v for _, v in scalars["iteration-time/TFLOPs per gpu (estimated)"]]
    per_second = [v for _, v in scalars["iteration-time/tokens per second"]]
    mfu = [v for _, v in scalars["iteration-time/MFU"]]  # against --peak-tflops 2 per rank
    for i, s in enumerate(LAUNCH_SEQLENS):
        assert tflops[i] * elapsed[i] * 2 * 1e12 == pytest.approx(GBS * _by_hand_flops(s), rel=1e-5), i + 1
        assert mfu[i] * elapsed[i] * 2 * 2e12 == pytest.approx(GBS * _by_hand_flops(s), rel=1e-5), i + 1
        assert per_second[i] * elapsed[i] == pytest.approx(GBS * s, rel=1e-5), i + 1
    # what the model itself was fed (first stage): each iteration's two micro-batches cut to its
    # length; the evaluations (every 2 iterations, then validation and test at the end) at
    # --seq-length, also mid-warm-up
    fed = ranks[0]["model_inputs"]
    assert [s for training, s in fed if training] == [s for s in LAUNCH_SEQLENS for _ in range(2)]
    assert [s for training, s in fed if not training] == [32] * 2 * 6
    assert fed[4:8] == [[False, 32], [False, 32], [True, 16], [True, 16]]  # evaluation, then back to 16
    assert "validation loss at iteration 2" in proc.stdout and math.isfinite(logged[3]["lm loss"])

    # resumed mid-warm-up (iteration 4 trains at 24, not 16): the same losses, tokens and gigaflos
    (ckpt / "latest").write_text(f"global_step{SAVE_AT}")  # as a run interrupted after that save left it
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(SAVE_AT))
    proc2, resumed = launch(2, common + ["--load", ckpt], str(tmp_path / "resumed"))
    assert f"loaded checkpoint {ckpt}/global_step{SAVE_AT}/" in proc2.stdout
    again = logged_iterations(proc2.stdout)
    assert sorted(again) == list(range(SAVE_AT + 1, ITERS + 1))
    for i in range(SAVE_AT + 1, ITERS + 1):
        assert again[i]["curriculum seqlen"] == logged[i]["curriculum seqlen"]
        assert again[i]["consumed tokens"] == logged[i]["consumed tokens"]
        assert resumed[1]["losses"][str(i)] == last["losses"][str(i)], f"iteration {i}"
    assert resumed[1]["gigaflos_no_embeds"] == last["gigaflos_no_embeds"]
