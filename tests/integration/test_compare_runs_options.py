"""tools/compare_runs.py's options other than the defaults, on event files with known points:
--fit-on validation fits the validation points (a power law of another exponent than training's),
--fit-max-gigaflos (with --fit-min-gigaflos) leaves out the points beyond it, --title names the
figure, and the picture's format follows --output's suffix (.pdf). Expected exponents, point counts
and ranges are those the points were generated with, counted by hand."""
import re

import numpy as np

from tests.support.compare_runs_cli import GIGAFLOS, TRAIN, VALID, compare

SEQ, N = 32, 100_000
A, L_INF = 8.0, 2.0
ALPHA_TRAIN, ALPHA_VALID = 0.5, 0.2


def write_run(path, train, valid):
    """An event file with the trainer's tags and text summary: train / valid are [(tokens, loss)]."""
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(path))
    text = [f"model parameters (exact): {N + 1000:,} total, {N:,} without embeddings (TP=1 PP=1 DP=1, padded "
            "vocab 640)", "architecture: learned positions, gelu ffn 256, layernorm, 4 heads, tied"]
    writer.add_text("model/parameters (exact)", "\n".join("    " + line for line in text), 0)
    for tag, points in ((TRAIN, train), (VALID, valid)):
        for it, (tokens, loss) in enumerate(points, start=1):
            writer.add_scalar(tag, loss, it)
            writer.add_scalar(tag + " vs samples", loss, tokens // SEQ)
            writer.add_scalar(tag + " vs tokens", loss, tokens)
            writer.add_scalar(tag + GIGAFLOS, loss, int(6 * N * tokens / 1e9))
    writer.close()
    return str(path)


def gigaflos(tokens):
    return 6 * N * np.asarray(tokens) / 1e9


def power_law(tokens, alpha, seed):
    c = gigaflos(tokens)
    return A * c ** -alpha + L_INF + np.random.default_rng(seed).normal(0, 0.005, len(c))


def as_points(tokens, loss):
    return list(zip(tokens.tolist(), loss.tolist(), strict=True))


def fit_line(printed):
    found = re.search(r"fit \((\w+) loss\) .*alpha = ([\d.]+) \+- ([\d.]+), L_inf = ([\d.]+) \+- ([\d.]+) "
                      r"\((\d+) points, C from ([\d.e+]+) to ([\d.e+]+) gigaflos\)", printed)
    which, alpha, alpha_err, l_inf, l_inf_err, points, c_min, c_max = found.groups()
    return which, float(alpha), float(alpha_err), float(l_inf), float(l_inf_err), int(points), float(c_min), \
        float(c_max)


# training: 40 points from 0.6 to 6000 gigaflos; validation: 16 points from 6 to 600 (every 2.5th)
TRAIN_TOKENS = np.unique(np.geomspace(1e3, 1e7, 40).astype(int) // SEQ * SEQ)
VALID_TOKENS = np.unique(np.geomspace(1e4, 1e6, 16).astype(int) // SEQ * SEQ)


def test_fit_on_validation_fits_the_validation_points(tmp_path, capsys):
    run = write_run(tmp_path / "run", as_points(TRAIN_TOKENS, power_law(TRAIN_TOKENS, ALPHA_TRAIN, 0)),
                    as_points(VALID_TOKENS, power_law(VALID_TOKENS, ALPHA_VALID, 1)))
    out = tmp_path / "report.pdf"
    printed = compare(capsys, run, "--output", out, "--fit", "--fit-on", "validation", "--title", "valid only")
    which, alpha, alpha_err, l_inf, l_inf_err, points, c_min, c_max = fit_line(printed)
    assert which == "validation" and points == len(VALID_TOKENS) == 16
    assert abs(alpha - ALPHA_VALID) < 2 * alpha_err < 0.1 and abs(l_inf - L_INF) < 2 * l_inf_err < 0.2
    # the C range of the validation points, as the event file's integer steps hold them
    assert (c_min, c_max) == (float(f"{gigaflos(VALID_TOKENS[0]):.4g}"), float(f"{gigaflos(VALID_TOKENS[-1]):.4g}"))
    assert out.read_bytes()[:5] == b"%PDF-"
    # the default fits the training points: the other exponent
    printed = compare(capsys, run, "--output", tmp_path / "train.png", "--fit")
    which, alpha, alpha_err, *_, points, _, _ = fit_line(printed)
    assert which == "training" and points == len(TRAIN_TOKENS)
    assert abs(alpha - ALPHA_TRAIN) < 2 * alpha_err < 0.1


def test_fit_max_gigaflos_leaves_out_the_points_beyond_it(tmp_path, capsys):
    loss = power_law(TRAIN_TOKENS, ALPHA_TRAIN, 2)
    c = gigaflos(TRAIN_TOKENS)
    loss[c > 1000] += 1.0  # a late divergence the power law does not describe
    run = write_run(tmp_path / "run", as_points(TRAIN_TOKENS, loss), [])
    printed = compare(capsys, run, "--output", tmp_path / "fit.png", "--fit", "--fit-min-gigaflos", 1,
                      "--fit-max-gigaflos", 1000)
    _, alpha, alpha_err, l_inf, l_inf_err, points, c_min, c_max = fit_line(printed)
    inside = [g for g in c if 1 <= g <= 1000]  # C = 6 N tokens, by hand
    assert points == len(inside) < len(c) and 1 <= c_min and c_max <= 1000
    assert abs(alpha - ALPHA_TRAIN) < 2 * alpha_err < 0.1 and abs(l_inf - L_INF) < 2 * l_inf_err < 0.2
    # without the upper bound the divergence pulls the fit off
    printed = compare(capsys, run, "--output", tmp_path / "all.png", "--fit", "--fit-min-gigaflos", 1)
    _, alpha_all, alpha_all_err, *_ = fit_line(printed)
    assert abs(alpha_all - ALPHA_TRAIN) > 3 * alpha_all_err


def test_title_names_the_figure(tmp_path, capsys):
    run = write_run(tmp_path / "run", [(1024, 7.0), (2048, 6.5)], [])
    out = tmp_path / "titled.svg"
    compare(capsys, run, "--output", out, "--title", "gpt2 vs llama at 1e18 FLOPs")
    svg = out.read_text()
    # matplotlib's SVG keeps each text as a comment beside its glyphs; the tool adds the sequence length
    assert "<!-- gpt2 vs llama at 1e18 FLOPs (sequence length 32) -->" in svg
    assert "lm loss at equal compute" not in svg
