"""PP=2 equals PP=1 through DeepSpeed's pipeline engine, and both equal a plain step without
DeepSpeed clipped by torch.nn.utils.clip_grad_norm_: same initial weights, same loss, same
gradient norm and update, and the tied word embedding gets the gradient of both its uses and
stays identical on both stages.

The PP=2 run takes the split balanced by FLOPs (--pp-partition-method flops, partition.py). By hand,
forward per sample: a layer 24 s h^2 + 4 s^2 h = 24*16*32^2 + 4*16^2*32 = 425,984, the logits
2 s h V = 2*16*32*1024 = 1,048,576. Split 3 | 0 layers: stages 1,277,952 and 1,048,576; split
2 | 1: 851,968 and 1,474,560. So the first stage takes all three layers and the last stage holds
only the final norm and the output layer."""
import re
import warnings

import pytest
import torch

from megatron.model.gpt_model import TIED_BROADCAST_WARNING
from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config

MICRO_BATCHES = 2
VOCAB = 1024  # large enough that the balanced split gives the last stage no transformer layer
CLIP = 0.5  # below the first step's gradient norm, so clipping is active


def _pipeline_step():
    import deepspeed

    from megatron import mpu
    from megatron.model.gpt_model import GPTModelPipe
    from megatron.training.optimizer import install_gradient_clipping
    config = tiny_config(num_layers=3, vocab_size=VOCAB, pp_partition_method="flops")
    model = GPTModelPipe(config, topology=mpu.get_topology(), seed=SEED)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    # our exact-norm clipping (DeepSpeed's own fp32 clipping counts the tied embedding twice)
    install_gradient_clipping(optimizer, CLIP, mpu.get_tensor_model_parallel_rank(), mpu.get_model_parallel_group())
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer,
        config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": MICRO_BATCHES,
                "gradient_clipping": 0.0, "steps_per_print": 10 ** 9})
    batches = []
    for i in range(MICRO_BATCHES):
        tokens, labels, loss_mask = tiny_batch(config, seed=i)
        batches.append((tokens, (labels, loss_mask)))
    eval_loss = engine.eval_batch(iter(batches)).item()
    with warnings.catch_warnings(record=True) as caught:  # every warning, the filtered ones included
        warnings.simplefilter("always")
        train_loss = engine.train_batch(iter(batches)).item()
    tied_broadcast = [w for w in caught if re.match(TIED_BROADCAST_WARNING, str(w.message))]
    return {"grad_norm": float(engine.get_global_grad_norm()), "initial": initial, "warned": len(tied_broadcast),
            "updated": {k: v.clone() for k, v in model.state_dict().items()},
            "eval_loss": eval_loss, "train_loss": train_loss, "stage": mpu.get_pipeline_model_parallel_rank(),
            "parts": list(model.parts)}


def _plain_step():
    """The same step on the plain module (no DeepSpeed, no pipeline), clipped by torch."""
    from megatron.model.gpt_model import GPTModel
    config = tiny_config(num_layers=3, vocab_size=VOCAB)
    model = GPTModel(config, seed=SEED)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = 0.0
    for i in range(MICRO_BATCHES):
        micro_loss = model(*tiny_batch(config, seed=i)) / MICRO_BATCHES
        micro_loss.backward()
        loss += micro_loss.item()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
    optimizer.step()
    return {"grad_norm": grad_norm, "train_loss": loss, "updated": {_pipe_name(k, config.shape.num_layers): v.clone()
                                                                    for k, v in model.state_dict().items()}}


def _pipe_name(name, num_layers):
    """GPTModel's name of a tensor -> GPTModelPipe's (0: embedding, 1..L: layers, L+1: final LayerNorm)."""
    name = name.replace("language_model.embedding.", "tied_modules.embed.")
    name = name.replace("language_model.encoder.final_layernorm.", f"{num_layers + 1}.")
    if name.startswith("language_model.encoder.layers."):
        layer, rest = name[len("language_model.encoder.layers."):].split(".", 1)
        name = f"{int(layer) + 1}.{rest}"
    return name


def _pp1_and_plain():
    return _pipeline_step(), _plain_step()


def test_pp2_matches_pp1_and_keeps_tied_embedding_in_sync():
    [(ref, plain)] = run_distributed(1, _pp1_and_plain)
    # PP=1 through DeepSpeed with our clipping hook equals torch's clipping on the plain module
    assert ref["train_loss"] == pytest.approx(plain["train_loss"], rel=1e-6)
    assert ref["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-5)
    assert ref["updated"].keys() == plain["updated"].keys()
    for key, value in plain["updated"].items():
        torch.testing.assert_close(ref["updated"][key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert ref["warned"] == 0  # PP=1: no tied copy to broadcast
    stages = run_distributed(2, _pipeline_step, pp=2)
    # torch's warning about DeepSpeed's broadcast of the tied embedding (megatron/model/gpt_model.py)
    # came in this step on both stages, once per micro-batch's backward through the tied weight, and
    # every update below still equals PP=1's: it is harmless
    assert [out["warned"] for out in stages] == [MICRO_BATCHES, MICRO_BATCHES]
    # items: embedding, 3 layers | final norm, output layer (see the module docstring)
    assert stages[0]["parts"] == [0, 4, 6]
    word = "tied_modules.embed.word_embeddings.weight"
    layer_keys = set()
    for out in stages:
        # one batch, same weights: same loss on every stage (DeepSpeed broadcasts the last stage's)
        assert abs(out["eval_loss"] - ref["eval_loss"]) < 1e-6
        assert abs(out["train_loss"] - ref["train_loss"]) < 1e-6
        assert abs(out["grad_norm"] - ref["grad_norm"]) < 1e-5 * ref["grad_norm"]
        assert ref["grad_norm"] > CLIP
        for key, value in out["initial"].items():
            if key.startswith("tied_modules") and "position" in key and out["stage"] == 1:
                continue  # the last stage's unused copy of the position embedding
            assert torch.equal(value, ref["initial"][key]), key
            torch.testing.assert_close(out["updated"][key], ref["updated"][key], rtol=1e-5, atol=1e-6, msg=key)
        layer_keys |= {k for k in out["initial"] if not k.startswith("tied_modules")}
    assert layer_keys == {k for k in ref["initial"] if not k.startswith("tied_modules")}
    first, last = stages[0]["updated"][word], stages[1]["updated"][word]
    assert torch.equal(first, last), "tied embedding diverged between first and last stage"
    # both uses contributed: the input embedding alone touches only the rows of input tokens,
    # the output layer touches every row; with PP=1 as the reference the update matches exactly
    moved = (first != stages[0]["initial"][word]).any(dim=1)
    assert moved.all(), "rows of tokens never seen as input must still move (output-layer gradient)"


def test_the_filter_takes_that_one_message():
    """The filter of megatron/model/gpt_model.py hides the tied-broadcast warning and no other, not
    even the same warning about another c10d op (which could sit on an activation's gradient)."""
    message = ("{}: an autograd kernel was not registered to the Autograd key(s) but we are trying to backprop "
               "through it. This may lead to silently incorrect behavior.")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=TIED_BROADCAST_WARNING, category=UserWarning)
        for op in ("c10d::broadcast_", "c10d::allreduce_", "c10d::send"):
            warnings.warn(message.format(op), UserWarning, stacklevel=1)
    assert [str(w.message).split(":")[0:3] for w in caught] == [["c10d", "", "allreduce_"], ["c10d", "", "send"]]
