"""TP=2 equals TP=1: initial weights are exact slices, forward and backward agree (fp32)."""
import pytest
import torch

from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config


def _forward_backward(attention_impl="sdpa"):
    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    config = tiny_config(attention_impl=attention_impl)
    model = GPTModel(config, seed=SEED)
    tokens, labels, loss_mask = tiny_batch(config)
    logits = mpu.gather_from_tensor_model_parallel_region(model(tokens))  # [s, b, V]
    loss = model(tokens, labels, loss_mask)
    loss.backward()
    params = {n: (p.detach().clone(), p.grad.clone(), getattr(p, "partition_dim", None))
              for n, p in model.named_parameters()}
    from megatron.training.optimizer import global_grad_norm
    grad_norm = global_grad_norm(list(model.parameters()), mpu.get_tensor_model_parallel_rank(),
                                 mpu.get_model_parallel_group())
    return {"logits": logits.detach(), "loss": loss.item(), "params": params, "grad_norm": float(grad_norm)}


def _slice(full, dim, rank, world):
    return full if dim is None else full.chunk(world, dim=dim)[rank]


def test_tp2_matches_tp1_weights_outputs_and_gradients():
    [ref] = run_distributed(1, _forward_backward)
    tp = run_distributed(2, _forward_backward, tp=2)
    for rank, out in enumerate(tp):
        assert out["params"].keys() == ref["params"].keys()
        for name, (weight, grad, dim) in out["params"].items():
            ref_weight, ref_grad, _ = ref["params"][name]
            # initialisation: exactly the TP=1 slice, bit for bit
            assert torch.equal(weight, _slice(ref_weight, dim, rank, 2)), name
            torch.testing.assert_close(grad, _slice(ref_grad, dim, rank, 2), rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(out["logits"], ref["logits"], rtol=1e-5, atol=1e-6)
        assert abs(out["loss"] - ref["loss"]) < 1e-6
        # the clipping norm counts TP-replicated gradients once: the TP=1 norm on every rank
        assert out["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-6)
    all_grads = [grad for _, grad, _ in ref["params"].values()]
    assert ref["grad_norm"] == pytest.approx(float(torch.nn.utils.get_total_norm(all_grads)), rel=1e-6)


def test_sdpa_and_math_attention_agree():
    sdpa = run_distributed(2, _forward_backward, "sdpa", tp=2)
    math = run_distributed(2, _forward_backward, "math", tp=2)
    for a, b in zip(sdpa, math, strict=True):
        torch.testing.assert_close(a["logits"], b["logits"], rtol=1e-5, atol=1e-6)
        for name in a["params"]:
            torch.testing.assert_close(a["params"][name][1], b["params"][name][1], rtol=1e-4, atol=1e-6)
