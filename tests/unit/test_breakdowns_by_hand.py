"""Numbers the code prints, worked out by hand in the test (issue 30 item 2), in-process:
the memory table's rows of one configuration, the log line's TFLOPs and MFU of a real model's
FLOPs, and tools/param_count.py's totals for every published script's whole flag list, each from
a formula written out here from the flags, never from the code's own table or functions."""
import importlib
import json
import os
from types import SimpleNamespace

import pytest
import torch

from megatron.metrics.config import LoggingConfig
from megatron.metrics.memory import TrainingSetup, format_memory_report
from megatron.metrics.mfu import MfuSettings
from megatron.metrics.processor import MetricsProcessor
from megatron.metrics.training_log import IntervalStats
from megatron.model.analytic import analytic_parameter_counts
from megatron.model.shape import ModelShape
from megatron.utils import cache_parameter_counts
from tests.support.published_scripts import SCRIPTS, for_the_tool, load, with_local_tokenizer

# the tiny GPT-2 of these tests: 2 layers, h 64, 4 heads, seq 32, vocab 600 -> padded to 640
L, H, HEADS, S, V = 2, 64, 4, 32, 640
F = 4 * H
PER_LAYER = (2 * H          # input_layernorm
             + 3 * H * H + 3 * H   # query_key_value
             + H * H + H           # dense
             + 2 * H               # post_attention_layernorm
             + H * F + F           # dense_h_to_4h
             + F * H + H)          # dense_4h_to_h
TOTAL = V * H + S * H + L * PER_LAYER + 2 * H  # word + position embeddings, layers, final norm
TENSORS = 2 + 12 * L + 2  # embeddings, 12 weights/biases per layer, the final norm's two


def tiny_shape(**kw):
    return ModelShape(num_layers=L, hidden_size=H, num_attention_heads=HEADS, seq_length=S, vocab_size=600, **kw)


def table_rows(lines):
    """The memory table's stage rows as lists of integers."""
    return [[int(c.replace(",", "")) for c in line.split("|")] for line in lines if line.strip()[:1].isdigit()]


def test_memory_rows_by_hand_fp32_zero0():
    """fp32, ZeRO 0, DP 1, torch AdamW, micro batch 2 x 1, sdpa, no dropout, no recompute."""
    assert TOTAL == 143_104
    setup = TrainingSetup(micro_batch_size=2)
    [row] = table_rows(format_memory_report(tiny_shape(), setup))
    weights = grads = 4 * TOTAL                      # fp32 weights; every parameter gets a gradient
    optimizer = 2 * 4 * TOTAL + 4 * TENSORS          # exp_avg, exp_avg_sq, and a 0-dim fp32 step per tensor
    b, sb = 2, 2 * S
    # per layer: LayerNorm in/out 4sbh, QKV out 3sbh, context sbh, h->4h and GeLU out 2sbf (fp32),
    # LayerNorm statistics 2 x 2 fp32 per token, sdpa's fp32 logsumexp b x heads x s
    layer = 4 * sb * (4 * H + 4 * H + 2 * F) + 4 * 4 * sb + 4 * b * HEADS * S
    embedding = 8 * b * S + 8 * S                    # int64 token ids and position ids
    head = (2 * 4 * sb * H + 2 * 4 * sb             # final LayerNorm in/out and statistics
            + 4 * sb * V                            # fp32 softmax over the padded vocab
            + sb * (1 + 8) + 4 * sb + 4)            # outside-vocab mask, local ids; loss mask, count
    activations = L * layer + embedding + head      # one micro-batch in flight at PP 1
    assert row == [0, 0, weights, grads, optimizer, activations, weights + grads + optimizer + activations]
    assert row[2:] == [572_416, 572_416, 1_144_944, 727_108, 3_016_884]


