"""The parameter table's names and TP split rules (megatron/model/analytic.py) are what the modules
build. Resharding, the transformers export and the build-time matcher read nothing else, so each
rule is checked here against the built model itself, not against the table:
  - every parameter of GPTModel and GPTModelPipe of each variant (tests/support/variants.py) has exactly
    one table entry by its name, and the plain model covers the whole table;
  - the entry's split dim is the one the TP layer tagged (mpu/layers.py: ColumnParallelLinear and
    the vocab-parallel embedding dim 0, RowParallelLinear dim 1; untagged: replicated);
  - a fused entry's parts (fused_parts: GQA query / key / value, GLU gate / value, biases
    included) computed into plain-PyTorch attention and MLP give what the modules compute.
(The GQA + SwiGLU TP=2 -> TP=1 reshard against an uninterrupted run is in
test_variant_launches.py; a checkpoint parameter without an entry: test_checkpoint_layouts.py.)"""
import math

import torch
import torch.nn.functional as F

from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_config
from tests.support.variants import VARIANTS, shape_kwargs

# GQA 8 query / 2 kv heads of dim 24 (!= h/a), SwiGLU, biases, no positions: attention and MLP as
# plain PyTorch in the test below, nothing else to reproduce
FUSED = dict(num_layers=1, hidden_size=64, num_attention_heads=8, num_key_value_heads=2, kv_channels=24,
             position_embedding_type="none", swiglu=True, seq_length=16, vocab_size=256)


def _built(names):
    """{variant: {"plain": {name: split dim the TP layer tagged}, "pipe": [names]}}."""
    from megatron import mpu
    from megatron.model.gpt_model import GPTModel, GPTModelPipe
    out = {}
    for name in names:
        config = tiny_config(**shape_kwargs(name))
        plain = GPTModel(config, seed=SEED)
        pipe = GPTModelPipe(config, mpu.get_topology())
        out[name] = {"plain": {n: p.partition_dim if getattr(p, "tensor_model_parallel", False) else None
                               for n, p in plain.named_parameters()},
                     "pipe": [n for n, _ in pipe.named_parameters()]}
    return out


def _built_and_fused():
    return _built(list(VARIANTS)), _fused_modules_and_plain()


def test_every_built_parameter_has_one_entry_with_the_split_its_layer_tagged_and_fused_parts_compute_alike():
    from megatron.model.analytic import parameter_table, table_entry
    [(built, (ours, plain))] = run_distributed(1, _built_and_fused)
    for name in VARIANTS:
        shape = tiny_config(**shape_kwargs(name)).shape
        table = parameter_table(shape)
        for pipeline, names in ((False, list(built[name]["plain"])), (True, built[name]["pipe"])):
            entries = [table_entry(n, shape, pipeline) for n in names]
            assert None not in entries, (name, pipeline, [n for n, e in zip(names, entries, strict=True) if e is None])
            assert len(set(entries)) == len(entries), (name, pipeline)  # one entry per parameter
            assert set(entries) == set(table), (name, pipeline)  # PP=1: every entry is built
        # ColumnParallelLinear / VocabParallelEmbedding tag dim 0, RowParallelLinear dim 1, the
        # rest nothing (TP=2 holding exactly these chunks of the TP=1 weights: test_variants.py)
        for n, dim in built[name]["plain"].items():
            spec = table_entry(n, shape, False)
            assert spec.partition_dim == dim, (name, n, spec.split, dim)
    # the fused entries' parts (GQA query / key / value, SwiGLU gate / value, biases included),
    # used as separate projections in plain PyTorch, compute what the modules compute
    for kind in ("attention", "mlp"):
        assert ours[kind].abs().max() > 0.1, kind
        torch.testing.assert_close(ours[kind], plain[kind], rtol=1e-5, atol=1e-5, msg=kind)


def _fused_modules_and_plain():
    """(module outputs, plain-PyTorch outputs from the table's fused parts) for random weights."""
    from megatron.model.analytic import fused_parts, table_entry
    from megatron.model.gpt_model import GPTModel
    config = tiny_config(**FUSED)
    shape = config.shape
    model = GPTModel(config, seed=SEED).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # biases too: init leaves them zero
            p.normal_(0, 0.2)
    layer = model.language_model.encoder.layers[0]
    prefix = "language_model.encoder.layers.0."
    weights = dict(model.named_parameters())

    def parts(module, suffix):
        name = f"{prefix}{module}.{suffix}"
        return fused_parts(table_entry(name, shape, False), shape, weights[name].detach())

    s, b, h, a, g, d = 16, 2, 64, 8, 2, 24
    x = torch.randn(s, b, h)
    with torch.no_grad():
        ours = {"attention": layer.self_attention(x), "mlp": layer.mlp(x)}
        w, bias = parts("self_attention.query_key_value", "weight"), parts("self_attention.query_key_value", "bias")
        q, k, v = (F.linear(x, w[p], bias[p]) for p in ("query", "key", "value"))  # [s, b, heads x d]
        q = q.view(s, b, a, d).permute(1, 2, 0, 3)                                     # [b, a, s, d]
        # kv head j serves query heads j a/g .. (j+1) a/g - 1
        k, v = (t.view(s, b, g, d).permute(1, 2, 0, 3).repeat_interleave(a // g, dim=1) for t in (k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        context = (scores.softmax(-1) @ v).permute(2, 0, 1, 3).reshape(s, b, a * d)
        dense = layer.self_attention.dense
        w, bias = parts("mlp.dense_h_to_4h", "weight"), parts("mlp.dense_h_to_4h", "bias")
        glu = F.silu(F.linear(x, w["gate"], bias["gate"])) * F.linear(x, w["value"], bias["value"])
        down = layer.mlp.dense_4h_to_h
        plain = {"attention": F.linear(context, dense.weight, dense.bias),
                 "mlp": F.linear(glu, down.weight, down.bias)}
    return ours, plain
