"""MoE in real `deepspeed pretrain_gpt.py` runs, the cheapest set that trains every MoE layout:

  ref        1 rank   TP1 PP1 EP1, DeepSpeedEngine (--no-pipeline-parallel)
  tp2_pp2    4 ranks  TP2 x PP2 on the pipeline engine (EP1): whole experts with DeepSpeed's token
                      split / gather over TP, the moe loss across a stage boundary, and a first
                      stage without an MoE layer
  ep2        2 ranks  pipeline engine at PP1, DP2 x EP2 (and once more in bf16 with ZeRO-1)

Every run prints the exact total and active counts; tp2_pp2 and ep2 reproduce ref's losses (the
same tokens meet the same experts; only the order of float sums differs). tp2_pp2 and ep2 save at
iterations 3 and 6 and are run again from iteration 3: bit for bit the same. The load-balancing
loss counts fully (--moe-loss-coeff 1) so that a wrong gate gradient on any stage would change the
trajectory; the 2nd expert of top-2 is the deterministic one, since the sampled one draws from an
RNG whose position differs per engine. The experts are Mixtral-style SwiGLU MLPs without biases
(--swiglu --disable-bias-linear), as the dense layers: an expert is built like the dense MLP."""
import pytest

from megatron.model.analytic import analytic_parameter_counts, flops_per_sample
from megatron.model.shape import ModelShape
from tests.support.launch import logged_iterations
from tests.support.launcher import TINY, launch

ITERS, RESUME_AT = 6, 3
MOE = ["--swiglu", "--disable-bias-linear", "--num-experts", 4, "--topk", 2, "--expert-interval", 2,
       "--moe-loss-coeff", 1.0, "--disable-moe-top2-2nd-expert-sampling", "--global-batch-size", 8,
       "--train-iters", ITERS]
# TP2 pads the vocab to a multiple of 64 x 2: the same 640 rows as TP1's multiple of 128
LAYOUTS = {"ref": (1, ["--no-pipeline-parallel"]),
           "tp2_pp2": (4, ["--tensor-model-parallel-size", 2, "--pipeline-model-parallel-size", 2,
                           "--make-vocab-size-divisible-by", 64]),
           "ep2": (2, ["--moe-expert-parallel-size", 2])}
RESUMED = ("tp2_pp2", "ep2")
BF16_ZERO1 = ["--bf16", "--zero-stage", 1, "--create-moe-param-group"]
SHAPE = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600,
                   max_position_embeddings=32, num_experts=(4,), topk=2, swiglu=True, add_bias_linear=False)
# by hand: --swiglu's ffn size int(8 x 64 / 3 / 64) x 64 = 128; an expert is dense_h_to_4h [2 x 128, 64]
# (gate and value) and dense_4h_to_h [64, 128], no biases
EXPERT = 2 * 128 * 64 + 64 * 128


