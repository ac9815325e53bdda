"""DeepSpeed-Ulysses (--ds-sequence-parallel-size): the model over 2 or 4 real gloo ranks, each
holding a chunk of every sequence, against the same model on one rank without sequence
parallelism (runs that never take the all-to-all path): in-process for the position schemes, GQA
and FLOPs per rank; real `deepspeed` launches for DeepSpeed's gradient reduction (ZeRO 0 and 1, with
DP), the log line, TensorBoard and resuming across SP sizes; the first iteration's memory."""
import pytest
import torch

from tests.support.checkpoint_copies import checkpoint_at
from tests.support.distributed import run_distributed
from tests.support.launcher import TINY, launch, losses
from tests.support.memory_runs import check_exact, first_iteration_and_loss
from tests.support.model_fixtures import SEED, tiny_batch, tiny_config
from tests.support.tool_modules import load_tool

# position schemes and GQA: what changes where a position or a head lives under SP
VARIANTS = {
    "absolute": {},
    "rotary": dict(position_embedding_type="rotary"),
    "alibi": dict(position_embedding_type="alibi"),
    "alibi_gqa": dict(position_embedding_type="alibi", num_key_value_heads=2, attention_impl="math"),
    "rotary_gqa_glu": dict(position_embedding_type="rotary", num_key_value_heads=2, swiglu=True),
}


def _loss_and_grads(names):
    """{variant: (loss, gradients, FLOPs of forward + backward as FlopCounterMode counts them)}."""
    from torch.utils.flop_counter import FlopCounterMode

    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    out = {}
    for name in names:
        config = tiny_config(**VARIANTS[name])
        model = GPTModel(config, seed=SEED)
        tokens, labels, mask = tiny_batch(config)
        mask[0, 3] = mask[1, 12] = 0.0  # the mean counts the unmasked tokens of the whole sequence
        with FlopCounterMode(display=False) as flops:
            loss = model(*(mpu.sequence_chunk(t, 1) for t in (tokens, labels, mask)))
            loss.backward()
        out[name] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()},
                     flops.get_total_flops())
    return out


@pytest.mark.parametrize("sp", [2, 4])
def test_sequence_parallel_loss_and_gradients_equal_one_rank(sp):
    """SP=4: one query head per rank (4 heads), so only the variants without GQA (2 kv heads)."""
    names = [n for n in VARIANTS if VARIANTS[n].get("num_key_value_heads", 4) % sp == 0]
    reference = run_distributed(1, _loss_and_grads, names)[0]
    ranks = run_distributed(sp, _loss_and_grads, names, sp=sp)
    for name in names:
        ref_loss, ref_grads, ref_flops = reference[name]
        for loss, _, flops in (r[name] for r in ranks):  # every SP rank has the whole sequences' loss
            torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6, msg=name)
            assert flops * sp == ref_flops, name  # each SP rank does 1/SP of the model's FLOPs
        for param, ref in ref_grads.items():
            # each SP rank's gradient is its own tokens' share; DeepSpeed sums them over SP
            summed = sum(r[name][1][param] for r in ranks)
            torch.testing.assert_close(summed, ref, rtol=1e-5, atol=1e-6, msg=f"{name}: {param}")
            assert not torch.equal(ranks[0][name][1][param], ref), f"{name}: {param} is not split"


def _scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}


# The launch's model (TINY, rotary: no position table; 4 query / 2 kv heads of 16: QKV 128 x 64)
# in fp32 at ZeRO 1 over its 2 SP ranks, by hand. DeepSpeed's two param groups, flattened in
# parameter order: the matrices (word embedding 40,960; per layer QKV 8,192, dense 4,096, MLP
# 16,384 twice) = 131,072 and the biases and norms (per layer 768, final norm 128) = 1,664, both
# multiples of 2 x 2: no padding. Weights: the flat fp32 copy, 4 x 132,736. Optimizer: fp32 master,
# exp_avg and exp_avg_sq of each group's half, 12 x (65,536 + 832), and one 4-byte step per group.
# Gradients: the whole parameters overlapping the rank's half of each group: rank 0 the embedding,
# layer 1's QKV, dense and h->4h (69,632) and the vectors up to layer 2's first norm weight (832);
# rank 1 from layer 1's h->4h on (77,824) and the other 832 vectors.
ULYSSES_ZERO1_RANK0 = (4 * 132_736, 4 * (69_632 + 832), 12 * (65_536 + 832) + 8)
ULYSSES_ZERO1_RANK1 = (530_944, 314_624, 796_424)
assert ULYSSES_ZERO1_RANK1 == (4 * 132_736, 4 * (77_824 + 832), 12 * (65_536 + 832) + 8)


