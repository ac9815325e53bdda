"""The README's commands as a user runs them: the quickstart trains on the bundled corpus with
TP=2 x PP=2, evaluates, saves, and a second invocation resumes; the seed discussion's launch
script prints the exact 52M count; the architecture comparison trains three variants at equal
compute and draws them."""
import os

from tests.support.example_runs import run_example


def test_quickstart_trains_evaluates_saves_and_resumes(tmp_path):
    quick = ["--log-interval", "1", "--eval-interval", "2", "--eval-iters", "1", "--save-interval", "2"]
    out = run_example("pretrain_gpt_tiny_cpu.sh", tmp_path, *quick, TRAIN_ITERS=2)
    assert "estimated model parameters: 0.001858304\n" in out  # 4 layers, h 128, vocab 8192, seq 128
    assert " iteration        2/       2 |" in out
    assert " validation loss at iteration 2 |" in out
    assert f"saved checkpoint at iteration 2 to {tmp_path / 'ckpt'}" in out
    out = run_example("pretrain_gpt_tiny_cpu.sh", tmp_path, *quick, TRAIN_ITERS=3)
    assert f"loaded checkpoint {tmp_path / 'ckpt'}/global_step2/" in out
    assert " iteration        3/       3 |" in out and " iteration        1/" not in out


def test_seed_launch_script_prints_the_exact_52m_count(tmp_path):
    # TP=2: the GPT-2 vocab 50257 pads to 50432 (a multiple of 128 x 2)
    out = run_example("pretrain_gpt_seed_52m.sh", tmp_path, N_GPUS=2, TP_SIZE=2, PP_SIZE=1, EXIT_INTERVAL=1)
    assert "estimated model parameters: 0.051565568\n" in out
    assert "estimated model parameters without embeddings: 0.025220096\n" in out
    # --exit-interval saves before it exits (the script passes --save)
    saved = f"saved checkpoint at iteration 1 to {tmp_path / 'ckpt'}\n"
    assert saved in out and "exiting program at iteration 1" in out
    assert out.index(saved) < out.index("exiting program at iteration 1")


def test_moe_example_prints_total_and_active_and_saves_experts_per_ep_rank(tmp_path):
    out = run_example("pretrain_gpt_moe_cpu.sh", tmp_path, "--log-interval", "1", "--save-interval", "2",
                      "--eval-interval", "2", TRAIN_ITERS=2)
    # 4 layers, h 128, vocab 8192, seq 128; layers 2 and 4 hold 4 experts each (top-2)
    h, expert = 128, 8 * 128 * 128 + 5 * 128
    total = 4 * (12 * h * h + 13 * h) + 2 * h + (8192 + 128) * h + 2 * (3 * expert + 4 * h)
    active = total - 2 * 2 * expert
    assert f"estimated model parameters: {total / 1e9}\n" in out
    assert f"estimated active model parameters: {active / 1e9}\n" in out
    assert " moe loss: " in out and " iteration        2/       2 |" in out
    saved = os.listdir(tmp_path / "ckpt" / "global_step2")
    # TP=2 x DP=2, EP=2: DeepSpeed's expert-parallel groups are consecutive ranks, here the TP pairs,
    # so TP rank t of DP replica 0 is EP rank t, holds experts 2t and 2t + 1 and writes them
    assert {f"layer_{m}_expert_{e}_mp_rank_{e // 2:02d}_model_states.pt" for m in range(2) for e in range(4)} \
        <= set(saved)
    assert {f"expp_rank_{t}_mp_rank_{t:02d}_optim_states.pt" for t in range(2)} <= set(saved)


def test_arch_and_scaling_trains_three_variants_at_equal_compute_and_draws_them(tmp_path):
    """At 50 gigaflos per run (the least that leaves the fits 4 points above a fifth of it). N
    without embeddings by hand, 4 layers, h 128: GPT-2 12h^2 + 13h per layer + the final norm 2h;
    BLOOM-style adds the embedding LayerNorm's 2h; LLaMA-style per layer q and o 2h^2, k and v
    2 x 2 heads x 16 x h, SwiGLU ffn 320 3 x 320h, two RMSNorms 2h, and the final norm h. Samples:
    50e9 / (6 x seq 128 x N), to the nearest global batch of 16."""
    h = 128
    gpt2 = 4 * (12 * h * h + 13 * h) + 2 * h
    n = {"gpt2": gpt2, "bloom": gpt2 + 2 * h, "llama": 4 * (2 * h * h + 2 * 2 * 16 * h + 3 * 320 * h + 2 * h) + h}
    assert n == {"gpt2": 793_344, "bloom": 793_600, "llama": 656_512}
    samples = {"gpt2": 80, "bloom": 80, "llama": 96}  # 82.06, 82.04, 99.16 samples: 5.13, 5.13, 6.20 batches
    for name in n:
        assert round(50e9 / (6 * 128 * n[name]) / 16) * 16 == samples[name]
    picture = tmp_path / "curves.png"
    out = run_example("arch_and_scaling_cpu.sh", tmp_path, GIGAFLOS=50, OUT=tmp_path / "runs", PICTURE=picture)
    for name in n:
        assert f"{name}: {n[name]} parameters without embeddings -> {samples[name]} samples for 50 gigaflos\n" in out
        tokens = samples[name] * 128
        assert f"N = {n[name]:,} without embeddings | sequence length 128 | " in out
        assert f"up to {6 * n[name] * tokens / 1e9:.4g} gigaflos and {tokens:,} tokens" in out
        assert f"[{name}]  validation loss at the end of training" in out
    assert out.count("fit (training loss) ") == 3
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {picture}" in out
