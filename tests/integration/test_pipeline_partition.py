"""The pipeline split (--pp-partition-method): DeepSpeed's methods give exactly the split DeepSpeed's
PipelineModule builds (read from the built module's `parts` on real gloo ranks), the default is the
forks' type:transformer, flops balances each stage's FLOPs, and counts, memory and
tools/param_count.py follow the split.

Items are GPTModelPipe's layer specs: 0 embedding, 1..L transformer layers, L+1 final norm,
L+2 output layer (the tied embedding copy); `parts` are the P + 1 item boundaries."""
import json
import os
import subprocess
import sys

import pytest

from megatron.model.analytic import layers_per_stage, stage_parts
from megatron.model.shape import ModelShape
from megatron.runtime.refusal import ConfigError

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")
ROOT = os.path.dirname(os.path.dirname(HERE))
# this checkout's megatron, not whichever one `pip install -e` registered
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, HERE])}


def bloom(method, pp=12, **overrides):
    """BLOOM-176B: 70 layers, hidden 14336, 112 heads, seq 2048, vocab 250,880 (already padded), TP=4."""
    fields = dict(num_layers=70, hidden_size=14336, num_attention_heads=112, seq_length=2048, vocab_size=250880,
                  tensor_model_parallel_size=4, pipeline_model_parallel_size=pp, pp_partition_method=method)
    fields.update(overrides)
    return ModelShape(**fields)


def stages(counts):
    """Boundaries for stages of `counts` items each."""
    parts = [0]
    for n in counts:
        parts.append(parts[-1] + n)
    return parts


# BLOOM-like, 70 layers at PP=12 (73 items), by hand:
# type:transformer: weights 0, 1 x 70, 0, 0. 70 = 12 x 5 + 10: ten stages of 6 layers and two of 5
# (spread 1, the least possible); DeepSpeed breaks ties by cutting later, which puts the 5s last;
# the embedding joins stage 0, the weightless norm and output layer the last stage.
TYPE_TRANSFORMER = stages([7] + [6] * 9 + [5, 7])                # layers 6 x 10, 5, 5
# type:transformer|embedding (BLOOM's scripts): 72 unit items, 6 per stage exactly (spread 0):
# stage 0 = embedding + 5 layers, the last = 5 layers + norm (weight 0) + output layer
TYPE_TRANSFORMER_EMBEDDING = stages([6] * 11 + [7])              # layers 5, 6 x 10, 5
# uniform: 73 items = 12 x 6 + 1, the first stage takes the extra item (embedding + 6 layers);
# the last 6 items are layers 67-70, the norm and the output layer
UNIFORM = stages([7] + [6] * 11)                                 # layers 6 x 11, 4


def test_deepspeed_methods_on_bloom_176b():
    assert list(stage_parts(bloom("type:transformer"))) == TYPE_TRANSFORMER
    assert layers_per_stage(bloom("type:transformer")) == [6] * 10 + [5, 5]
    assert list(stage_parts(bloom("type:transformer|embedding"))) == TYPE_TRANSFORMER_EMBEDDING
    assert layers_per_stage(bloom("type:transformer|embedding")) == [5] + [6] * 10 + [5]
    assert list(stage_parts(bloom("uniform"))) == UNIFORM


def test_flops_balances_flops_on_bloom_176b():
    """Forward per sample, s = 2048, h = 14336: a layer 24 s h^2 + 4 s^2 h
    = 10,101,763,080,192 + 240,518,168,576 = 10,342,281,248,768; the logits 2 s h V
    = 2 x 2048 x 14336 x 250880 = 14,731,737,825,280 (1.42 layers). The bottleneck is at least 6
    layers: were the first 11 stages at most 5 layers each, the last would hold at least 15. The last
    stage fits 4 layers + the head (5.42 layers) but not 5 (6.42), so the first 11 stages hold 66
    layers, 6 each: the only split with that bottleneck, so the last stage gets 2 fewer."""
    assert 24 * 2048 * 14336 ** 2 + 4 * 2048 ** 2 * 14336 == 10_342_281_248_768
    assert 4 * 10_342_281_248_768 + 14_731_737_825_280 < 6 * 10_342_281_248_768 < 5 * 10_342_281_248_768 + \
        14_731_737_825_280
    assert layers_per_stage(bloom("flops")) == [6] * 11 + [4]
    assert list(stage_parts(bloom("flops"))) == stages([7] + [6] * 10 + [6])


