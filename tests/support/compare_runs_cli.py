"""tools/compare_runs.py in-process, for the tests of its command line (test_compare_runs*.py):
its siblings loaded by name as `python tools/compare_runs.py` finds them, and the scalar tags it reads."""
from tests.support.tool_modules import load_tool

TRAIN = "lm-loss-training/lm loss"
VALID = "lm-loss-validation/lm loss validation"
GIGAFLOS = " vs gigaflos (without embeddings)"

# compare_runs.py imports its siblings by name
run_curves = load_tool("run_curves")
power_law_fit = load_tool("power_law_fit")
compare_runs = load_tool("compare_runs")


def compare(capsys, *args):
    """The command line in-process (one interpreter: matplotlib imported once); its stdout."""
    compare_runs.main(list(map(str, args)))
    return capsys.readouterr().out
