"""Megatron sequence parallelism (--sequence-parallel): TP=2 with the norms, dropouts and residuals
on sequence shards computes what one rank computes. The references never take a sequence-parallel
path: the TP=1 model and a one-rank training run; the memory reference is what the ranks measure
(megatron/metrics/memory_measure.py) and numbers worked out by hand."""
import json
import re

import pytest
import torch

from megatron.runtime.refusal import ConfigError
from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config
from tests.support.validated_args import validated

S, B, H, LAYERS = 16, 2, 32, 2  # tiny_config and tiny_batch


def _forward_backward(sequence_parallel):
    from torch.utils.flop_counter import FlopCounterMode

    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    config = tiny_config(sequence_parallel=sequence_parallel, attention_impl="math")  # math: countable matmuls
    model = GPTModel(config, seed=SEED)
    hooked = mpu.install_sequence_parallel_grad_allreduce(model)
    tokens, labels, loss_mask = tiny_batch(config)
    hidden = model.language_model(tokens)  # what a pipeline stage sends on
    with FlopCounterMode(display=False) as flops:
        loss = model(tokens, labels, loss_mask)
        loss.backward()
    grads = {n: (p.grad.clone(), getattr(p, "partition_dim", None), getattr(p, "sequence_parallel", False))
             for n, p in model.named_parameters()}
    # dropout on sequence shards: every TP rank draws its own mask (model-parallel RNG)
    dropped = GPTModel(tiny_config(sequence_parallel=sequence_parallel, hidden_dropout=0.5), seed=SEED)
    mask = dropped.language_model.embedding(tokens) == 0
    return {"loss": loss.item(), "grads": grads, "hooked": hooked, "hidden_shape": tuple(hidden.shape),
            "flops": flops.get_total_flops(), "mask": mask}


