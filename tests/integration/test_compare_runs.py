"""tools/compare_runs.py: the points it draws are the scalars of real runs' event files, its legend
holds the exact counts of the text summary, its power-law fit recovers a known exponent within the
uncertainty it states, and bad input is one line."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from tests.support.compare_runs_cli import GIGAFLOS, TRAIN, VALID, compare, power_law_fit, run_curves
from tests.support.launcher import TINY, launch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "compare_runs.py")
ITERS, GBS, SEQ = 6, 4, 32
LLAMA_FLAGS = ["--use-rotary-position-embeddings", "--no-position-embedding", "--swiglu", "--normalization", "rmsnorm",
               "--untie-embeddings-and-output-weights", "--disable-bias-linear", "--num-key-value-heads", 2]


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """Two tiny single-rank runs (GPT-2 and LLaMA-style), 6 iterations, validation every 2."""
    tmp = tmp_path_factory.mktemp("runs")
    args = TINY + ["--global-batch-size", GBS, "--train-iters", ITERS]
    args[args.index("--eval-interval") + 1] = "2"
    runs = {}
    for name, extra in (("gpt2", []), ("llama", LLAMA_FLAGS)):
        _, ranks = launch(1, args + extra + ["--tensorboard-dir", tmp / name], str(tmp / f"{name}_out"))
        runs[name] = (str(tmp / name), ranks[0])
    return runs


def _read_back(path):
    """{tag: [(step, value)]} and the text summaries, with TensorBoard's plain event file loader
    (no accumulator: every event in the order written)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util
    scalars, texts = {}, []
    for name in sorted(os.listdir(path)):
        for event in EventFileLoader(os.path.join(path, name)).Load():
            for v in event.summary.value:
                if v.metadata.plugin_data.plugin_name == "text":
                    texts.append(tensor_util.make_ndarray(v.tensor).item().decode())
                elif v.metadata.plugin_data.plugin_name == "scalars":
                    scalars.setdefault(v.tag, []).append((event.step, float(tensor_util.make_ndarray(v.tensor))))
    return scalars, texts


