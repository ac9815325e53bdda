"""MoE in real `deepspeed --num_gpus 2 pretrain_gpt.py` runs (TP=1 x DP=2, --no-pipeline-parallel):
the startup count is the analytic one on every rank, EP=2 reproduces EP=1's losses on the same data
and seed, the moe loss is logged, and an EP=2 run interrupted and resumed is exact."""
import pytest

from launcher import TINY, launch
from megatron.launch import logged_iterations
from megatron.model.analytic import analytic_parameter_counts, flops_per_sample
from megatron.model.shape import ModelShape

ITERS, EXIT_AT = 6, 3
MOE = ["--num-experts", 4, "--topk", 2, "--expert-interval", 2, "--no-pipeline-parallel",
       "--global-batch-size", 8, "--train-iters", ITERS, "--moe-loss-coeff", 0.01]


def _shape(ep):
    return ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600,
                      max_position_embeddings=32, num_experts=(4,), topk=2, moe_expert_parallel_size=ep)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    ckpt = tmp / "ckpt"
    out = {}
    for name, extra in (("ep1", ["--moe-expert-parallel-size", 1]),
                        ("ep2", ["--moe-expert-parallel-size", 2]),
                        ("ep2_first", ["--moe-expert-parallel-size", 2, "--save", ckpt, "--save-interval", 100,
                                       "--exit-interval", EXIT_AT]),
                        ("ep2_resumed", ["--moe-expert-parallel-size", 2, "--load", ckpt])):
        out[name] = launch(2, TINY + MOE + extra, str(tmp / name))
    return out


def test_startup_count_is_exact_on_every_rank(runs):
    for name, ep in (("ep1", 1), ("ep2", 2)):
        proc, ranks = runs[name]
        counts = analytic_parameter_counts(_shape(ep))
        assert counts.components["experts"] == 4 * (8 * 64 * 64 + 5 * 64)
        for r in ranks.values():
            assert (r["parameters"], r["parameters_no_embedding"]) == (counts.total, counts.no_embedding)
            assert (r["parameters_active"], r["parameters_active_no_embedding"]) == \
                (counts.active, counts.active_no_embedding)
            assert r["flops_per_sample"] == flops_per_sample(_shape(ep), False)
            assert r["count_calls"] == 1 and r["collectives_in_log"] == 0
            # C = 6 N_active D
            assert r["gigaflos_no_embeds"] == pytest.approx(6 * ITERS * 8 * 32 * counts.active_no_embedding / 1e9)
        out = proc.stdout
        assert f"estimated model parameters: {counts.total / 1e9}\n" in out
        assert f"estimated active model parameters: {counts.active / 1e9}\n" in out
        assert f"estimated active model parameters without embeddings: {counts.active_no_embedding / 1e9}\n" in out
        assert f"experts per EP rank (EP={ep}): {4 // ep} experts" in out
        assert "disagrees with the analytic formula" not in out


def test_ep2_reproduces_ep1_and_logs_the_moe_loss(runs):
    ep1, ep2 = (logged_iterations(runs[name][0].stdout) for name in ("ep1", "ep2"))
    assert sorted(ep1) == sorted(ep2) == list(range(1, ITERS + 1))
    for it in ep1:
        # the same tokens meet the same experts; only the order of float sums differs
        assert ep2[it]["lm loss"] == pytest.approx(ep1[it]["lm loss"], rel=1e-5), it
        assert ep2[it]["moe loss"] == pytest.approx(ep1[it]["moe loss"], rel=1e-4), it
        assert 0 < ep1[it]["moe loss"] < 0.01 * 4  # coeff x l_aux, l_aux of top-2 at most E
    assert ep1[ITERS]["lm loss"] < ep1[1]["lm loss"]


def test_resume_at_ep2_is_exact(runs):
    whole = runs["ep2"][1][1]["losses"]
    first, resumed = runs["ep2_first"][1][1]["losses"], runs["ep2_resumed"][1][1]["losses"]
    assert sorted(map(int, resumed)) == list(range(EXIT_AT + 1, ITERS + 1))
    assert {**first, **resumed} == whole  # bit for bit
    proc = runs["ep2_first"][0]
    assert "saved checkpoint at iteration 3" in proc.stdout