def test_flops_puts_the_weightless_moe_loss_item_with_the_later_stage():
    """MoE, 2 layers (both MoE: 4 experts), hidden 64, seq 32, vocab 8192, PP=2; items: embedding,
    2 layers, `take` (the function that keeps the moe loss: no parameters, no FLOPs), norm, output
    layer. Forward per sample: the logits 2 s h V = 2 x 32 x 64 x 8192 = 33,554,432; an MoE layer
    with top-2 = attention 8 s h^2 + 4 s^2 h, two experts 2 x 16 s h^2 and the router 2 s h x 4 =
    5,521,408. Both layers together cost less than the logits, so the output layer's stage is the
    bottleneck and holds nothing else that costs FLOPs. Among those splits the largest
    stage in parameters is stage 0 (the embedding and every expert): the norm's 128 parameters move
    to the last stage. `take` weighs nothing either way; on such a tie the cut comes earlier, so it
    goes with the later stage: [embedding, 2 layers | take, norm, output layer]."""
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=8192,
                       max_position_embeddings=32, num_experts=(4,), topk=2, pipeline_model_parallel_size=2,
                       pp_partition_method="flops")
    s, h = 32, 64
    assert 2 * s * h * 8192 == 33_554_432 > 2 * (8 * s * h * h + 4 * s * s * h + 2 * 16 * s * h * h + 2 * s * h * 4) \
        == 2 * 5_521_408
    assert list(stage_parts(shape)) == [0, 3, 6]


