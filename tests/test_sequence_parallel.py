"""Megatron sequence parallelism (--sequence-parallel): TP=2 with the norms, dropouts and residuals
on sequence shards computes what one rank computes; the reference is the TP=1 model, which never
takes a sequence-parallel path."""
import torch
from distributed import run_distributed
from model_fixtures import SEED, tiny_batch, tiny_config


def _forward_backward(sequence_parallel, pipe_shapes=False):
    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    config = tiny_config(sequence_parallel=sequence_parallel)
    model = GPTModel(config, seed=SEED)
    hooked = mpu.install_sequence_parallel_grad_allreduce(model)
    tokens, labels, loss_mask = tiny_batch(config)
    hidden = model.language_model(tokens)  # what a pipeline stage would send on: [s/tp, b, h]
    loss = model(tokens, labels, loss_mask)
    loss.backward()
    grads = {n: (p.grad.clone(), getattr(p, "partition_dim", None), getattr(p, "sequence_parallel", False))
             for n, p in model.named_parameters()}
    return {"loss": loss.item(), "grads": grads, "hooked": hooked, "hidden_shape": tuple(hidden.shape)}


def test_tp2_sequence_parallel_equals_one_rank():
    [ref] = run_distributed(1, _forward_backward, False)
    sp = run_distributed(2, _forward_backward, True, tp=2)
    s, b, h, layers = 16, 2, 32, 2
    # by hand: per layer two norms (weight, bias) and two row-parallel biases, plus the final norm
    assert all(r["hooked"] == layers * 6 + 2 for r in sp)
    for rank, out in enumerate(sp):
        assert out["hidden_shape"] == (s // 2, b, h)
        assert abs(out["loss"] - ref["loss"]) < 1e-6
        for name, (grad, dim, _) in out["grads"].items():
            ref_grad = ref["grads"][name][0]
            expected = ref_grad if dim is None else ref_grad.chunk(2, dim=dim)[rank]
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6, msg=name)
    tagged = {n for n, (_, _, tag) in sp[0]["grads"].items() if tag}
    assert tagged == {n for n in sp[0]["grads"] if "layernorm" in n or n.endswith("dense.bias")
                      or n.endswith("dense_4h_to_h.bias")}


# --- the trainer, end to end -------------------------------------------------------------------

RUN = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
       "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
       "--train-iters", "6", "--lr", "3e-3", "--lr-warmup-iters", "1", "--mock-data", "--vocab-size", "600",
       # 640 rows at TP 1 and TP 2 alike: the same initial embedding in both runs
       "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0", "--attention-dropout", "0",
       "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "1", "--seed", "1234"]


def _train(argv):
    import contextlib
    import io

    import pretrain_gpt
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        pretrain_gpt.main(argv)
    return out.getvalue()


def test_tp2_pp2_sequence_parallel_trains_as_one_rank():
    from megatron.launch import logged_iterations
    [reference] = run_distributed(1, _train, RUN)
    sp = run_distributed(4, _train, RUN + ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size",
                                           "2", "--sequence-parallel"], tp=2, pp=2)
    out = "".join(sp)
    open("/tmp/sp/out.txt", "w").write(out)
    ref, got = logged_iterations(reference), logged_iterations(out)
    assert sorted(got) == list(range(1, 7))
    for it in got:
        assert abs(got[it]["lm loss"] - ref[it]["lm loss"]) <= 1e-5 * ref[it]["lm loss"], it
        assert abs(got[it]["grad norm"] - ref[it]["grad norm"]) <= 1e-3, it
