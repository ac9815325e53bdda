"""Resumed runs reproduce the uninterrupted run; half-written checkpoints are never picked up; a
finished run reloaded trains nothing; a checkpoint of another model shape is refused with both
shapes named; the TensorBoard event file holds the expected scalars.

Each layout runs once uninterrupted, saving at iteration 4 and at its end (8): that run is the
reference, and its checkpoints are what the resumed, reloaded and refused launches start from."""
import dataclasses
import math
import os
import shutil

import pytest

from tests.support.launcher import launch

ITERS, RESUME_AT = 8, 4


def real_data_args(corpus, tp=1, pp=1):
    return ["--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 64,
            "--micro-batch-size", 2, "--global-batch-size", 4, "--train-iters", ITERS, "--lr", "1e-3",
            "--lr-warmup-iters", 2, "--lr-decay-style", "cosine", "--log-interval", 1, "--eval-interval", 4,
            "--eval-iters", 1, "--data-path", corpus, "--vocab-file", "data/gpt2-vocab.json",
            "--merge-file", "data/gpt2-merges.txt", "--split", "90,10,0",
            "--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp]  # dropout stays on


def uninterrupted(corpus, tmp, tp, pp):
    """Iterations 1-8 in one launch, saving at 4 and at the end, with TensorBoard logging."""
    ckpt = tmp / "ckpt"
    proc, ranks = launch(tp * pp, real_data_args(corpus, tp, pp) + [
        "--save", ckpt, "--save-interval", RESUME_AT, "--tensorboard-dir", tmp / "tb", "--log-timers-to-tensorboard",
        "--log-batch-size-to-tensorboard", "--log-validation-ppl-to-tensorboard"], str(tmp / "whole"))
    assert sorted(os.listdir(ckpt)) == [f"global_step{RESUME_AT}", f"global_step{ITERS}", "latest",
                                        "latest_checkpointed_iteration.txt"]
    return {"proc": proc, "ranks": ranks, "ckpt": ckpt, "tb": tmp / "tb", "tmp": tmp}


def resumed(corpus, run, tp, pp):
    """Launched on iteration 4's checkpoint as an interrupted run leaves it: the pointers name
    iteration 4, and a crash during a later save left that save's directory half written."""
    ckpt = run["tmp"] / "interrupted"
    shutil.copytree(run["ckpt"] / f"global_step{RESUME_AT}", ckpt / f"global_step{RESUME_AT}")
    (ckpt / "latest").write_text(f"global_step{RESUME_AT}")
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(RESUME_AT))
    shutil.copytree(ckpt / f"global_step{RESUME_AT}", ckpt / "global_step6")
    for name in os.listdir(ckpt / "global_step6"):
        if name.startswith("layer_01"):
            os.remove(ckpt / "global_step6" / name)
    proc, ranks = launch(tp * pp, real_data_args(corpus, tp, pp) + ["--load", ckpt], str(run["tmp"] / "resumed"))
    assert f"loaded checkpoint {ckpt}/global_step{RESUME_AT}/" in proc.stdout
    return ranks[tp * pp - 1]  # the last rank logs the loss under pipeline parallelism


@pytest.fixture(scope="module")
def tp1_pp1(corpus, tmp_path_factory):
    return uninterrupted(corpus, tmp_path_factory.mktemp("tp1_pp1"), 1, 1)


def test_resume_is_bit_for_bit_at_tp1_pp1(corpus, tp1_pp1):
    whole = tp1_pp1["ranks"][0]
    after = resumed(corpus, tp1_pp1, 1, 1)
    assert sorted(map(int, whole["losses"])) == list(range(1, ITERS + 1))
    assert sorted(map(int, after["losses"])) == list(range(RESUME_AT + 1, ITERS + 1))
    for it in range(RESUME_AT + 1, ITERS + 1):
        assert after["losses"][str(it)] == whole["losses"][str(it)], f"iteration {it}"
    assert after["gigaflos_no_embeds"] == whole["gigaflos_no_embeds"]
    _check_tensorboard(tp1_pp1["tb"], whole)


def test_resume_matches_at_tp2_pp2(corpus, tmp_path):
    run = uninterrupted(corpus, tmp_path, 2, 2)
    whole, after = run["ranks"][3], resumed(corpus, run, 2, 2)
    assert sorted(map(int, after["losses"])) == list(range(RESUME_AT + 1, ITERS + 1))
    for it in range(RESUME_AT + 1, ITERS + 1):
        assert after["losses"][str(it)] == pytest.approx(whole["losses"][str(it)], rel=1e-6, abs=0)
    assert after["gigaflos_no_embeds"] == whole["gigaflos_no_embeds"]