def test_split_that_deepspeed_builds():
    """GPTModelPipe on real gloo ranks (DeepSpeed's PipelineModule partitions, we only read its
    `parts`): BLOOM-like 70 layers at PP=12 with BLOOM's vocabulary (hidden 16 to stay small), and a
    `parameters` split where the tied embedding weighs two layers."""
    tiny_bloom = dict(num_layers=70, hidden_size=16, num_attention_heads=2, vocab_size=250880)
    # `parameters`, by hand: hidden 16, seq 16, vocab 394 (no padding): embedding 394*16 + 16*16 =
    # 6,560 = 2 layers of 12*16^2 + 13*16 = 3,280; norm 32. Items 6560, 3280 x 4, 32, 6560 over 3
    # stages: [emb, L1 | L2-L4 | norm, emb] = 9,840 | 9,840 | 6,592 (spread 3,248); the next best,
    # [emb, L1 | L2, L3 | L4, norm, emb] = 9,840 | 6,560 | 9,872, spreads 3,312
    weighted = dict(num_layers=4, hidden_size=16, num_attention_heads=2, vocab_size=394, make_vocab_size_divisible_by=1,
                    pp_partition_method="parameters")
    configs = [({**tiny_bloom, "pp_partition_method": "type:transformer"}, 12),
               ({**tiny_bloom, "pp_partition_method": "type:transformer|embedding"}, 12),
               ({**tiny_bloom, "pp_partition_method": "uniform"}, 12),
               (weighted, 3)]
    proc = subprocess.run([sys.executable, os.path.join(HERE, "pipe_split_build.py")], input=json.dumps(configs),
                          capture_output=True, text=True, timeout=300, cwd=HERE,
                          env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    assert built == [TYPE_TRANSFORMER, TYPE_TRANSFORMER_EMBEDDING, UNIFORM, [0, 2, 5, 7]]
    analytic = [list(stage_parts(ModelShape(pipeline_model_parallel_size=pp, seq_length=16, **fields)))
                for fields, pp in configs]
    assert analytic == built


@pytest.mark.parametrize("method, message", [
    ("profile", "--pp-partition-method profile is unknown; use type:transformer (the default), flops, uniform, "
                "parameters, type:REGEX"),
    ("type:attention", "--pp-partition-method type:attention matches none of the layers (EmbeddingPipe, LayerNorm, "
                       "ParallelTransformerLayerPipe)"),
    ("type:[", "--pp-partition-method type:[: not a regular expression"),
])
def test_bad_method_is_one_line(method, message):
    with pytest.raises(ConfigError) as e:
        bloom(method)
    assert str(e.value).startswith(message)
    proc = subprocess.run([sys.executable, "tools/param_count.py", "--num-layers", "4", "--hidden-size", "64",
                           "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "600",
                           "--pipeline-model-parallel-size", "2", "--pp-partition-method", method],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=ENV)
    assert proc.returncode == 2 and proc.stderr.startswith(f"param_count.py: error: {message}")


def test_param_count_tool_shows_each_stage():
    """BLOOM-176B planned at TP=4 PP=12: each stage's items, FLOPs share and parameters."""
    proc = subprocess.run([sys.executable, "tools/param_count.py", "--num-layers", "70", "--hidden-size", "14336",
                           "--num-attention-heads", "112", "--seq-length", "2048", "--vocab-size", "250880",
                           "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "12",
                           "--pp-partition-method", "type:transformer|embedding", "--bf16"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, check=True, env=ENV)
    out = proc.stdout
    assert "pipeline split (--pp-partition-method type:transformer|embedding):" in out
    # FLOPs share of stage 0: 5 layers of the 70 layers + logits (fwd: 10,342,281,248,768 each, and
    # 14,731,737,825,280): 5 x L / (70 x L + V) = 7.00%
    share = 5 * 10_342_281_248_768 / (70 * 10_342_281_248_768 + 14_731_737_825_280)
    assert f"{100 * share:.2f}%" == "7.00%"
    assert "      0 | embedding, layers 1-5 " in out and "| 7.00%" in out
    assert "     11 | layers 66-70, norm, output layer " in out


def test_the_default_is_the_forks_type_transformer():
    """Without --pp-partition-method BLOOM-176B splits as BigScience's fork splits it (its launch
    scripts aside, which pass type:transformer|embedding), and the issue's two examples: the
    universal-checkpoint example's 4 layers at PP2 2 | 2 (flops: 4 | 0), a 12-layer model 6 | 6 (8 | 4)."""
    assert list(stage_parts(bloom(None))) == TYPE_TRANSFORMER
    for layers, default, flops in ((4, [2, 2], [4, 0]), (12, [6, 6], [8, 4])):
        shape = dict(num_layers=layers, hidden_size=768, num_attention_heads=12, seq_length=1024, vocab_size=50257,
                     pipeline_model_parallel_size=2)
        assert layers_per_stage(ModelShape(**shape)) == default
        assert layers_per_stage(ModelShape(**shape, pp_partition_method="flops")) == flops


def _tool(*flags):
    return subprocess.run([sys.executable, "tools/param_count.py", "--num-layers", "12", "--hidden-size", "768",
                           "--num-attention-heads", "12", "--seq-length", "1024", "--vocab-size", "50257",
                           "--pipeline-model-parallel-size", "2", "--micro-batch-size", "1", "--global-batch-size", "8",
                           *flags], capture_output=True, text=True, timeout=60, cwd=ROOT, check=True, env=ENV).stdout


def _memory_table(out):
    """{stage: total bytes} from the memory table's rows."""
    rows = [line.split("|") for line in out.splitlines() if line.startswith("      ") and line.count("|") == 6]
    return {int(row[0]): int(row[6].replace(",", "")) for row in rows}


def test_report_compares_the_balanced_split_when_it_differs():
    """GPT-2 small (12 layers, h 768, s 1024, vocab 50257 -> 50304) at PP2, micro batch 1 x 8. Forward
    per sample: a layer L = 24 s h^2 + 4 s^2 h = 17,716,740,096, the logits G = 2 s h V =
    79,121,350,656. type:transformer, 6 | 6: slowest stage 6 L + G = 185,421,791,232; flops, 8 | 4:
    max(8 L, 4 L + G) = 149,988,311,040: predicted speed-up 1.24x. Each stage's memory under both
    splits is the memory table's of the run with each split (weights, gradients, Adam and the
    activations of the micro-batches in flight: the first stage keeps 2, so its 2 more layers
    cost it more than the last stage saves)."""
    s, h, V = 1024, 768, 50304
    L, G = 24 * s * h * h + 4 * s * s * h, 2 * s * h * V
    assert (L, G) == (17_716_740_096, 79_121_350_656)
    speedup = (6 * L + G) / max(8 * L, 4 * L + G)
    assert f"{speedup:.2f}" == "1.24"
    default, flops = _tool(), _tool("--pp-partition-method", "flops")
    now, balanced = _memory_table(default), _memory_table(flops)
    assert balanced[0] > now[0] and balanced[1] < now[1]
    lines = default.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("--pp-partition-method flops would"))
    gib = 2 ** 30
    assert lines[i] == (f"--pp-partition-method flops would split otherwise: predicted speed-up 1.24x (the slowest "
                        f"stage's FLOPs), memory per rank (predicted) {max(now.values()) / gib:.2f} GiB -> "
                        f"{max(balanced.values()) / gib:.2f} GiB on the most loaded stage")
    assert lines[i + 2:i + 4] == [
        f"      0 | {'embedding, layers 1-6':34s} | {now[0]:15,} | {'embedding, layers 1-8':34s} | {balanced[0]:15,}",
        f"      1 | {'layers 7-12, norm, output layer':34s} | {now[1]:15,} | {'layers 9-12, norm, output layer':34s} | "
        f"{balanced[1]:15,}"]
    # no comparison with the balanced split itself, nor where the two agree (4 layers, vocab 64: 2 | 2 both)
    assert "would split otherwise" not in flops
    small = subprocess.run([sys.executable, "tools/param_count.py", "--num-layers", "4", "--hidden-size", "64",
                            "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "64",
                            "--pipeline-model-parallel-size", "2"], capture_output=True, text=True, timeout=60,
                           cwd=ROOT, check=True, env=ENV).stdout
    assert "pipeline split (--pp-partition-method type:transformer, the default" in small
    assert "would split otherwise" not in small
