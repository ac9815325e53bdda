"""--torch-compile (megatron/model/compiled.py): the layers compiled by inductor compute what the
eager layers compute, and nothing the run reports changes. The references never take the compiled
path: the same model run eagerly in the same process, and an eager launch of the same run."""
import re

import torch

from tests.support.distributed import run_distributed
from tests.support.launcher import TINY, launch, losses
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config


def _eager_and_compiled():
    """TP 2 with Megatron sequence parallelism and recomputed layers: a forward and backward of
    the model eagerly, then of an identical model with its layers compiled."""
    import torch._dynamo

    from megatron import mpu
    from megatron.model.compiled import compile_transformer_layers
    from megatron.model.gpt_model import GPTModel
    config = tiny_config(sequence_parallel=True, checkpoint_activations=True)
    out = {}
    for compiled in (False, True):
        model = GPTModel(config, seed=SEED)
        mpu.install_sequence_parallel_grad_allreduce(model)
        torch._dynamo.reset()
        layers = compile_transformer_layers(model) if compiled else 0
        tokens, labels, loss_mask = tiny_batch(config)
        loss = model(tokens, labels, loss_mask)
        loss.backward()
        model.eval()
        with torch.no_grad():  # evaluation: another grad mode, another compiled graph
            eval_loss = model(tokens, labels, loss_mask)
        out[compiled] = {"layers": layers, "loss": loss.item(), "eval": eval_loss.item(),
                         "frames": torch._dynamo.utils.counters["frames"]["ok"],
                         "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                         "state": {k: tuple(v.shape) for k, v in model.state_dict().items()}}
    return out


def test_compiled_layers_compute_what_eager_layers_do_at_tp2_with_sequence_parallel():
    for rank in run_distributed(2, _eager_and_compiled, tp=2):
        eager, compiled = rank[False], rank[True]
        assert compiled["layers"] == 2 and compiled["frames"] > 0  # really compiled, not run eagerly
        assert compiled["state"] == eager["state"]  # parameter names and shapes: checkpoints unchanged
        assert abs(compiled["loss"] - eager["loss"]) <= 1e-5 * abs(eager["loss"])
        assert abs(compiled["eval"] - eager["eval"]) <= 1e-5 * abs(eager["eval"])
        assert compiled["grads"].keys() == eager["grads"].keys()
        for name, grad in compiled["grads"].items():
            torch.testing.assert_close(grad, eager["grads"][name], rtol=1e-4, atol=1e-6, msg=name)


def _report(output):
    """The startup report and the first iteration's memory check, which --torch-compile must not
    change: counts, FLOPs, the predicted and the measured memory."""
    keep = re.compile(r"parameters|FLOPs|memory|^\s+\d+ \|")
    return [line for line in output.splitlines() if keep.search(line) and "--torch-compile" not in line
            and "time" not in line]


def test_a_pipeline_run_with_compiled_layers_reports_and_saves_what_an_eager_run_does(tmp_path):
    """TP 1 x PP 2 through DeepSpeed's pipeline engine, 4 iterations, a checkpoint at the end."""
    args = TINY + ["--pipeline-model-parallel-size", "2", "--global-batch-size", "4", "--train-iters", "4",
                   "--save-interval", "4"]
    runs = {}
    for compiled in (False, True):
        out = tmp_path / ("compiled" if compiled else "eager")
        proc, _ = launch(2, args + ["--save", out / "ckpt"] + (["--torch-compile"] if compiled else []), str(out))
        runs[compiled] = proc.stdout, out / "ckpt"
    (eager, eager_ckpt), (compiled, compiled_ckpt) = runs[False], runs[True]
    assert "--torch-compile: 1 transformer layers compiled in place" in compiled  # one per stage
    assert "--torch-compile" not in eager
    report = _report(eager)
    assert any("predicted / measured" in line for line in report)
    assert _report(compiled) == report
    eager_losses, compiled_losses = losses(eager), losses(compiled)
    assert sorted(compiled_losses) == sorted(eager_losses) == [1, 2, 3, 4]
    for it, loss in eager_losses.items():
        assert abs(compiled_losses[it] - loss) <= 1e-4 * loss, (it, compiled_losses[it], loss)
    # the same files, holding the same tensors by name and shape
    files = sorted(p.relative_to(eager_ckpt).as_posix() for p in eager_ckpt.rglob("*.pt"))
    assert files and sorted(p.relative_to(compiled_ckpt).as_posix() for p in compiled_ckpt.rglob("*.pt")) == files
    for name in files:
        a = torch.load(eager_ckpt / name, map_location="cpu", weights_only=False)
        b = torch.load(compiled_ckpt / name, map_location="cpu", weights_only=False)
        shapes = {k: tuple(v.shape) for k, v in a.items() if isinstance(v, torch.Tensor)}
        assert shapes == {k: tuple(v.shape) for k, v in b.items() if isinstance(v, torch.Tensor)}, name