def test_checkpoint_of_another_shape_is_refused(corpus, tp1_pp1):
    ckpt = tp1_pp1["ckpt"]
    saved = tp1_pp1["proc"]
    assert "Using topology" in saved.stdout and "estimated model parameters" in saved.stdout
    before = sorted(os.listdir(ckpt))
    # another TP x PP layout is resharded (tests/integration/test_checkpoint_layouts.py); another shape is refused
    proc, _ = launch(1, real_data_args(corpus) + ["--hidden-size", 128, "--load", ckpt, "--save", ckpt],
                     str(tp1_pp1["tmp"] / "another_shape"), check=False)
    assert proc.returncode != 0
    assert ("pretrain_gpt.py: error: --load " + str(ckpt) + ": the checkpoint's model shape differs from this run's "
            "(kv_channels: saved 16 vs now 32, hidden_size: saved 64 vs now 128, "
            "ffn_hidden_size: saved 256 vs now 512); "
            "launch with the saved shape") in proc.stdout
    assert "estimated model parameters" not in proc.stdout  # refused before the model was built
    assert sorted(os.listdir(ckpt)) == before  # nothing saved was touched
    # refused before the model was built: DeepSpeed's PipelineModule prints its topology when it is
    # constructed, and the parameter report follows every build
    assert "Using topology" not in proc.stdout and "estimated model parameters" not in proc.stdout


def _check_tensorboard(logdir, whole):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {
        "model/parameters", "model/parameters without embeddings",
        "learning-rate/learning-rate", "learning-rate/learning-rate vs samples",
        "batch-size/batch-size", "batch-size/batch-size vs samples",
        "lm-loss-training/lm loss", "lm-loss-training/lm loss vs samples", "lm-loss-training/lm loss vs tokens",
        "lm-loss-training/lm loss vs gigaflos (without embeddings)", "grad-norm/grad-norm",
        "iteration-time/iteration-time", "iteration-time/samples per second",
        "iteration-time/samples per second per replica", "iteration-time/tokens per second",
        "iteration-time/tokens per second per replica", "iteration-time/TFLOPs per gpu (estimated)",
        "lm-loss-validation/lm loss validation", "lm-loss-validation/lm loss validation vs samples",
        "lm-loss-validation/lm loss validation vs tokens",
        "lm-loss-validation/lm loss validation vs gigaflos (without embeddings)",
        "lm-loss-validation/lm loss validation ppl", "lm-loss-validation/lm loss validation ppl vs samples",
    }
    assert expected <= tags, expected - tags
    [params] = events.Scalars("model/parameters")
    [no_embedding] = events.Scalars("model/parameters without embeddings")
    assert (params.step, params.value, no_embedding.value) == (0, whole["parameters"], whole["parameters_no_embedding"])
    # --lr 1e-3, warmup 2 iterations, cosine decay over 8, global batch 4: in samples 8 and 32
    lrs = [e.value for e in events.Scalars("learning-rate/learning-rate")]
    expected_lrs = [1e-3 * min(4 * i / 8, 0.5 * (1 + math.cos(math.pi * (4 * i - 8) / 24)))
                    for i in range(1, ITERS + 1)]
    assert lrs == pytest.approx(expected_lrs, rel=1e-6)
    losses = events.Scalars("lm-loss-training/lm loss")
    assert [e.step for e in losses] == list(range(1, ITERS + 1))
    assert [e.value for e in losses] == pytest.approx([whole["losses"][str(i)] for i in range(1, ITERS + 1)], rel=1e-6)
    # gigaflos per iteration: 6 x 4 samples x 64 tokens x non-embedding parameters / 1e9
    per_iteration = 6 * 4 * 64 * whole["parameters_no_embedding"] / 1e9
    vs_gigaflos = events.Scalars("lm-loss-training/lm loss vs gigaflos (without embeddings)")
    assert [e.step for e in vs_gigaflos] == [int(per_iteration * i) for i in range(1, ITERS + 1)]