def test_tp2_sequence_parallel_equals_one_rank():
    [ref] = run_distributed(1, _forward_backward, False)
    sp = run_distributed(2, _forward_backward, True, tp=2)
    # by hand: per layer two norms (weight, bias) and two row-parallel biases, plus the final norm's two
    assert [r["hooked"] for r in sp] == [LAYERS * 6 + 2] * 2
    for rank, out in enumerate(sp):
        assert out["hidden_shape"] == (S // 2, B, H)  # [s/tp, b, h] between layers and stages
        assert abs(out["loss"] - ref["loss"]) < 1e-6
        for name, (grad, dim, _) in out["grads"].items():
            ref_grad = ref["grads"][name][0]
            expected = ref_grad if dim is None else ref_grad.chunk(2, dim=dim)[rank]
            torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6, msg=name)
        # the same matrix multiplications, split over 2 ranks: FLOPs per sample do not change
        assert 2 * out["flops"] == ref["flops"]
    tagged = {n for n, (_, _, tag) in sp[0]["grads"].items() if tag}
    assert tagged == {n for n in sp[0]["grads"] if "layernorm" in n or n.endswith(("dense.bias", "4h_to_h.bias"))}
    assert sp[0]["mask"].shape == (S // 2, B, H)
    assert not torch.equal(sp[0]["mask"], sp[1]["mask"])


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


def _line(out, prefix):
    return next(ln for ln in out.splitlines() if ln.startswith(prefix))


def _activations(out):
    """{rank: (estimate, measured)} from the 'memory after the first iteration' table."""
    table = out[out.index("memory after the first iteration"):].splitlines()[2:]
    rows = {}
    for ln in table:
        cells = [c.strip() for c in ln.split("|")]
        if len(cells) < 8 or not cells[0].isdigit():
            break
        rows[int(cells[0])] = tuple(int(v.replace(",", "")) for v in cells[7].split("/"))
    return rows


@pytest.fixture(scope="module")
def one_rank():
    return run_distributed(1, _train, RUN)[0]


TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
LAYOUTS = {  # DeepSpeed's pipeline engine sends the [s/2, b, h] shards between the stages
             "tp2_pp2": TP2 + ["--pipeline-model-parallel-size", "2"],
             # the plain-module engine, ZeRO 2 moving gradients into its buckets during backward,
             # DP 2, recomputed layers whose saved inputs are shards
             "tp2_dp2_zero2_checkpointed": TP2 + ["--no-pipeline-parallel", "--zero-stage", "2",
                                                  "--checkpoint-activations"]}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sequence_parallel_trains_as_one_rank(layout, one_rank):
    """Real gloo ranks through pretrain_gpt.main, 4 of them, against one rank: 6 iterations of
    a global batch of 4 (one rank: 2 micro-batches)."""
    from tests.support.launch import logged_iterations
    out = "".join(run_distributed(4, _train, RUN + LAYOUTS[layout], tp=2, pp=2 if "pp2" in layout else 1))
    ref, got = logged_iterations(one_rank), logged_iterations(out)
    assert sorted(got) == list(range(1, 7))
    for it in got:  # from iteration 2 on the losses carry every gradient of the step before
        assert got[it]["lm loss"] == pytest.approx(ref[it]["lm loss"], rel=1e-5), it
        assert got[it]["grad norm"] == pytest.approx(ref[it]["grad norm"], abs=2e-3), it
        assert got[it]["consumed tokens"] == ref[it]["consumed tokens"]
    # the count and FLOPs per sample are the model's, not the layout's (recompute adds FLOPs, SP none)
    flops = () if "--checkpoint-activations" in LAYOUTS[layout] else ("FLOPs per sample",)
    for prefix in ("estimated model parameters:", "model parameters (exact):", *flops):
        assert _line(out, prefix).split(" (TP=")[0] == _line(one_rank, prefix).split(" (TP=")[0]
    assert "accepted, no effect" not in out  # at TP 2 the flag acts
    assert "sequence parallel):" in _line(out, "memory per rank (predicted;")
    # activations per rank: the estimate is what autograd saved, to the byte, on every rank
    acts = _activations(out)
    assert sorted(acts) == [0, 1, 2, 3] and all(est == measured for est, measured in acts.values()), acts
    if layout == "tp2_pp2":
        _by_hand_tp2_pp2([acts[r][0] for r in range(4)])


def _by_hand_tp2_pp2(estimates):
    # by hand (fp32, s 32, b 2, h 64, f 256, t 2, 2 heads per rank): one layer saves the norms'
    # inputs and outputs and their fp32 mean/rstd per shard, 4 (4h/2 sb + 16 sb / 2), QKV and
    # context 4 * 4h/2 sb, h->4h and GeLU 4 * 2f/2 sb, the logsumexp 4 b a s = 512
    sb = 32 * 2
    layer = 4 * sb * (4 * 64 // 2 + 4 * 64 // 2 + 2 * 256 // 2) + 16 * sb // 2 + 512
    embedding = 8 * sb + 8 * 32 + sb  # token and position ids, the out-of-slice mask
    head = (2 * 4 * sb * 64 + 8 * sb) // 2 + 4 * sb * 320 + 9 * sb + 4 * sb + 4  # norm per shard; logits V/2
    first_stage, last_stage = 2 * (layer + embedding), layer + head  # 1F1B: 2 micro-batches in flight on stage 0
    assert estimates == [first_stage, first_stage, last_stage, last_stage] == [265_856] * 2 + [231_492] * 2
    # without sequence parallelism a layer holds the norms' 4 sbh values and 4 sb statistics whole, the
    # head 2 sbh + 2 sb: here half of each stays, 66,560 bytes less on stage 0 (2 micro-batches of one
    # layer) and 49,920 on stage 1 (a layer and the head) than the 332,416 / 281,412 of that layout
    layer_saved, head_saved = (4 * sb * 4 * 64 + 16 * sb) // 2, (2 * 4 * sb * 64 + 8 * sb) // 2
    assert (2 * layer_saved, layer_saved + head_saved) == (66_560, 49_920)


# --- flags -------------------------------------------------------------------------------------

def test_sequence_parallel_flags(tmp_path):
    from megatron.config.script_flags import no_effect_line
    args = validated(["--sequence-parallel", "--tensor-model-parallel-size", 2], world_size=2)
    assert args.sequence_parallel
    # DeepSpeed's pipeline engine would send 1/TP of a (then different) stage output per TP rank
    assert args.deepspeed_config_dict["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    assert "pipeline" not in validated(["--tensor-model-parallel-size", 2], world_size=2).deepspeed_config_dict
    # TP 1: off, as in Megatron-LM, with a startup note (a flag that acts is never in the no-effect line)
    args = validated(["--sequence-parallel"])
    assert not args.sequence_parallel and no_effect_line(args) is None
    assert args.startup_notes == ["--sequence-parallel is off at --tensor-model-parallel-size 1: no TP ranks to "
                                  "shard the sequence over (as in Megatron-LM)"]
    # DeepSpeed-Ulysses runs at TP 1 only, so Megatron's flag beside it is off the same way, not refused
    args = validated(["--sequence-parallel", "--ds-sequence-parallel-size", 2, "--no-pipeline-parallel"], world_size=2)
    assert (args.sequence_parallel, args.ds_sequence_parallel_size) == (False, 2)


@pytest.mark.parametrize("extra, message", [
    (["--seq-length", 30, "--max-position-embeddings", 32],
     "--sequence-parallel: --seq-length 30 is not divisible by --tensor-model-parallel-size 4: each TP rank holds "
     "seq-length / TP positions; use a multiple of 4 or drop --sequence-parallel"),
    (["--num-experts", 4],
     "--sequence-parallel with MoE layers (--num-experts) is not supported: the experts take whole sequences; "
     "drop --sequence-parallel"),
    ("ds_config", "pipeline.pipe_partitioned=true does not work with --sequence-parallel (each TP rank sends its "
                  "own sequence shard between stages): set it to false or drop --sequence-parallel"),
])
def test_refusals(extra, message, tmp_path):
    if extra == "ds_config":
        path = tmp_path / "ds.json"
        path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "pipeline": {"pipe_partitioned": True}}))
        extra = ["--deepspeed_config", path]
    with pytest.raises(ConfigError, match=re.escape(message)):
        validated(["--sequence-parallel", "--tensor-model-parallel-size", 4, *extra], world_size=4)


