"""The FLOPs convention (--flops-attention): the forks count attention's s^2 terms in full,
Megatron-LM halves them for the causal mask. Both counts worked out by hand for one stated tiny
config; the startup report, tools/param_count.py, TensorBoard and the MFU line say which is used."""
import importlib

import pytest

from megatron.metrics.config import LoggingConfig
from megatron.metrics.training_log import log_model_size
from megatron.model.analytic import analytic_parameter_counts, flops_per_sample
from megatron.utils import cache_parameter_counts, format_parameter_report
from tests.support.validated_args import validated

# tests/support/validated_args.py's BASE: 4 layers, h 64, 4 heads, s 32, ffn 4h = 256, vocab 600
# padded to 640. Forward per layer: QKV 2 s h 3h = 786,432; scores QK^T and context AV 2 x 2 s^2 h
# = 262,144 (causal: half, 131,072); projection 2 s h^2 = 262,144; MLP 2 x 2 s h f = 2,097,152.
# Logits 2 s h V = 2,621,440. Forward and backward: 3 x the forward.
QKV, ATTENTION, PROJECTION, MLP, LOGITS = 786_432, 262_144, 262_144, 2_097_152, 2_621_440
FULL = 3 * (4 * (QKV + ATTENTION + PROJECTION + MLP) + LOGITS)
CAUSAL = 3 * (4 * (QKV + ATTENTION // 2 + PROJECTION + MLP) + LOGITS)
FULL_LINE = ("FLOPs convention: attention's s^2 terms in full (as both Megatron-DeepSpeed forks count them; "
             "--flops-attention causal halves them as Megatron-LM does)")
CAUSAL_LINE = ("FLOPs convention: attention's s^2 terms halved for the causal mask (Megatron-LM's count, "
               "--flops-attention causal; both Megatron-DeepSpeed forks count them in full)")


def test_both_counts_by_hand():
    assert (FULL, CAUSAL) == (48_758_784, 47_185_920)
    shape = validated().model_shape
    assert flops_per_sample(shape, False) == FULL
    assert flops_per_sample(shape, False, causal=True) == CAUSAL
    # with recompute, the recomputed forward is counted in the same convention: + 4 layers' forward
    assert flops_per_sample(shape, True, causal=True) == CAUSAL + 4 * (QKV + ATTENTION // 2 + PROJECTION + MLP)


@pytest.mark.parametrize("extra, flops, line", [((), FULL, FULL_LINE),
                                                (("--flops-attention", "causal"), CAUSAL, CAUSAL_LINE)])
def test_the_run_caches_reports_and_writes_its_convention(extra, flops, line):
    args = validated(extra)
    counts = analytic_parameter_counts(args.model_shape)
    cache_parameter_counts(args, counts)  # what the trainer does once the model is built
    assert (args.flops_per_sample == args.model_flops_per_sample == args.flops_per_sample_at[32]
            == args.model_flops_per_sample_at[32] == flops)
    report = format_parameter_report(counts, args.model_shape, causal_attention=bool(extra))
    assert report[-2:] == [line, f"FLOPs per sample (model, fwd+bwd): {flops:,}"]

    class Writer:
        texts = {}

        def add_scalar(self, *a):
            pass

        def add_text(self, tag, text, step):
            self.texts[tag] = (text, step)
    writer = Writer()
    log_model_size(writer, args, False, report)
    assert writer.texts["model/FLOPs convention"] == (line, 0)


def test_param_count_tool_states_it():
    # imported under its own name (not load_tool's), so that mutation testing reaches it
    tool = importlib.import_module("tools.param_count")
    flags = ["--num-layers", 4, "--hidden-size", 64, "--num-attention-heads", 4, "--seq-length", 32,
             "--max-position-embeddings", 32, "--vocab-size", 600]
    for extra, flops, line in (((), FULL, FULL_LINE), (("--flops-attention", "causal"), CAUSAL, CAUSAL_LINE)):
        lines = tool.report(tool.parse_args([str(f) for f in flags + list(extra)]))
        at = lines.index(line)
        assert lines[at + 1] == f"FLOPs per sample (model, fwd+bwd): {flops:,}"


def test_mfu_says_which_it_used():
    full = LoggingConfig.from_args(validated(["--peak-tflops", 100]))
    assert full.mfu.reason == ("MFU against --peak-tflops 100 per device; model FLOPs with attention's s^2 terms in "
                               "full (both forks' convention)")
    causal = LoggingConfig.from_args(validated(["--peak-tflops", 100, "--flops-attention", "causal"]))
    assert causal.mfu.reason.endswith("; model FLOPs with attention's s^2 terms halved for the causal mask "
                                      "(Megatron-LM's convention)")


def test_the_convention_keeps_the_peak_and_says_itself():
    """Naming the convention changes only the startup line: the peak MFU divides by stays (a lost
    peak would turn MFU off), and no peak stays no peak (the reason says why)."""
    from megatron.metrics.mfu import MfuSettings, with_flops_convention
    given = MfuSettings(989.0, "--peak-tflops 989")
    assert with_flops_convention(given, causal=True) == MfuSettings(
        989.0, "--peak-tflops 989; model FLOPs with attention's s^2 terms halved for the causal mask "
               "(Megatron-LM's convention)")
    assert with_flops_convention(given, causal=False) == MfuSettings(
        989.0, "--peak-tflops 989; model FLOPs with attention's s^2 terms in full (both forks' convention)")
    none = MfuSettings(None, "no peak known for this device")
    assert with_flops_convention(none, causal=True) == none