def test_reloading_a_finished_run_trains_nothing_and_exits_cleanly(corpus, tp1_pp1):
    ckpt = tp1_pp1["tmp"] / "finished"
    shutil.copytree(tp1_pp1["ckpt"], ckpt)
    args = real_data_args(corpus) + ["--save", ckpt, "--load", ckpt]
    # the same schedule again, and a shorter one (its LR decay, derived from --train-iters, differs
    # from the checkpoint's: as in both forks the load stops unless told which schedule to keep)
    for train_iters, keep in ((ITERS, []), (RESUME_AT, ["--use-checkpoint-opt_param-scheduler"])):
        args[args.index("--train-iters") + 1] = train_iters
        proc, results = launch(1, args + keep, str(tp1_pp1["tmp"] / f"again{train_iters}"))
        assert f"loaded checkpoint {ckpt}/global_step{ITERS}/" in proc.stdout
        assert results[0]["log_calls"] == 0 and results[0]["iteration"] == ITERS
    assert sorted(os.listdir(ckpt)) == [f"global_step{RESUME_AT}", f"global_step{ITERS}", "latest",
                                        "latest_checkpointed_iteration.txt"]


def _save_while_rank1_stalls(save_dir):
    """Two saves at PP=2; in the second, rank 1 stalls inside its first file write until rank 0 has
    written all of its own files (and a second more), then reads the pointers."""
    import time

    import deepspeed
    import torch
    import torch.distributed as dist

    from megatron import mpu
    from megatron.checkpoint.layout import TRACKER
    from megatron.config.arguments import parse_args
    from megatron.config.validation import validate_args
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.schedules.learning_rates import AnnealingLR
    from megatron.schedules.progress import TrainingProgress
    from tests.support.checkpoint_fixtures import checkpoint_manager
    from tests.support.model_fixtures import tiny_config

    config = tiny_config(pipeline_model_parallel_size=2)
    model = GPTModelPipe(config, topology=mpu.get_topology())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                           config={"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 9})
    # the run's arguments as the trainer validates them, for this model's shape
    args = validate_args(parse_args(args_list=[
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
        "--micro-batch-size", "2", "--lr", "0.1", "--train-iters", "2", "--mock-data", "--vocab-size", "128",
        "--pipeline-model-parallel-size", "2", "--save", save_dir]), world_size=2, cuda_available=False)
    args.model_shape = dataclasses.replace(args.model_shape, vocab_size=128)
    args.rank = dist.get_rank()  # args.padded_vocab_size follows the shape
    assert args.model_shape == config.shape
    lr_scheduler = AnnealingLR(optimizer, 0.1, 0.0, 0, 100, "constant")

    def pointers():
        with open(os.path.join(save_dir, "latest")) as f, open(os.path.join(save_dir, TRACKER)) as g:
            return f.read(), g.read()

    progress = TrainingProgress(iteration=1)
    manager = checkpoint_manager(args)
    manager.save(engine, lr_scheduler, progress)
    seen = []
    if dist.get_rank() == 1:
        write = engine.checkpoint_engine.save
        # a save in progress writes into global_step2.partial, renamed to global_step2 once complete
        rank0_done = os.path.join(save_dir, "global_step2.partial", "mp_rank_00_model_states.pt")

        def stalled(state_dict, path, *rest, **kwargs):
            if not seen:
                deadline = time.monotonic() + 120
                while not os.path.exists(rank0_done) and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(1.0)  # ample time for rank 0 to move the pointers, were it allowed to
                seen.append((os.path.exists(rank0_done),
                             sorted(os.listdir(os.path.join(save_dir, "global_step2.partial"))), pointers(),
                             os.path.exists(os.path.join(save_dir, "global_step2"))))
            return write(state_dict, path, *rest, **kwargs)
        engine.checkpoint_engine.save = stalled
    progress.iteration = 2
    manager.save(engine, lr_scheduler, progress)
    return seen, pointers()


def test_pointers_move_only_after_every_rank_has_written(tmp_path):
    from tests.support.distributed import run_distributed
    _, (seen, after) = run_distributed(2, _save_while_rank1_stalls, str(tmp_path), pp=2)
    [(rank0_done, files_during_stall, pointers_during_stall, visible_during_stall)] = seen
    assert rank0_done  # rank 0 had written its shards of iteration 2 ...
    assert not any(name.startswith(("layer_02", "layer_03", "mp_rank_01")) for name in files_during_stall)
    assert pointers_during_stall == ("global_step1", "1")  # ... yet the pointers still named iteration 1
    assert not visible_during_stall  # ... and global_step2 appears only once complete
    assert after == ("global_step2", "2")
