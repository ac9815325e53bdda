#!/usr/bin/env python
"""Compare training runs at equal compute: lm loss against gigaflos (without embeddings) and against
tokens, training and validation, one curve per run, labelled with its architecture and exact
non-embedding parameter count; optionally a power-law fit L(C) = a * C^(-alpha) + L_inf per
architecture (the runs sharing an architecture line form one family).

    python tools/compare_runs.py output_dir/tb_gpt2 output_dir/tb_llama --output report.png \
        --fit --fit-min-gigaflos 50

Each RUN_DIR is the --tensorboard-dir of one run. Needs the `plots` extra (matplotlib, scipy):
pip install -e ".[plots]". The points come from tools/run_curves.py, the fit from
tools/power_law_fit.py; this file only selects, prints and draws."""
import argparse
import math
import os
import sys
from collections.abc import Sequence

from power_law_fit import PowerLawFit, fit_power_law
from run_curves import Run, RunError, check_comparable, legend_label, load_run


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="the --tensorboard-dir of each run")
    p.add_argument("--output", required=True, help="the picture (.png, .svg or .pdf)")
    p.add_argument("--title", default="lm loss at equal compute", help="the figure's title")
    p.add_argument("--fit", action="store_true", help="fit L(C) = a * C^(-alpha) + L_inf per architecture")
    p.add_argument("--fit-on", choices=("training", "validation"), default="training",
                   help="the loss the fit uses (default: training)")
    p.add_argument("--fit-min-gigaflos", type=float, default=0.0,
                   help="fit only points at or above this compute (leave out the warmup's transient)")
    p.add_argument("--fit-max-gigaflos", type=float, default=float("inf"), help="fit only points up to this compute")
    args = p.parse_args(argv)
    if not args.fit and (args.fit_min_gigaflos != 0.0 or args.fit_max_gigaflos != float("inf")):
        raise RunError("--fit-min-gigaflos / --fit-max-gigaflos select the points of --fit: add --fit")
    if args.fit_min_gigaflos >= args.fit_max_gigaflos:
        raise RunError(f"--fit-min-gigaflos {args.fit_min_gigaflos} must be below --fit-max-gigaflos "
                       f"{args.fit_max_gigaflos}")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise RunError(f"--output {args.output}: directory {out_dir} does not exist; create it first")
    return args


def fit_families(runs: Sequence[Run], args: argparse.Namespace) -> dict[str, PowerLawFit]:
    """{architecture: PowerLawFit} over the selected points of the runs of each architecture."""
    families: dict[str, list[Run]] = {}
    for run in runs:
        families.setdefault(run.architecture, []).append(run)
    fits = {}
    for arch, members in families.items():
        points = [(c, loss) for run in members
                  for c, loss in zip(*_xy(run, args.fit_on, "gigaflos"), strict=True)
                  if args.fit_min_gigaflos <= c <= args.fit_max_gigaflos]
        names = ", ".join(run.name for run in members)
        if len(points) < 4:
            raise RunError(f"--fit: {len(points)} {args.fit_on} points of {names} between --fit-min-gigaflos "
                           f"{args.fit_min_gigaflos} and --fit-max-gigaflos {args.fit_max_gigaflos}; "
                           "a 3-parameter fit needs at least 4: widen the range or log more often (--log-interval)")
        try:
            fits[arch] = fit_power_law(*zip(*points, strict=True))
        except RuntimeError as e:  # curve_fit did not converge
            raise RunError(f"--fit: the power law does not fit the points of {names} ({e}); "
                           "select another range with --fit-min-gigaflos / --fit-max-gigaflos") from None
    return fits


def _xy(run: Run, which: str, axis: str) -> tuple[Sequence[float], list[float]]:
    curve = run.train if which == "training" else run.valid
    return getattr(curve, axis), curve.loss


def draw(runs: Sequence[Run], fits: dict[str, PowerLawFit], args: argparse.Namespace) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib import ticker

    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharey="row")
    colors = {run.path: f"C{i}" for i, run in enumerate(runs)}
    for row, which in enumerate(("training", "validation")):
        for col, axis in enumerate(("gigaflos", "tokens")):
            ax = axes[row][col]
            for run in runs:
                x, y = _xy(run, which, axis)
                if x:
                    ax.plot(x, y, marker="." if which == "validation" else None, color=colors[run.path],
                            label=legend_label(run) if (row, col) == (0, 0) else None)
            ax.set_xscale("log")
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.FuncFormatter(_minor_label))
            ax.set_xlabel("gigaflos (without embeddings)" if axis == "gigaflos" else "tokens")
            ax.set_ylabel(f"{which} lm loss")
            ax.grid(True, which="both", alpha=0.3)
            if not any(_xy(run, which, axis)[0] for run in runs):
                ax.text(0.5, 0.5, f"no {which} points", ha="center", transform=ax.transAxes)
    fit_ax = axes[0 if args.fit_on == "training" else 1][0]
    for arch, fit in fits.items():
        members = [run for run in runs if run.architecture == arch]
        c = np.geomspace(fit.c_min, fit.c_max, 100)
        label = (f"fit {', '.join(run.name for run in members)} ({args.fit_on}): alpha = {fit.alpha:.3f} "
                 f"+- {fit.alpha_err:.3f}, L_inf = {fit.l_inf:.2f} +- {fit.l_inf_err:.2f}")
        fit_ax.plot(c, fit(c), linestyle="--", color=colors[members[0].path], linewidth=2, label=label)
    handles, labels = [], []
    for ax in (axes[0][0], axes[1][0]):
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    seq = runs[0].seq_length
    fig.suptitle(f"{args.title} (sequence length {seq})")
    fig.legend(handles, labels, loc="lower center", fontsize=8, ncol=1, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.025 * len(labels), 1, 1))
    fig.savefig(args.output, dpi=80)
    plt.close(fig)


def _minor_label(value: float, _: int | None) -> str:
    """2 and 5 x 10^k only: a run spanning less than a decade still gets labels, without crowding."""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if round(mantissa) in (2, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        import matplotlib  # noqa: F401
        import scipy  # noqa: F401
    except ImportError as e:
        raise RunError(f"{e.name} is not installed: pip install -e \".[plots]\"") from None
    runs = [load_run(path) for path in args.runs]
    names = [run.name for run in runs]
    for run in runs:  # runs in .../a/tb and .../b/tb: the legend names them by their paths
        if names.count(run.name) > 1:
            run.name = os.path.normpath(run.path)
    check_comparable(runs)
    for run in runs:
        print(f"{legend_label(run)} | sequence length {run.seq_length} | {len(run.train.loss)} training and "
              f"{len(run.valid.loss)} validation points, up to {run.train.gigaflos[-1]:.4g} gigaflos "
              f"and {run.train.tokens[-1]:,} tokens")
    fits = fit_families(runs, args) if args.fit else {}
    for arch, fit in fits.items():
        print(f"fit ({args.fit_on} loss) {arch}: {fit.describe()}")
    draw(runs, fits, args)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    try:
        main()
    except RunError as e:  # bad input: one line, as pretrain_gpt.py prints its errors
        print(f"compare_runs.py: error: {e}", file=sys.stderr)
        sys.exit(2)