def _measured_state(out):
    """{SP rank: (weights, gradients, optimizer)} as measured in the launch's "memory after the first
    iteration" table (cells "predicted/measured")."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("memory after the first iteration"))
    measured = {}
    for line in lines[start + 2:start + 4]:
        cells = [c.strip() for c in line.split("|")]
        values = [int(c.split("/")[1].replace(",", "")) for c in cells[4:7]]
        measured[int(cells[3])] = tuple(values)
    return measured


def test_sp2_launch_trains_and_resumes_as_one_rank(tmp_path):
    """Real `deepspeed` launches with --no-pipeline-parallel, rotary and GQA, 4 iterations,
    checkpoints at 2: A, one rank (the reference, ZeRO 0); B, SP=2 with ZeRO 1 (DeepSpeed's ZeRO
    optimizer partitioned over the SP x DP ranks, summing the SP ranks' gradient shares): every
    loss, the validation loss, the counts and FLOPs per sample equal A's, TFLOPs and MFU are per
    rank (2) and one replica is the 2 SP ranks; C, one rank with ZeRO 1 resumed from B's iteration 2 (SP 2
    -> 1: B's two ZeRO partitions resharded into one); D, 4 ranks, SP=2 x DP=2 with ZeRO 0
    (DeepSpeed's own all-reduce over the SP x DP ranks: a sum over SP, a mean over DP; each replica
    reads its DP share of the batch) resumed from A's iteration 2 (SP 1 -> 2): their iterations 3
    and 4 equal A's."""
    common = TINY + ["--global-batch-size", "4", "--train-iters", "4", "--no-pipeline-parallel", "--save-interval",
                     "2", "--position-embedding-type", "rotary", "--num-key-value-heads", "2"]
    sp2 = ["--ds-sequence-parallel-size", "2"]
    one, a = launch(1, common + ["--save", str(tmp_path / "a")], str(tmp_path / "a_out"))
    proc, b = launch(2, common + sp2 + ["--zero-stage", "1", "--save", str(tmp_path / "b"), "--peak-tflops", "1",
                                        "--tensorboard-dir", str(tmp_path / "tb")], str(tmp_path / "b_out"))
    ref = a[0]
    for rank in b.values():
        assert rank["losses"] == pytest.approx(ref["losses"], rel=1e-6)
        assert [e[2] for e in rank["evaluations"]] == pytest.approx([e[2] for e in ref["evaluations"]], rel=1e-6)
        for key in ("parameters", "parameters_no_embedding", "flops_per_sample", "gigaflos_no_embeds"):
            assert rank[key] == ref[key], key
    assert losses(proc.stdout) == losses(one.stdout)  # the log line's (rank 0 of the last replica)
    s = _scalars(tmp_path / "tb")
    for it in (1, 2, 3, 4):
        samples = s["iteration-time/samples per second"][it]
        # by hand: 32 tokens a sample; one replica (2 ranks / SP 2); FLOPs over the 2 ranks
        assert s["iteration-time/tokens per second"][it] == pytest.approx(32 * samples, rel=1e-5)
        assert s["iteration-time/tokens per second per replica"][it] == pytest.approx(32 * samples, rel=1e-5)
        assert s["iteration-time/samples per second per replica"][it] == pytest.approx(samples, rel=1e-5)
        assert s["iteration-time/TFLOPs per gpu (estimated)"][it] == pytest.approx(
            ref["flops_per_sample"] * samples / 2 / 1e12, rel=1e-5)
        # no recompute: model FLOPs = executed FLOPs; over 2 devices of --peak-tflops 1
        assert s["iteration-time/MFU"][it] == pytest.approx(ref["flops_per_sample"] * samples / 2 / 1e12, rel=1e-5)
    assert "DP=1 x SP=2 (ZeRO over 2 ranks), micro batch 2 x 2" in proc.stdout  # one replica
    assert f"FLOPs per sample per SP rank (DeepSpeed-Ulysses, SP=2): {ref['flops_per_sample'] // 2:,}" in proc.stdout
    # tools/param_count.py, given the launch's flags and its world size: its row (the most loaded
    # rank, SP rank 1) worked out by hand, and equal to what that rank measured holding after its
    # first iteration (memory_measure's storages of the engine's tensors)
    tool = load_tool("param_count")
    report = tool.report(tool.parse_args(common + sp2 + ["--zero-stage", "1", "--world-size", "2"]))
    start = next(i for i, ln in enumerate(report) if ln.startswith("memory per rank"))
    row = [int(c.replace(",", "")) for c in report[start + 2].split("|")]
    assert row[:5] == [0, 1, *ULYSSES_ZERO1_RANK1]
    assert _measured_state(proc.stdout) == {0: ULYSSES_ZERO1_RANK0, 1: ULYSSES_ZERO1_RANK1}

    _, c = launch(1, common + ["--zero-stage", "1",
                               "--load", checkpoint_at(str(tmp_path / "b"), 2, str(tmp_path / "b2"))],
                  str(tmp_path / "c_out"))
    _, d = launch(4, common + sp2 + ["--load", checkpoint_at(str(tmp_path / "a"), 2, str(tmp_path / "a2"))],
                  str(tmp_path / "d_out"))
    for resumed in (c[0], *d.values()):
        assert sorted(resumed["losses"]) == ["3", "4"]
        assert resumed["losses"] == pytest.approx({it: ref["losses"][it] for it in ("3", "4")}, rel=1e-6)


@pytest.mark.parametrize("flags, dp", [(["--zero-stage", "2"], 2),
                                       (["--zero-stage", "1", "--bf16", "--accumulate-allreduce-grads-in-fp32"], 1)],
                         ids=["zero2_dp2", "bf16_optimizer"])
def test_sp2_zero_memory_and_loss_against_one_rank(flags, dp):
    """ZeRO 2 in fp32 (DeepSpeedZeroOptimizer over the SP x DP ranks, its gradient buckets
    reduced during backward; fp32 ZeRO 1 at SP=2 is the launch test's: every loss, the memory
    table), and bf16 with fp32 gradient accumulation at ZeRO 1 (DeepSpeed's
    BF16_Optimizer, its own reduction; bf16 through DeepSpeedZeroOptimizer is
    tests/integration/test_sequence_parallel.py's TP=2 case), on memory_runs' TINY model, micro batch 2,
    SP=2 (x DP=2 at ZeRO 2, 4 ranks) against one rank at the same stage and precision reading the
    same samples: the first two iterations' losses (averaged over DP) and the first step's
    gradient norm are the one-rank run's (the SP ranks' gradient shares summed, the DP replicas'
    averaged, before the step); weights, gradients and optimizer state are predicted to the
    byte, the optimizer state being 1/(SP x DP) of the one-rank state; and the activations each
    SP rank saves for backward are below the one-rank run's by the predicted amount."""
    bf16 = "--bf16" in flags
    # fp32: only the order of the sums differs; bf16: a gradient element rounds to 8 bits either way
    tol = torch.finfo(torch.bfloat16).eps if bf16 else 1e-5
    common = ["--global-batch-size", str(2 * dp), "--no-pipeline-parallel"]
    [(one, one_losses, one_norm)] = run_distributed(1, first_iteration_and_loss, common + flags)
    ranks = run_distributed(2 * dp, first_iteration_and_loss, common + flags + ["--ds-sequence-parallel-size", "2"],
                            sp=2)
    rows = ranks[0][0]
    check_exact(rows)
    check_exact(one)
    [(_, _, _, _, one_predicted, one_measured)] = one
    # ranks 2r and 2r + 1 are the SP ranks of DP replica r: the same loss; the mean over replicas
    # is the one-rank loss, the mean of its dp micro-batches
    for it in (0, 1):
        assert all(ranks[2 * r][1][it] == ranks[2 * r + 1][1][it] for r in range(dp))
        assert sum(ranks[2 * r][1][it] for r in range(dp)) / dp == pytest.approx(one_losses[it], rel=tol)
    for _, _, norm in ranks:
        assert norm == pytest.approx(one_norm, rel=tol)
    # by hand (tests/integration/test_memory_measured.py's TINY sizes): 143,104 parameters in two groups of
    # 141,312 and 1,792 elements, each a multiple of 2 x SP x DP: fp32 master, exp_avg, exp_avg_sq
    # partitioned over the SP x DP ranks
    for *_, predicted, measured in rows:
        assert measured["weights"] == (2 if bf16 else 4) * 143_104
        if bf16:  # BF16_Optimizer: the bf16 .grad tensors and a whole flat fp32 accumulator
            assert measured["gradients"] == (2 + 4) * 143_104
        assert measured["optimizer"] == 3 * 4 * 143_104 // (2 * dp) + 2 * 4
        assert one_measured["optimizer"] == 3 * 4 * 143_104 + 2 * 4
        saved = one_measured["activations"] - measured["activations"]
        # torch's CPU LayerNorm keeps a bf16 input's mean and rstd in bf16, where the estimate
        # counts CUDA's fp32: 4 bytes less a token for each of the 5 norms (2 layers x 2 + the
        # final one) on the 32 tokens (2 x 16) an SP rank does not hold
        cpu_norm_stats = 5 * 2 * 16 * 4 if bf16 else 0
        assert saved == one_predicted["activations"] - predicted["activations"] - cpu_norm_stats
        assert saved > one_measured["activations"] * 0.45  # nearly half: the logits dominate


def _dropout_masks():
    """This SP rank's embedding and first-layer residual dropout masks (hidden dropout 0.5)."""
    import torch.nn.functional as F

    from megatron import mpu
    from megatron.model.gpt_model import GPTModel
    config = tiny_config(hidden_dropout=0.5)
    model = GPTModel(config, seed=SEED)
    tokens = mpu.sequence_chunk(tiny_batch(config)[0], 1)
    embedding = model.language_model.embedding(tokens) == 0
    layer = model.language_model.encoder.layers[0]
    with layer._dropout_rng():
        residual = F.dropout(torch.ones(tokens.size(1), tokens.size(0), config.shape.hidden_size), 0.5) == 0
    return embedding, residual


def test_sp_ranks_draw_their_own_dropout_masks():
    """Each SP rank holds other tokens, so a mask repeated on every chunk would be a correlated
    dropout no one-rank run has: the ranks' masks differ (and each drops about half)."""
    (emb0, res0), (emb1, res1) = run_distributed(2, _dropout_masks, sp=2)
    for first, second in ((emb0, emb1), (res0, res1)):
        assert first.shape == second.shape and not torch.equal(first, second)
        assert 0.3 < first.float().mean() < 0.7


def _masks_after_restoring_the_first_sp_ranks_file():
    """A checkpoint's RNG state as DeepSpeed writes it: from the first SP rank only. Restored on
    every SP rank, each must draw the masks it drew after the save, not the first rank's."""
    import torch.distributed as dist
    import torch.nn.functional as F

    from megatron import mpu
    from megatron.checkpoint.manager import _rng_state, set_rng_state

    def draw():
        with mpu.get_cuda_rng_tracker().fork():
            return F.dropout(torch.ones(64), 0.5) == 0
    saved = [_rng_state()]
    after_save = draw()
    dist.broadcast_object_list(saved, src=0)  # the file: SP rank 0's client state
    set_rng_state(saved[0])
    return after_save, draw()


def test_a_resumed_sp_rank_draws_its_own_masks():
    (first0, again0), (first1, again1) = run_distributed(2, _masks_after_restoring_the_first_sp_ranks_file, sp=2)
    assert torch.equal(first0, again0) and torch.equal(first1, again1)
    assert not torch.equal(first0, first1)
