"""The ds_config and the flags, where they may differ: the ds_config's `gradient_clipping` wins
over --clip-grad and --zero-stage overrides the ds_config's stage. Each side holds a different
value, and the test reads what the built engine really does: its ZeRO stage and optimizer, and
the size of the clipped update (SGD, lr 1, no momentum: the update is the clipped gradient)."""
import json

import pytest
import torch

from tests.support.distributed import run_distributed

DS_CLIP, FLAG_CLIP = 0.05, 1.0
FLAGS = ["--num-layers", 2, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
         "--micro-batch-size", 2, "--global-batch-size", 2, "--train-iters", 1, "--lr", 1.0, "--lr-decay-style",
         "constant", "--optimizer", "sgd", "--sgd-momentum", 0, "--weight-decay", 0, "--clip-grad", FLAG_CLIP,
         "--mock-data", "--vocab-size", 600, "--hidden-dropout", 0, "--attention-dropout", 0, "--eval-iters", 0]


def _one_step(config_path, zero_stage):
    import pretrain_gpt
    from megatron.training import Trainer
    from megatron.training.initialize import initialize_megatron

    args = initialize_megatron(args_list=[str(f) for f in FLAGS + ["--deepspeed_config", config_path,
                                                                    "--zero-stage", zero_stage]])
    trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.get_batch)
    engine = trainer.engine
    before = [p.detach().clone() for p in engine.module.parameters()]
    engine.train()
    trainer.train_step()
    update = torch.stack([(p.detach() - b).norm()
                          for p, b in zip(engine.module.parameters(), before, strict=True)]).norm()
    return {"stage": engine.zero_optimization_stage(), "optimizer": type(engine.optimizer).__name__,
            "grad_norm": float(engine.get_global_grad_norm()), "update_norm": float(update),
            "args_clip": args.clip_grad}


def _both(stage0_config, stage1_config):
    return _one_step(stage0_config, 1), _one_step(stage1_config, 0)


def test_ds_config_clipping_wins_and_zero_stage_flag_overrides(tmp_path):
    configs = []
    for stage in (0, 1):
        path = tmp_path / f"ds_stage{stage}.json"
        path.write_text(json.dumps({"gradient_clipping": DS_CLIP, "zero_optimization": {"stage": stage}}))
        configs.append(str(path))
    [(zero1, zero0)] = run_distributed(1, _both, *configs)
    # ds_config stage 0, --zero-stage 1: DeepSpeed's ZeRO optimizer, clipping at the ds_config's value
    assert (zero1["stage"], zero1["optimizer"]) == (1, "DeepSpeedZeroOptimizer")
    # ds_config stage 1, --zero-stage 0: the plain optimizer with our exact clipping hook
    assert (zero0["stage"], zero0["optimizer"]) == (0, "SGD")
    for run in (zero1, zero0):
        assert run["args_clip"] == DS_CLIP
        assert run["grad_norm"] > DS_CLIP  # so clipping is active and its value shows in the update
        assert run["update_norm"] == pytest.approx(DS_CLIP, rel=1e-4)  # not --clip-grad 1.0, nor unclipped