def _point_trackers_at(ckpt, iteration):
    """What a user does to resume from an earlier checkpoint than the latest."""
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    (ckpt / "latest").write_text(f"global_step{iteration}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    out = {}
    for name, (ranks, extra) in LAYOUTS.items():
        ckpt = tmp / f"ckpt_{name}"
        save = ["--save", ckpt, "--save-interval", RESUME_AT] if name in RESUMED else []
        out[name] = launch(ranks, TINY + MOE + extra + save, str(tmp / name))
        if name in RESUMED:
            out[f"{name}_ckpt"] = ckpt
            _point_trackers_at(ckpt, RESUME_AT)
            out[f"{name}_resumed"] = launch(ranks, TINY + MOE + extra + ["--load", ckpt], str(tmp / f"{name}_resumed"))
    out["ep2_bf16_zero1"] = launch(2, TINY + MOE + LAYOUTS["ep2"][1] + BF16_ZERO1, str(tmp / "ep2_bf16_zero1"))
    return out


@pytest.mark.parametrize("name, ep", [("ref", 1), ("tp2_pp2", 1), ("ep2", 2)])
def test_startup_count_is_exact_on_every_rank(runs, name, ep):
    proc, ranks = runs[name]
    counts = analytic_parameter_counts(SHAPE)
    assert counts.components["experts"] == 4 * EXPERT
    assert counts.active == counts.total - 2 * EXPERT  # top-2 of 4 experts
    # by hand, the whole model: embeddings 640 x 64 + 32 x 64; per layer 2 LayerNorms 4 x 64 and
    # attention 4 x 64 x 64 (no biases); the dense layer's MLP, the MoE layer's router 4 x 64 and
    # 4 experts; the final LayerNorm 2 x 64
    assert counts.total == (640 + 32) * 64 + 2 * (4 * 64 + 4 * 64 * 64) + EXPERT + 4 * 64 + 4 * EXPERT + 2 * 64
    assert sorted(ranks) == list(range(LAYOUTS[name][0]))
    for r in ranks.values():
        assert (r["parameters"], r["parameters_no_embedding"]) == (counts.total, counts.no_embedding)
        assert (r["parameters_active"], r["parameters_active_no_embedding"]) == \
            (counts.active, counts.active_no_embedding)
        assert r["flops_per_sample"] == flops_per_sample(SHAPE, False)
        assert r["count_calls"] == 1 and r["collectives_in_log"] == 0
        # C = 6 N_active D
        assert r["gigaflos_no_embeds"] == pytest.approx(6 * ITERS * 8 * 32 * counts.active_no_embedding / 1e9)
    out = proc.stdout
    assert f"estimated model parameters: {counts.total / 1e9}\n" in out
    assert f"estimated active model parameters: {counts.active / 1e9}\n" in out
    assert f"estimated active model parameters without embeddings: {counts.active_no_embedding / 1e9}\n" in out
    assert f"experts per EP rank (EP={ep}): {4 // ep} experts" in out
    assert f"  experts             | {4 * EXPERT:,}\n" in out
    # memory: every EP rank holds E/EP experts per MoE layer, and the prediction is exact on each
    n = LAYOUTS[name][0]
    assert f"weights + gradients + optimizer: predicted == measured on {n} of {n} ranks" in out
    assert "(MoE layers counted as dense ones: routing and capacity buffers not included)" in out


@pytest.mark.parametrize("name", ["tp2_pp2", "ep2"])
def test_layout_reproduces_the_reference_and_logs_the_moe_loss(runs, name):
    ref, other = (logged_iterations(runs[n][0].stdout) for n in ("ref", name))
    assert sorted(ref) == sorted(other) == list(range(1, ITERS + 1))
    for it in ref:
        for key in ("lm loss", "moe loss"):
            assert other[it][key] == pytest.approx(ref[it][key], rel=1e-5), (it, key)
        assert other[it]["grad norm"] == pytest.approx(ref[it]["grad norm"], abs=2e-3), it  # printed to 3 places
        assert 0 < ref[it]["moe loss"] < 4  # coeff 1 x l_aux of one MoE layer; top-2 l_aux is at most E
    assert ref[ITERS]["lm loss"] < ref[1]["lm loss"]


@pytest.mark.parametrize("name", RESUMED)
def test_resume_is_exact(runs, name):
    whole, resumed = runs[name][1][0]["losses"], runs[f"{name}_resumed"][1][0]["losses"]
    assert sorted(map(int, resumed)) == list(range(RESUME_AT + 1, ITERS + 1))
    assert resumed == {it: loss for it, loss in whole.items() if int(it) > RESUME_AT}  # bit for bit
    assert "saved checkpoint at iteration 3" in runs[name][0].stdout
    resumed_log, whole_log = (logged_iterations(runs[n][0].stdout) for n in (f"{name}_resumed", name))
    for it in range(RESUME_AT + 1, ITERS + 1):
        assert resumed_log[it]["moe loss"] == whole_log[it]["moe loss"]


def test_bf16_zero1_trains_close_to_fp32(runs):
    """Mixed precision with ZeRO-1 and the experts in their own param groups (DeepSpeed partitions
    those over the expert-data-parallel group): bf16 rounding only."""
    ref, bf16 = (logged_iterations(runs[n][0].stdout) for n in ("ref", "ep2_bf16_zero1"))
    assert sorted(bf16) == list(range(1, ITERS + 1))
    for it in ref:
        assert bf16[it]["lm loss"] == pytest.approx(ref[it]["lm loss"], rel=2e-2), it
        assert bf16[it]["moe loss"] == pytest.approx(ref[it]["moe loss"], rel=5e-2), it
    assert "estimate: with ZeRO 1 DeepSpeed partitions the expert parameter groups" in runs["ep2_bf16_zero1"][0].stdout


def test_export_refuses_an_moe_checkpoint_in_one_line(runs, tmp_path):
    import subprocess
    import sys

    from tests.support.launch import ROOT
    proc = subprocess.run([sys.executable, "tools/convert_checkpoint_to_hf.py", "--load", str(runs["tp2_pp2_ckpt"]),
                           "--output", str(tmp_path / "hf")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"convert_checkpoint_to_hf.py: error: {runs['tp2_pp2_ckpt']}/global_step3: a mixture-of-"
                           f"experts model (4 experts per MoE layer) has no transformers architecture here "
                           f"(GPT2LMHeadModel, LlamaForCausalLM, GPTNeoXForCausalLM, BloomForCausalLM, "
                           f"Qwen2ForCausalLM are dense)\n")
    assert not (tmp_path / "hf").exists()
