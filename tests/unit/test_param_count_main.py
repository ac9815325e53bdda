"""tools/param_count.py's main() in this process (its own tests run it as a subprocess, which
mutation testing cannot attribute): the lines the tool itself writes, the memory table's layout
taken from its flags, and its refusals, every number worked out here by hand for the tiny GPT-2
(2 layers, h 64, 4 heads, seq 32, vocab 600)."""
import importlib
import json

import pytest

# by its dotted name (tools/ as a namespace package): the name mutmut's mutants of it carry
tool = importlib.import_module("tools.param_count")

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32"]
H, S, F = 64, 32, 256
LAYER = 2 * H + 3 * H * H + 3 * H + H * H + H + 2 * H + H * F + F + F * H + H  # norms, QKV, dense, MLP
LAYER_FLOPS = 2 * S * H * 3 * H + 4 * S * S * H + 2 * S * H * H + 4 * S * H * F  # forward matmuls per sample


def run(capsys, *flags):
    tool.main([*MODEL, *flags])
    out, err = capsys.readouterr()
    return out.splitlines(), err


def test_dense_report_lines(capsys):
    lines, err = run(capsys, "--vocab-size", "600", "--pipeline-model-parallel-size", "2", "--num-gpus", "4",
                     "--global-batch-size", "8", "--checkpoint-activations", "--lr", "1e-4")
    assert err == ""  # --lr is the trainer's: ignored without a word
    total = 640 * H + S * H + 2 * LAYER + 2 * H  # vocab 600 padded to a multiple of 128
    assert total == 143_104
    assert lines[:3] == ["parameters: 143,104", f"parameters without embeddings: {total - 640 * H - S * H:,}",
                         "padded vocab size: 640 (vocab 600, multiple of 128 x TP 1)"]
    # uniform recompute runs both layers' forward again: 4 x layers + 3 x logits 2 s h V, per sample
    per_sample = 4 * 2 * LAYER_FLOPS + 3 * 2 * S * H * 640
    assert "FLOPs per sample (model, fwd+bwd, recompute): 35,127,296" in lines
    assert f"FLOPs per iteration (global batch 8): {8 * per_sample:,}" in lines
    # 4 ranks over TP x PP = 2: DP 2; micro batch 1 by default: 8 / (1 x 2) = 4 micro-batches; ZeRO 0
    assert ("memory per rank (predicted; fp32, ZeRO 0, torch optimizer, DP=2, micro batch 1 x 4, "
            "checkpointed activations):") in lines
    # the stage table of format_parameter_report and the split comparison follow
    assert "  stage | layers | params per TP rank 0 | owned params (all TP ranks)" in lines
    assert any(line.startswith("pipeline split (--pp-partition-method type:transformer") for line in lines)


def test_moe_and_pad_vocab_to_lines(capsys):
    lines, _ = run(capsys, "--vocab-size", "600", "--num-experts", "4", "--pad-vocab-size-to", "1024",
                   "--micro-batch-size", "2", "--bf16", "--zero-stage", "2")
    expert = H * F + F + F * H + H  # one expert: the dense MLP
    # layer 2: 4 experts and a router (4 x h) in place of its MLP; the final norm 2h
    total = 1024 * H + S * H + 2 * LAYER - expert + 4 * expert + 4 * H + 2 * H
    active = total - 3 * expert  # top-1
    embeddings = 1024 * H + S * H
    assert lines[:5] == [f"parameters: {total:,}", f"parameters without embeddings: {total - embeddings:,}",
                         f"active parameters: {active:,}",
                         f"active parameters without embeddings: {active - embeddings:,}",
                         "padded vocab size: 1,024 (vocab 600, --pad-vocab-size-to 1,024)"]
    assert lines[0] == "parameters: 267,200"
    # no global batch: one micro batch of 2 per rank, no FLOPs-per-iteration line
    assert not any(line.startswith("FLOPs per iteration") for line in lines)
    assert ("memory per rank (predicted; bf16, ZeRO 2, DeepSpeedZeroOptimizer, DP=1, micro batch 2 x 1):"
            in lines)


