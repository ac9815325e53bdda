"""Real `deepspeed --num_gpus N pretrain_gpt.py` runs on CPU ranks (gloo) for every layout:
the cached parameter count is exact on every rank, agrees with DeepSpeed's engine view,
is computed once, and the per-iteration logger neither counts nor communicates."""
import os

import pytest

from tests.support.launcher import TINY, launch, losses

L, H, S, VOCAB = 2, 64, 32, 600  # the TINY config
ITERS = 10


def padded_vocab(tp):
    multiple = 128 * tp  # --make-vocab-size-divisible-by 128 x TP
    return -(-VOCAB // multiple) * multiple


def expected_counts(tp):
    """GPT-2 as Megatron builds it: per layer 12h^2 (QKV 3h^2, dense h^2, MLP 8h^2) plus 13h
    (QKV bias 3h, dense bias h, MLP biases 4h + h, two LayerNorms 4h), a final LayerNorm 2h,
    word embeddings (padded vocab x h, shared with the output layer) and positions s x h."""
    no_embedding = L * (12 * H * H + 13 * H) + 2 * H
    return padded_vocab(tp) * H + S * H + no_embedding, no_embedding


def tp_replicated(tp):
    """Parameters that every TP rank holds in full: positions, LayerNorms, row-parallel biases."""
    return S * H + L * (2 * 2 * H + H + H) + 2 * H


def _deepspeed_shm_files():
    return {f for f in os.listdir("/dev/shm") if f.startswith("deepspeed")} if os.path.isdir("/dev/shm") else set()


# the cheapest set that covers each rule: PP alone (the tied embedding's copy), TP with PP (TP
# replicas and the copy), TP without the pipeline engine, DP with each engine, ZeRO-2 and -3
# (TP1 PP1 and TP2 PP1 on the pipeline engine are covered by these and by the other launches)
LAYOUTS = {  # name: (ranks, tp, pp, extra flags)
    "tp1_pp2": (2, 1, 2, []),
    "tp2_pp2": (4, 2, 2, []),
    "tp2_dp2_no_pipeline": (4, 2, 1, ["--no-pipeline-parallel"]),
    "tp1_pp1_dp2": (2, 1, 1, []),
    # ZeRO-2 and ZeRO-3 need the plain-module engine; ZeRO-3 partitions the parameters over DP
    "zero2_dp2_no_pipeline": (2, 1, 1, ["--no-pipeline-parallel", "--zero-stage", 2]),
    "zero3_dp2_no_pipeline": (2, 1, 1, ["--no-pipeline-parallel", "--zero-stage", 3]),
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_exact_count_on_every_rank(layout, tmp_path):
    ranks, tp, pp, extra = LAYOUTS[layout]
    dp = ranks // (tp * pp)
    args = TINY + ["--tensor-model-parallel-size", tp, "--pipeline-model-parallel-size", pp,
                   "--global-batch-size", 4 * dp, "--train-iters", ITERS] + extra
    shm_before = _deepspeed_shm_files()
    proc, results = launch(ranks, args, str(tmp_path))
    assert _deepspeed_shm_files() == shm_before, "a run must not leave buffers in /dev/shm"
    total, no_embedding = expected_counts(tp)
    assert sorted(results) == list(range(ranks))
    for rank, r in results.items():
        assert r["padded_vocab_size"] == padded_vocab(tp)
        assert (r["parameters"], r["parameters_no_embedding"]) == (total, no_embedding), f"rank {rank}"
        assert r["parameters_in_billions"] == total / 1e9
        assert sum(owned for _, _, owned in r["stages"]) == total
        assert [layers for layers, _, _ in r["stages"]] == [L // pp] * pp
        # computed once at build; the logger ran every iteration without counting or talking
        assert r["count_calls"] == 1
        assert r["log_calls"] == ITERS
        assert r["collectives_in_log"] == 0 and r["parameter_walks_in_log"] == 0
        zero_stage = int(extra[extra.index("--zero-stage") + 1]) if "--zero-stage" in extra else 0
        assert r["zero_stage"] == zero_stage, f"rank {rank}"
        if zero_stage == 3:  # the engine holds this rank's shard only, yet the count is the whole model
            assert total / ranks <= r["engine_local_numel"] < total, f"rank {rank}"
        elif tp == pp == 1:
            assert r["engine_local_numel"] == total, f"rank {rank}"
        if "--no-pipeline-parallel" not in extra and r["ds_unique"] is not None:
            # DeepSpeed dedups the tied embedding but sums TP replicas of replicated parameters
            assert r["ds_unique"] - total == (tp - 1) * tp_replicated(tp), f"rank {rank}"
    if "--no-pipeline-parallel" not in extra:
        assert any(r["ds_unique"] is not None for r in results.values()), "DeepSpeed's view was not captured"
    out = proc.stdout
    assert f"estimated model parameters: {total / 1e9}\n" in out
    assert f"estimated model parameters without embeddings: {no_embedding / 1e9}\n" in out
    assert f"model parameters (exact): {total:,} total, {no_embedding:,} without embeddings" in out
    assert "disagrees with the analytic formula" not in out
    curve = losses(out)
    assert sorted(curve) == list(range(1, ITERS + 1))
    assert curve[ITERS] < curve[1] - 0.2, curve