def test_param_count_tool_takes_the_flag():
    """tools/param_count.py prints the trainer's memory table: the activations the TP2 x PP2 ranks
    measured above (by hand in _by_hand_tp2_pp2), and without the flag the whole-norm numbers."""
    from tests.support.tool_modules import load_tool
    tool = load_tool("param_count")
    flags = [*RUN, "--tensor-model-parallel-size", 2, "--pipeline-model-parallel-size", 2]

    def table(*extra):
        lines = tool.report(tool.parse_args([str(f) for f in [*flags, *extra]]))
        header = next(i for i, ln in enumerate(lines) if ln.startswith("memory per rank"))
        acts = [int(ln.split("|")[5].replace(",", "")) for ln in lines[header + 2:header + 4]]
        return lines[0], lines[header], acts

    count, header, acts = table("--sequence-parallel")
    assert header.endswith(", sequence parallel):") and acts == [265_856, 231_492]
    count_without, header, acts = table()
    assert "sequence parallel" not in header and acts == [332_416, 281_412]
    assert count == count_without == "parameters: 143,104"
    with pytest.raises(ConfigError, match="--seq-length 34 is not divisible by --tensor-model-parallel-size 4"):
        tool.parse_args([str(f) for f in [*RUN, "--tensor-model-parallel-size", 4, "--sequence-parallel",
                                          "--seq-length", 34, "--max-position-embeddings", 40]])


# --- bf16, in process ---------------------------------------------------------------------------

def test_tp2_sequence_parallel_bf16_first_steps_as_one_rank():
    """TP=2 with --sequence-parallel on the trainer's engine (tests/support/memory_runs.py: 2 layers, hidden
    64, seq 32, micro batch 2), bf16 through DeepSpeed's ZeRO 1 optimizer, against one rank in bf16
    at ZeRO 1: the first two losses and the first step's gradient norm (DeepSpeed's) are the
    one-rank run's, and the memory table is exact where it claims to be."""
    from tests.support.memory_runs import check_exact, first_iteration_and_loss
    # TP splits the matmuls' sums, each rounded to bf16's 8 bits
    tol = torch.finfo(torch.bfloat16).eps
    common = ["--global-batch-size", "2", "--no-pipeline-parallel", "--make-vocab-size-divisible-by", "64",
              "--zero-stage", "1", "--bf16"]
    [(one, one_losses, one_norm)] = run_distributed(1, first_iteration_and_loss, common)
    ranks = run_distributed(2, first_iteration_and_loss, common + TP2, tp=2)
    for _, losses, norm in ranks:
        assert losses == pytest.approx(one_losses, rel=tol)
        assert norm == pytest.approx(one_norm, rel=tol)
    rows = ranks[0][0]
    check_exact(rows)
    [(*_, one_predicted, one_measured)] = one
    # by hand, a TP rank's parameters: vocab 640/2 x 64 + positions 32 x 64 + 2 layers of (2 norms
    # 2 x 64, QKV 64 x 192/2 + 96, dense 64 x 64/2 + 64, h->4h 64 x 256/2 + 128, 4h->h 256 x 64/2
    # + 64) + the final norm 128; bf16 weights, fp32 master + Adam's two moments, two groups' steps
    params = 320 * 64 + 32 * 64 + 2 * (2 * 128 + 6144 + 96 + 2048 + 64 + 8192 + 128 + 8192 + 64) + 128
    assert params == 73_024
    for *_, predicted, measured in rows:
        assert (measured["weights"], measured["optimizer"]) == (2 * params, 12 * params + 2 * 4)
        # torch's CPU LayerNorm keeps a bf16 input's mean and rstd in bf16, where the estimate counts
        # CUDA's fp32: 4 bytes less a token for each of the 5 norms, on the 64 tokens one rank
        # holds and the 32 of a sequence shard
        assert one_measured["activations"] == one_predicted["activations"] - 5 * 64 * 4
        assert measured["activations"] == predicted["activations"] - 5 * 32 * 4
