"""TensorBoard scalars are float32: a parameter count above 2^24 that is odd reads back rounded.
The exact integers are in the same event file as a text summary (the startup report's table)."""
import numpy as np

from tests.support.launcher import TINY, launch

L, H, HEADS, SEQ, PADDED_VOCAB = 3, 1023, 3, 32, 640  # --vocab-size 600 pads to 640


def test_exact_count_is_in_the_event_file_as_text(tmp_path):
    args = list(TINY)
    for name, value in (("--num-layers", L), ("--hidden-size", H), ("--num-attention-heads", HEADS)):
        args[args.index(name) + 1] = str(value)
    args += ["--global-batch-size", 2, "--train-iters", 1, "--tensorboard-dir", tmp_path / "tb"]
    _, results = launch(1, args, str(tmp_path / "run"))

    # GPT-2 block by hand: L (12 h^2 + 13 h) + final LayerNorm 2h; plus (padded vocab + positions) x h
    no_embedding = L * (12 * H * H + 13 * H) + 2 * H
    total = (PADDED_VOCAB + SEQ) * H + no_embedding
    assert (total, no_embedding) == (38_404_443, 37_716_987)  # above 2^24 = 16,777,216 and odd
    assert (results[0]["parameters"], results[0]["parameters_no_embedding"]) == (total, no_embedding)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    [scalar] = events.Scalars("model/parameters")
    [scalar_no_embedding] = events.Scalars("model/parameters without embeddings")
    # the scalars are the float32 rounding (spacing 4 between 2^25 and 2^26), not the count
    assert scalar.value == float(np.float32(total)) == 38_404_444
    assert scalar_no_embedding.value == float(np.float32(no_embedding)) == 37_716_988
    [text] = events.Tensors("model/parameters (exact)/text_summary")  # torch appends /text_summary
    assert text.step == 0
    report = text.tensor_proto.string_val[0].decode()
    assert f"model parameters (exact): {total:,} total, {no_embedding:,} without embeddings " \
           f"(TP=1 PP=1 DP=1, padded vocab {PADDED_VOCAB})" in report
    assert f"      0 |      {L} | {total:20,} | {total:,}" in report  # the per-stage row
    assert f"  word_embeddings     | {PADDED_VOCAB * H:,}" in report
    assert f"  attention           | {L * (4 * H * H + 4 * H):,}" in report