def test_points_and_legend_of_real_runs(real_runs, tmp_path, capsys):
    # by hand, h = 64, 2 layers: GPT-2 2 (12 h^2 + 13 h) + final LayerNorm 2h; LLaMA-style per layer
    # q 64x64 + k,v 2x(2 heads x 16)x64, dense 64x64, SwiGLU ffn int(8*64/3/64)*64 = 128 as
    # 3 x 128 x 64, two RMSNorm weights 2 x 64, plus the final RMSNorm 64
    # (the embeddings: padded vocab 640 x 64, plus 32 x 64 positions for GPT-2, an untied output layer for LLaMA)
    expected = {"gpt2": (100_096, "learned positions, gelu ffn 256, layernorm, 4 heads, tied"),
                "llama": (2 * (4096 + 4096 + 4096 + 3 * 128 * 64 + 128) + 64,
                          "rotary, swiglu ffn 128, rmsnorm, 4 query / 2 kv heads, untied, no bias")}
    totals = {"gpt2": 100_096 + (640 + 32) * 64, "llama": 74_048 + 2 * 640 * 64}
    assert expected["llama"][0] == 74_048
    for name, (path, rank) in real_runs.items():
        n, arch = expected[name]
        assert rank["parameters_no_embedding"] == n
        run = run_curves.load_run(path)
        scalars, texts = _read_back(path)
        assert (run.parameters, run.parameters_no_embedding, run.compute_parameters) == (totals[name], n, n)
        assert (run.architecture, run.seq_length) == (arch, SEQ)
        assert f"{n:,} without embeddings" in texts[0] and f"architecture: {arch}" in texts[0]
        assert run_curves.legend_label(run) == f"{name}: {arch}; N = {n:,} without embeddings"

        # training: one point per iteration (--log-interval 1), GBS samples of SEQ tokens each
        assert run.train.tokens == [GBS * SEQ * i for i in range(1, ITERS + 1)]
        assert run.train.tokens == [step for step, _ in scalars[TRAIN + " vs tokens"]]
        assert run.train.loss == [value for _, value in scalars[TRAIN + " vs gigaflos (without embeddings)"]]
        assert run.train.loss == [value for _, value in scalars[TRAIN]]  # the iteration-step tag too
        assert run.train.loss == pytest.approx([rank["losses"][str(i)] for i in range(1, ITERS + 1)], rel=1e-6)
        # C = 6 N D; the event file's integer step is that, truncated; the trainer's own float sum at the end
        assert run.train.gigaflos == pytest.approx([6 * n * t / 1e9 for t in run.train.tokens], rel=1e-12)
        assert [int(c) for c in run.train.gigaflos] == [step for step, _ in scalars[TRAIN + GIGAFLOS]]
        assert run.train.gigaflos[-1] == pytest.approx(rank["gigaflos_no_embeds"], rel=1e-12)

        # validation after iterations 2, 4, 6 and at the end of training (6 again: the later one kept)
        valid = scalars[VALID + " vs tokens"]
        assert [step for step, _ in valid] == [GBS * SEQ * i for i in (2, 4, 6, 6)]
        assert run.valid.tokens == [GBS * SEQ * i for i in (2, 4, 6)]
        assert run.valid.loss == [value for _, value in valid[:2] + valid[3:]]
        assert run.valid.gigaflos == pytest.approx([6 * n * t / 1e9 for t in run.valid.tokens], rel=1e-12)

    # the command line on both: the legend lines it prints, and a picture
    out = tmp_path / "report.png"
    printed = compare(capsys, real_runs["gpt2"][0], real_runs["llama"][0], "--output", out)
    for name, (n, arch) in expected.items():
        assert f"{name}: {arch}; N = {n:,} without embeddings | sequence length 32 | 6 training and 3 validation" \
            in printed
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def write_run(path, seq=32, n=1_000_000, points=(), gigaflos=True, active=None, flops_n=None):
    """An event file with the trainer's tags and text summary, for points (tokens, loss); `active`:
    an MoE run's active non-embedding count; `flops_n`: the N its gigaflos tag was written with."""
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(path))
    text = [f"model parameters (exact): {n + 1000:,} total, {n:,} without embeddings (TP=1 PP=1 DP=1, padded "
            "vocab 640)", "architecture: learned positions, gelu ffn 256, layernorm, 4 heads, tied"]
    if active:
        text.append(f"active parameters per token (exact): {active + 1000:,}, {active:,} without embeddings "
                    "(top-1, 1 MoE layers of 4 experts)")
    writer.add_text("model/parameters (exact)", "\n".join("    " + line for line in text), 0)
    for it, (tokens, loss) in enumerate(points, start=1):
        writer.add_scalar(TRAIN, loss, it)
        writer.add_scalar(TRAIN + " vs samples", loss, tokens // seq)
        writer.add_scalar(TRAIN + " vs tokens", loss, tokens)
        if gigaflos:
            writer.add_scalar(TRAIN + GIGAFLOS, loss, int(6 * (flops_n or active or n) * tokens / 1e9))
    writer.close()
    return str(path)


A, ALPHA, L_INF = 8.0, 0.3, 2.0


def power_law_points(c, rng, noise=0.01):
    return A * c ** -ALPHA + L_INF + rng.normal(0, noise, len(c))


def test_fit_recovers_a_known_exponent_within_its_uncertainty():
    c = np.geomspace(10, 1e5, 40)  # far from C = 1, where a and alpha are strongly correlated
    within = []
    for seed in range(40):
        fit = power_law_fit.fit_power_law(c, power_law_points(c, np.random.default_rng(seed)))
        assert 0 < fit.alpha_err < 0.05  # an uncertainty that says something
        within.append([abs(fit.alpha - ALPHA) < 2 * fit.alpha_err, abs(fit.l_inf - L_INF) < 2 * fit.l_inf_err,
                       abs(fit.a - A) < 2 * fit.a_err])
    # a calibrated standard error holds the truth within 2 sigma 95% of the time: 38 of 40 expected
    assert (np.array(within).sum(axis=0) >= 34).all(), np.array(within).sum(axis=0)


def test_fit_from_the_command_line_over_selected_points(tmp_path, capsys):
    seq, n = 32, 100_000
    tokens = np.unique(np.geomspace(1e3, 1e7, 40).astype(int) // seq * seq)
    c = 6 * n * tokens / 1e9  # 0.6 to 6000 gigaflos
    loss = power_law_points(c, np.random.default_rng(0))
    loss[c < 10] += 3.0  # a warmup transient the power law does not describe
    run = write_run(tmp_path / "synthetic", seq, n, zip(tokens.tolist(), loss.tolist(), strict=True))
    out = tmp_path / "fit.svg"
    printed = compare(capsys, run, "--output", out, "--fit", "--fit-min-gigaflos", 10)
    fit = re.search(r"alpha = ([\d.]+) \+- ([\d.]+), L_inf = ([\d.]+) \+- ([\d.]+) \((\d+) points", printed)
    alpha, alpha_err, l_inf, l_inf_err, used = map(float, fit.groups())
    assert used == (c >= 10).sum() < len(c)
    assert abs(alpha - ALPHA) < 2 * alpha_err < 0.1 and abs(l_inf - L_INF) < 2 * l_inf_err < 0.2
    assert out.read_text().startswith("<?xml")
    # the transient left in pulls the fit away from the truth: the selection is what made it right
    everything = power_law_fit.fit_power_law(c, loss)
    assert abs(everything.a - A) > 3 * everything.a_err


def test_moe_run_is_placed_by_its_active_count(tmp_path):
    # 10,000 tokens x 6 x 400,000 active = 24 gigaflos (the total non-embedding 1,000,000 would give 60)
    run = run_curves.load_run(write_run(tmp_path / "moe", n=1_000_000, active=400_000, points=[(10_000, 5.0)]))
    assert (run.compute_parameters, run.train.gigaflos) == (400_000, [24.0])
    with pytest.raises(run_curves.RunError, match=r"step 60 is not 6 x N x tokens = 24.000 gigaflos"):
        run_curves.load_run(write_run(tmp_path / "total", active=400_000, flops_n=1_000_000, points=[(10_000, 5.0)]))


def test_bad_input_is_one_line(real_runs, tmp_path, capsys):
    # the command line as users run it: one line on stderr, exit code 2, no picture
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([sys.executable, TOOL, tmp_path / "empty", "--output", tmp_path / "x.png"],
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (2, f"compare_runs.py: error: {tmp_path / 'empty'}: no TensorBoard event "
                                                 "files (events.out.tfevents.*); pass the --tensorboard-dir of a "
                                                 "training run\n")

    def error(*args):
        with pytest.raises(run_curves.RunError) as e:
            compare(capsys, *args, "--output", tmp_path / "x.png")
        assert "\n" not in str(e.value) and not (tmp_path / "x.png").exists()
        return str(e.value)

    old = write_run(tmp_path / "old", points=[(64, 7.0), (128, 6.5)], gigaflos=False)
    assert f"{old}: no 'lm-loss-training/lm loss vs gigaflos (without embeddings)' scalars" in error(old)
    seq64 = write_run(tmp_path / "seq64", seq=64, points=[(128, 7.0), (256, 6.5)])
    assert error(real_runs["gpt2"][0], seq64) == ("the runs have different --seq-length (gpt2: 32, seq64: 64); "
                                                  "compare runs of one sequence length")
    assert "--fit: 2 training points of seq64" in error(seq64, "--fit")
    no_fit = error(seq64, "--fit-min-gigaflos", 1)
    assert "--fit-min-gigaflos / --fit-max-gigaflos select the points of --fit: add --fit" in no_fit