def test_vocab_file(capsys):
    lines, _ = run(capsys, "--vocab-file", "data/gpt2-vocab.json", "--make-vocab-size-divisible-by", "100",
                   "--tensor-model-parallel-size", "2")
    # the bundled vocab has 8192 entries; a multiple of 100 x 2: 8200
    assert lines[2] == "padded vocab size: 8,200 (vocab 8,192, multiple of 100 x TP 2)"


def test_flags_unknown_to_the_trainer_named_on_stderr(capsys):
    lines, err = run(capsys, "--vocab-size", "600", "--qk-layernorm", "--use-torch-fsdp2")
    assert lines[0] == "parameters: 143,104"
    assert err == ("param_count.py: ignored, not flags of pretrain_gpt.py (the numbers are for the model without "
                   "them): --qk-layernorm, --use-torch-fsdp2\n")


@pytest.mark.parametrize("flags, message", [
    ([], "give exactly one of --vocab-size, --vocab-file, or --tokenizer-type PretrainedFromHF/HFTokenizer/"
         "GPTSentencePieceTokenizer with its tokenizer"),
    (["--vocab-size", "600", "--vocab-file", "data/gpt2-vocab.json"], "give exactly one of --vocab-size"),
    (["--vocab-file", "no/such/vocab.json"], "--vocab-file no/such/vocab.json: no such file"),
    (["--vocab-file", "pretrain_gpt.py"], "--vocab-file pretrain_gpt.py: not a GPT-2 vocab.json ("),
    (["--vocab-size", "600", "--num-gpus", "3", "--pipeline-model-parallel-size", "2"],
     "--world-size 3 is not divisible by TP x PP = 2"),
    (["--vocab-size", "600", "--num-gpus", "6", "--ds-sequence-parallel-size", "4"],
     "--world-size 6 is not divisible by TP x PP x SP = 4"),
    (["--vocab-size", "600", "--fp16", "--bf16"], "--fp16 and --bf16 are exclusive: pick one"),
    # the ds_config key the flag sets, where DeepSpeed's engine would raise: 16-bit weights at ZeRO 0
    (["--vocab-size", "600", "--bf16", "--accumulate-allreduce-grads-in-fp32"],
     "--accumulate-allreduce-grads-in-fp32 with bf16 weights needs ZeRO: DeepSpeed accumulates bf16 gradients in "
     "fp32 only in its ZeRO / BF16 optimizers (at stage 0 it refuses the mix); use --zero-stage 1"),
    (["--vocab-size", "600", "--num-gpus", "2", "--micro-batch-size", "2", "--global-batch-size", "6"],
     "--global-batch-size 6 is not divisible by --micro-batch-size 2 x data-parallel size 2"),
    # the ramp-up rule that needs the DP size: a start batch of 2 does not split over 4 ranks
    (["--vocab-size", "600", "--num-gpus", "4", "--global-batch-size", "8", "--rampup-batch-size", "2", "2", "10"],
     "--rampup-batch-size: start batch 2 is not divisible by --micro-batch-size 1 x data-parallel size 4"),
    (["--vocab-size", "600", "--zero-stage", "4"], "--zero-stage 4 does not exist: use 0, 1, 2 or 3"),
    (["--vocab-size", "600", "--num-layers", "3", "--pipeline-model-parallel-size", "4"],
     "--num-layers 3 is smaller than --pipeline-model-parallel-size 4"),
])
def test_refusals_are_one_line_exit_2(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_:
        tool.main([*MODEL, *flags])
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and out == ""
    [line] = err.splitlines()
    assert line.startswith(f"param_count.py: error: {message}"), line


def test_block_recompute_and_batch_without_global_batch(capsys):
    lines, _ = run(capsys, "--num-layers", "6", "--vocab-size", "600", "--pipeline-model-parallel-size", "2",
                   "--checkpoint-activations", "--activations-checkpoint-method", "block", "--checkpoint-num-layers",
                   "2", "--num-gpus", "4", "--micro-batch-size", "2")
    # 3 layers a stage, the first 2 of each recomputed: 3 x 6 layers + 4 recomputed + 3 x logits
    per_sample = 3 * 6 * LAYER_FLOPS + 4 * LAYER_FLOPS + 3 * 2 * S * H * 640
    assert (f"FLOPs per sample (model, fwd+bwd, recompute of the first 2 layer(s) of each stage): {per_sample:,}"
            in lines)
    # DP 2, no global batch: one micro batch of 2 per rank
    assert ("memory per rank (predicted; fp32, ZeRO 0, torch optimizer, DP=2, micro batch 2 x 1, checkpointed "
            "activations (block: first 2 layer(s) of each stage)):") in lines


def test_uniform_recompute_at_pp1(capsys):
    lines, _ = run(capsys, "--vocab-size", "600", "--checkpoint-activations")
    # both layers run forward again: 4 x 2 layers + 3 x logits
    per_sample = 4 * 2 * LAYER_FLOPS + 3 * 2 * S * H * 640
    assert f"FLOPs per sample (model, fwd+bwd, recompute): {per_sample:,}" in lines


def test_split_comparison_follows(capsys):
    """4 layers at PP 2 with a vocab of 8000 (padded to 8064): the default split puts layers 3-4 and
    the logits (2 s h V = 33,030,144 forward FLOPs, ~10 layers' worth) on stage 1; the flops split
    moves all 4 layers to stage 0: the slowest stage goes from 2 layers + logits to the logits alone."""
    lines, _ = run(capsys, "--num-layers", "4", "--vocab-size", "8000", "--pipeline-model-parallel-size", "2")
    logits = 2 * S * H * 8064
    speedup = (2 * LAYER_FLOPS + logits) / logits
    assert f"{speedup:.2f}" == "1.21"
    assert any(line.startswith("--pp-partition-method flops would split otherwise: predicted speed-up 1.21x")
               for line in lines)


def test_help_names_the_tool_and_its_world_size_flag(capsys):
    with pytest.raises(SystemExit):
        tool.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "python tools/param_count.py" not in out  # the description is the docstring's first line only
    assert ("Exact parameter count, FLOPs and memory per rank of a GPT from Megatron flags, without building a "
            "model.") in out
    assert ("--world-size WORLD_SIZE, --num-gpus WORLD_SIZE ranks in the job (default TP x PP x SP: DP = 1); sets "
            "the memory table's data-parallel size") in out
    assert ("--ds-sequence-parallel-size DS_SEQUENCE_PARALLEL_SIZE DeepSpeed-Ulysses SP ranks per replica: the memory "
            "table's activations and ZeRO partitions") in out


def test_ulysses_flops_per_sp_rank(capsys):
    """--ds-sequence-parallel-size 2 (an integer, from the command line's text): the report names SP and
    each SP rank's half of the FLOPs per sample (no recompute: 3 x the layers' forward and the logits)."""
    lines, err = run(capsys, "--vocab-size", "600", "--ds-sequence-parallel-size", "2", "--num-gpus", "4")
    assert err == ""
    per_sample = 3 * 2 * LAYER_FLOPS + 3 * 2 * S * H * 640
    assert f"FLOPs per sample (model, fwd+bwd): {per_sample:,}" in lines
    assert f"FLOPs per sample per SP rank (DeepSpeed-Ulysses, SP=2): {per_sample // 2:,}" in lines
    assert any("(TP=1 PP=1 SP=2, padded vocab 640)" in line for line in lines)
    assert any("DP=2 x SP=2 (ZeRO over 4 ranks)" in line for line in lines)


def test_abbreviations_are_not_flags(capsys):
    """pretrain_gpt.py takes no abbreviated flags (allow_abbrev=False), so neither does the tool: an
    abbreviated model flag is missing, an abbreviated trainer flag is named as unknown."""
    with pytest.raises(SystemExit):
        tool.main(["--num-lay", "2", *MODEL[2:], "--vocab-size", "600"])
    assert capsys.readouterr().err == "param_count.py: error: --num-layers is required\n"
    _, err = run(capsys, "--vocab-size", "600", "--log-int", "5", "--deepspeed", "--deepspeed_config", "ds.json",
                 "--zero-stage", "1")
    assert err.endswith("them): --log-int\n")


def test_vocab_from_a_tokenizers_file(capsys, tmp_path):
    """HFTokenizer counts tokenizer.json's base vocab: a word-level vocab of 5 words, padded to 128;
    a file the tokenizers library cannot parse is one line naming the flag."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[UNK]": 0, "a": 1, "b": 2, "c": 3, "d": 4}
    tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]")).save(str(tmp_path / "tok.json"))
    lines, _ = run(capsys, "--tokenizer-type", "HFTokenizer", "--tokenizer-model", str(tmp_path / "tok.json"),
                   "--zero-stage", "3")
    assert lines[2] == "padded vocab size: 128 (vocab 5, multiple of 128 x TP 1)"
    (tmp_path / "bad.json").write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(SystemExit):
        tool.main([*MODEL, "--tokenizer-type", "HFTokenizer", "--tokenizer-model", str(tmp_path / "bad.json")])
    err = capsys.readouterr().err
    assert err.startswith(f"param_count.py: error: --tokenizer-model {tmp_path / 'bad.json'}: {tmp_path / 'bad.json'} "
                          "is not a tokenizers file (") and len(err.splitlines()) == 1


@pytest.mark.parametrize("precision, weight_bytes", [([], 4), (["--bf16"], 2)], ids=["fp32", "bf16"])
def test_zero1_state_rows_by_hand(capsys, precision, weight_bytes):
    """ZeRO 1 over 2 ranks (DeepSpeed-Ulysses SP 2) of the rotary, 4 query / 2 kv head model: the
    table's row (the most loaded rank, 1) by hand. DeepSpeed's two param groups in parameter order:
    matrices (word embedding 640 x 64; per layer QKV (4 + 2 x 2) x 16 x 64, dense 64^2, MLP 64 x 256
    twice) and vectors (per layer 2 norms of 2 x 64, QKV bias 128, dense bias 64, MLP biases 256 +
    64; the final norm 128), both multiples of 2 x 2 (no padding). Weights: the flat 16- or 32-bit
    copy; optimizer: fp32 master, exp_avg, exp_avg_sq of half of each group and a 4-byte step per
    group; gradients (the weights' dtype): the whole parameters overlapping rank 1's half of each."""
    lines, _ = run(capsys, "--vocab-size", "600", "--position-embedding-type", "rotary", "--num-key-value-heads", "2",
                   "--ds-sequence-parallel-size", "2", "--num-gpus", "2", "--zero-stage", "1", "--micro-batch-size",
                   "2", "--global-batch-size", "4", *precision)
    layer_matrices = [8 * 16 * H, H * H, H * F, F * H]
    matrices = [640 * H] + layer_matrices * 2
    vectors = [H, H, 128, H, H, H, F, H] * 2 + [H, H]
    assert (sum(matrices), sum(vectors)) == (131_072, 1_664)
    # rank 1's half of the matrices starts at 65,536, inside layer 1's h->4h (53,248 .. 69,632): that
    # one and everything after; of the vectors at 832: layer 2's first norm bias on
    rank1_grads = H * F + F * H + sum(layer_matrices) + 1_664 - 832
    assert rank1_grads == 78_656
    header = next(i for i, line in enumerate(lines) if line.startswith("memory per rank"))
    row = [int(c.replace(",", "")) for c in lines[header + 2].split("|")]
    assert row[:5] == [0, 1, weight_bytes * 132_736, weight_bytes * rank1_grads, 12 * (131_072 + 1_664) // 2 + 8]