def test_memory_rows_by_hand_bf16_zero1_dp2():
    """bf16, ZeRO 1 at DP 2 (DeepSpeedZeroOptimizer): each param group is flattened, padded to a
    multiple of 2 x DP and sliced; rank d keeps the gradients of the whole parameters that overlap
    its slice."""
    setup = TrainingSetup(precision="bf16", zero_stage=1, data_parallel_size=2, micro_batch_size=1)
    shape = tiny_shape()
    matrices = [V * H, S * H] + [3 * H * H, H * H, H * F, F * H] * L   # the weight-decay group, in order
    vectors = [2 * H + 3 * H + H + 2 * H + F + H] * L + [2 * H]         # biases and norms (sizes only)
    assert sum(matrices) + sum(vectors) == TOTAL
    m_flat, v_flat = sum(matrices), sum(vectors)        # both already multiples of 4
    assert m_flat % 4 == 0 and v_flat % 4 == 0
    weights = 2 * (m_flat + v_flat)
    optimizer = sum(3 * 4 * (flat // 2) + 4 for flat in (m_flat, v_flat))  # fp32 master + 2 moments + step

    def grads(rank):
        total = 0
        # 1-D tensors in model.parameters() order: input_layernorm weight and bias, the QKV and dense
        # biases, post_attention_layernorm weight and bias, the two MLP biases; the final norm's two
        for sizes in (matrices, [H, H, 3 * H, H, H, H, F, H] * L + [H, H]):
            half, offset = sum(sizes) // 2, 0
            for n in sizes:  # whole parameters overlapping [rank x half, (rank + 1) x half)
                if rank * half <= offset < (rank + 1) * half or offset < rank * half < offset + n:
                    total += 2 * n
                offset += n
        return total
    # the word embedding alone is past half of the matrices: rank 0 keeps it, rank 1 the rest
    assert grads(0) != grads(1)
    rows = table_rows(format_memory_report(shape, setup))
    [row] = rows
    top = max((0, 1), key=lambda r: grads(r))
    assert row[:5] == [0, top, weights, grads(top), optimizer]


def test_log_line_tflops_and_mfu_of_a_real_model_by_hand(capsys):
    """The tiny model's FLOPs per sample (with recompute of both layers) worked out by hand, cached
    the way the trainer caches them, then one log line: 16 samples in 0.1 ms on 2 ranks."""
    shape = tiny_shape()
    args = SimpleNamespace(model_shape=shape, checkpoint_activations=True, activations_checkpoint_method="uniform",
                           checkpoint_num_layers=1)
    cache_parameter_counts(args, analytic_parameter_counts(shape))
    layer = 2 * S * H * 3 * H + 4 * S * S * H + 2 * S * H * H + 4 * S * H * F  # forward matmuls of one layer
    logits = 2 * S * H * V
    model = 3 * (L * layer + logits)          # forward + backward (2 x forward)
    hardware = model + L * layer              # + one forward of every recomputed layer
    assert (args.model_flops_per_sample, args.flops_per_sample) == (model, hardware)
    config = LoggingConfig(log_interval=1, tensorboard_dir=None, tensorboard_queue_size=1, writes_tensorboard=False,
                           log_batch_size_to_tensorboard=False, log_timers_to_tensorboard=False,
                           log_validation_ppl_to_tensorboard=False, log_params_norm=False,
                           log_num_zeros_in_grad=False, log_optimizer_states_to_tensorboard=False, world_size=2,
                           data_parallel_size=2, seq_length=S, model_shape=shape, memory=TrainingSetup(),
                           mfu=MfuSettings(peak_tflops_per_device=10.0, reason="a 10 TFLOP/s peak"))
    stats = IntervalStats()
    stats.add(torch.tensor(1.0), samples=16, applied=True)
    MetricsProcessor(config, cache=args).log_training(
        stats, elapsed=1e-4, lr=1e-3, grad_norm=None, loss_scale=None, global_batch_size=16,
        progress=SimpleNamespace(iteration=1, consumed_train_samples=16, consumed_train_tokens=16 * S,
                                 gigaflos_no_embeds=0.0), total_iterations=1)
    line = capsys.readouterr().out
    assert (model, hardware) == (28_311_552, 35_127_296)
    # TFLOPs: 35,127,296 x 16 / (1e-4 s x 2 ranks) / 1e12 = 2.81; MFU: 28,311,552 x 16 / 1e-4 / 2 / 1e13 = 22.65 %
    assert " samples per second: 160000.000 | TFLOPs: 2.81 | MFU: 22.65% |" in line


# --- tools/param_count.py takes each published script's whole flag list ------------------------

def last_values(argv):
    """flag -> the value given last (a later repeat wins, as argparse does); a switch -> True."""
    out = {}
    for i, tok in enumerate(argv):
        if tok.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[tok] = True if nxt is None or nxt.startswith("--") else nxt
    return out


def hand_total(flags, vocab):
    """A dense GPT's parameter count from the script's flags, Megatron-DeepSpeed's modules."""
    get = flags.get
    h, layers, heads = int(get("--hidden-size")), int(get("--num-layers")), int(get("--num-attention-heads"))
    tp = int(get("--tensor-model-parallel-size", 1))
    d = int(get("--kv-channels", h // heads))
    kv = int(get("--num-key-value-heads", heads))
    glu = get("--swiglu") is True or get("--glu-activation") is not None
    ffn = int(get("--ffn-hidden-size", int(8 * h / 3 / 64) * 64 if glu else 4 * h))
    bias = get("--disable-bias-linear") is not True
    norm = h if get("--normalization") == "rmsnorm" else 2 * h
    if get("--pad-vocab-size-to"):
        padded = int(get("--pad-vocab-size-to"))
    else:
        multiple = int(get("--make-vocab-size-divisible-by", 128)) * tp
        padded = -(-vocab // multiple) * multiple
    learned = (get("--position-embedding-type", "learned_absolute") == "learned_absolute"
               and get("--use-rotary-position-embeddings") is not True and get("--no-position-embedding") is not True)
    positions = int(get("--max-position-embeddings", get("--seq-length")))
    qkv = h * (heads + 2 * kv) * d + (bias and (heads + 2 * kv) * d)
    dense = heads * d * h + (bias and h)
    mlp = h * ffn * (2 if glu else 1) + (bias and ffn * (2 if glu else 1)) + ffn * h + (bias and h)
    total = layers * (2 * norm + qkv + dense + mlp) + norm + padded * h
    total += learned * positions * h + (get("--embed-layernorm") is True) * norm
    total += (get("--untie-embeddings-and-output-weights") is True) * padded * h
    return total


@pytest.mark.parametrize("path", SCRIPTS, ids=[os.path.basename(p)[:-4] for p in SCRIPTS])
def test_param_count_takes_the_whole_list(path, hf_tokenizer_dir, sentencepiece_model):
    """Every flag of the script is one the trainer knows, the tool reads the values the list gives
    last, and its total is the count worked out here from the whole list (MoE scripts: the
    experts' own tests, tests/integration/test_moe.py, hold the hand-derived MoE-64 total)."""
    # by its dotted name (tools/ as a namespace package): the name mutmut's mutants of it carry
    tool = importlib.import_module("tools.param_count")
    argv = for_the_tool(with_local_tokenizer(load(path), hf_tokenizer_dir, sentencepiece_model))
    args = tool.parse_args(argv)
    assert args.ignored_flags == []
    flags = last_values(argv)
    shape = args.model_shape
    assert (shape.num_layers, shape.hidden_size, shape.seq_length) == (
        int(flags["--num-layers"]), int(flags["--hidden-size"]), int(flags["--seq-length"]))
    lines = tool.report(args)
    assert lines[0].startswith("parameters: ")
    assert any(line.startswith("memory per rank (predicted;") for line in lines)
    if int(flags.get("--num-experts", 1)) > 1:
        return
    if "--vocab-file" in flags:
        with open(flags["--vocab-file"]) as f:
            vocab = len(json.load(f))
    elif flags.get("--tokenizer-type") == "GPTSentencePieceTokenizer":
        import sentencepiece
        vocab = sentencepiece.SentencePieceProcessor(model_file=sentencepiece_model).get_piece_size()
    else:
        import transformers
        vocab = len(transformers.AutoTokenizer.from_pretrained(hf_tokenizer_dir))
    assert lines[0] == f"parameters: {hand_total(flags, vocab):,}"
