"""One real `deepspeed --num_gpus 2 pretrain_gpt.py` launch (ZeRO 1 through the pipeline engine at
PP=2, --peak-tflops): the startup memory table, the measured-vs-predicted report after the first
iteration, and an MFU on every log line that equals the tiny model's FLOPs, worked out by hand, over
the line's own samples per second."""
import re

from megatron.metrics.memory import TrainingSetup, predict_memory
from megatron.model.shape import ModelShape
from tests.support.launcher import TINY, launch

ITERS, PEAK = 4, 0.001  # a 1 GFLOP/s "device", so that CPU MFU has digits to compare


def test_launch_prints_memory_report_and_mfu(tmp_path):
    args = TINY + ["--pipeline-model-parallel-size", "2", "--global-batch-size", "8", "--train-iters", ITERS,
                   "--zero-stage", "1", "--peak-tflops", PEAK, "--tensorboard-dir", tmp_path / "tb"]
    proc, _ = launch(2, args, str(tmp_path))
    out = proc.stdout
    shape = ModelShape(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=32, vocab_size=600,
                       pipeline_model_parallel_size=2)
    setup = TrainingSetup(zero_stage=1, micro_batch_size=2, num_micro_batches=4)
    predicted = predict_memory(shape, setup)
    assert "memory per rank (predicted; fp32, ZeRO 1, DeepSpeedZeroOptimizer, DP=1, micro batch 2 x 4):" in out
    for r in predicted:
        assert (f"  {r.stage:5d} | {r.dp_rank:7d} | {r.weights:15,} | {r.gradients:15,} | {r.optimizer:15,} | "
                f"{r.activations:15,} | {r.total:15,}\n") in out
        # measured after iteration 1, printed once by the last rank: rank = stage here
        measured = re.search(rf"\n\s+{r.stage} \|\s+{r.stage} \|  0 \|  0 \| (.*)\n", out).group(1)
        cells = [c.strip().split("/") for c in measured.split("|")]
        values = [(int(p.replace(",", "")), int(m.replace(",", "").split()[0])) for p, m in cells]
        assert values[:3] == [(r.weights, r.weights), (r.gradients, r.gradients), (r.optimizer, r.optimizer)]
        assert abs(values[3][1] - r.activations) <= 0.05 * r.activations
    assert out.count("memory after the first iteration") == 1
    assert "weights + gradients + optimizer: predicted == measured on 2 of 2 ranks" in out
    assert f"MFU against --peak-tflops {PEAK:g} per device" in out

    # per sample, no recompute: 3 x (2 layers x (QKV 6sh^2 + scores and context 4s^2h + projection
    # 2sh^2 + MLP 16sh^2) + logits 2shV), s 32, h 64, V 640: 3 x (2 x 3,407,872 + 2,621,440)
    model_flops = 28_311_552
    lines = re.findall(r"samples per second: ([0-9.]+) \| TFLOPs: [0-9.]+ \| MFU: ([0-9.]+)% \|", out)
    assert len(lines) == ITERS
    for sps, mfu in lines:
        # the formula from the logged (rounded) samples per second, within both roundings
        expected = 100 * model_flops * float(sps) / 2 / (PEAK * 1e12)
        slack = 100 * model_flops * 0.0005 / 2 / (PEAK * 1e12) + 0.005
        assert abs(float(mfu) - expected) <= slack, (sps, mfu, expected)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    events.Reload()
    mfu = [e.value for e in events.Scalars("iteration-time/MFU")]
    sps = [e.value for e in events.Scalars("iteration-time/samples per second")]
    assert len(mfu) == ITERS
    for m, s in zip(mfu, sps, strict=True):
        assert abs(m - model_flops * s / 2 / (PEAK * 1e12)) <= 1e-6 * m
    # one writer, the last rank's (it sees the loss under pipeline parallelism): one event file
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
