"""--reset-position-ids --reset-attention-mask --eod-mask-loss against a plain per-document run:
each document of a sample run alone (its own sequence, positions from 0, nothing else to attend to)
through the same weights without the flags. The flagged model must give the same logits at every
position, and the same loss with the predictions made from end-of-document tokens left out
(the forks' --eod-mask-loss). Checked on the plain module (learned / rotary / ALiBi positions, both
attention implementations) and through DeepSpeed's pipeline engine at PP=2, whose stages pass
(hidden states, document index) tuples: the second stage's layers see the documents too."""
import pytest
import torch
import torch.nn.functional as F

from tests.support.distributed import run_distributed
from tests.support.model_fixtures import SEED, tiny_config

EOD = 127
S = 16
VARIANTS = [dict(position_embedding_type="absolute", attention_impl="sdpa"),
            dict(position_embedding_type="rotary", attention_impl="math"),
            dict(position_embedding_type="alibi", attention_impl="sdpa"),
            dict(position_embedding_type="absolute", attention_impl="math")]


def _batch():
    """Two samples of S tokens (+1 for the labels) below EOD, with end-of-document tokens: row 0
    holds documents of 4, 6 and 7 tokens; row 1 one of 1 token, then one that runs to the end."""
    g = torch.Generator().manual_seed(3)
    text = torch.randint(0, EOD, (2, S + 1), generator=g)
    text[0, [3, 9]] = EOD
    text[1, [0, 16]] = EOD
    return text[:, :-1].contiguous(), text[:, 1:].contiguous()


def _documents(row):
    """[(start, end)] of one row of tokens: each document up to and including its EOD."""
    ends = [i + 1 for i, t in enumerate(row.tolist()) if t == EOD]
    bounds = [0] + [e for e in ends if e < len(row)] + [len(row)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _per_document(variant):
    """Logits [s, b, V] of each document run alone through the model without the flags, and the
    mean token loss over the positions whose input is not an EOD."""
    from megatron.model.gpt_model import GPTModel
    model = GPTModel(tiny_config(**variant), seed=SEED).eval()
    tokens, labels = _batch()
    logits = torch.zeros(S, 2, 128)
    with torch.no_grad():
        for b in range(2):
            for start, end in _documents(tokens[b]):
                logits[start:end, b] = model(tokens[b:b + 1, start:end])[:, 0]
    losses = F.cross_entropy(logits.permute(1, 2, 0), labels, reduction="none")  # [b, s]
    keep = tokens != EOD
    return logits, (losses * keep).sum() / keep.sum()


def _flagged(variant, reset_position_ids=True, reset_attention_mask=True):
    from megatron.model.documents import document_ids
    from megatron.model.gpt_model import GPTModel
    model = GPTModel(tiny_config(**variant, reset_position_ids=reset_position_ids,
                                 reset_attention_mask=reset_attention_mask), seed=SEED).eval()
    tokens, labels = _batch()
    doc_ids = document_ids(tokens, EOD)
    loss_mask = (tokens != EOD).float()  # what pretrain_gpt.get_batch makes with --eod-mask-loss
    with torch.no_grad():
        return model(tokens, doc_ids=doc_ids), model(tokens, labels, loss_mask, doc_ids=doc_ids)


def _plain_module_cases():
    out = []
    for variant in VARIANTS:
        expected_logits, expected_loss = _per_document(variant)
        logits, loss = _flagged(variant)
        out.append((variant, expected_logits, expected_loss, logits, loss))
    # each flag alone is not the per-document run (learned positions): both are needed, and each acts
    variant = VARIANTS[0]
    expected_logits, _ = _per_document(variant)
    alone = [_flagged(variant, reset_position_ids=p, reset_attention_mask=m)[0] for p, m in ((True, False),
                                                                                         (False, True))]
    return out, expected_logits, alone


def test_plain_module_equals_per_document_runs():
    cases, expected_logits, alone = run_distributed(1, _plain_module_cases)[0]
    for variant, want_logits, want_loss, logits, loss in cases:
        torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5, msg=str(variant))
        torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-6, msg=str(variant))
    for logits in alone:
        assert not torch.allclose(logits, expected_logits, atol=1e-3)


def _pipeline_eval():
    import deepspeed

    from megatron import mpu
    from megatron.model.documents import document_ids
    from megatron.model.gpt_model import GPTModelPipe
    config = tiny_config(num_layers=2, reset_position_ids=True, reset_attention_mask=True)
    model = GPTModelPipe(config, topology=mpu.get_topology(), seed=SEED)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        config={"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 10 ** 9})
    tokens, labels = _batch()
    loss_mask = (tokens != EOD).float()
    batch = ((tokens, document_ids(tokens, EOD)), (labels, loss_mask))
    seen = []  # the second stage's layers: the document index they were called with
    for module in model.forward_funcs:
        if type(module).__name__ == "ParallelTransformerLayerPipe":
            module.self_attention.register_forward_pre_hook(lambda m, inputs: seen.append(inputs[1].tolist()))
    loss = engine.eval_batch(iter([batch])).item()
    train_loss = engine.train_batch(iter([batch])).item()  # lr 0: the backward runs through the tuples
    return {"stage": mpu.get_pipeline_model_parallel_rank(), "loss": loss, "train_loss": train_loss, "seen": seen,
            "expected": document_ids(tokens, EOD).tolist()}


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_pipeline_engine_carries_the_documents_to_the_last_stage():
    ranks = run_distributed(2, _pipeline_eval, pp=2)
    _, want_loss = run_distributed(1, _per_document, VARIANTS[0])[0]
    last = next(r for r in ranks if r["stage"] == 1)
    assert last["loss"] == pytest.approx(float(want_loss), rel=1e-5)
    assert last["train_loss"] == pytest.approx(float(want_loss), rel=1e-5)
    for rank in ranks:  # each stage's layers got the batch's document index
        assert rank["seen"] and all(seen == rank["expected"] for seen in rank["seen"])


def _get_batch():
    """pretrain_gpt.get_batch with the three flags on, for one made-up sample (EOD 9):
    text 5 9 7 8 9 6 | 2 -> tokens 5 9 7 8 9 6, labels 9 7 8 9 6 2."""
    from argparse import Namespace

    import pretrain_gpt
    from megatron.runtime.global_vars import set_args, set_tokenizer
    set_args(Namespace(eod_mask_loss=True, reset_position_ids=True, reset_attention_mask=True))
    set_tokenizer(Namespace(eod=9))
    (tokens, doc_ids), (labels, loss_mask) = pretrain_gpt.get_batch({"text": torch.tensor([[5, 9, 7, 8, 9, 6, 2]])})
    return tokens.tolist(), doc_ids.tolist(), labels.tolist(), loss_mask.tolist()


def test_get_batch_by_hand():
    """The documents [5 9] [7 8 9] [6]: no loss where the input is the EOD (positions 1 and 4)."""
    tokens, doc_ids, labels, loss_mask = run_distributed(1, _get_batch)[0]
    assert tokens == [[5, 9, 7, 8, 9, 6]] and labels == [[9, 7, 8, 9, 6, 2]]
    assert doc_ids == [[0, 0, 1, 1, 1, 2]] and loss_mask == [[1, 0, 1, 1, 0, 1]]


def test_launches_pipeline_equals_plain_module(tmp_path):
    """pretrain_gpt.py end to end on documents ending in the EOD (NullTokenizer: id 599): the
    first iteration's loss with the flags through the PP=2 pipeline engine equals the plain
    module's (the same initial weights), and differs from the run without the reset flags."""
    import numpy as np

    from megatron.data.indexed_dataset import MMapIndexedDatasetBuilder
    from tests.support.launcher import TINY, launch
    rng = np.random.RandomState(0)
    prefix = str(tmp_path / "docs")
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _ in range(40):
        builder.add_item(np.append(rng.randint(0, 599, size=rng.randint(2, 12)), 599))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    flags = [f for f in TINY if f != "--mock-data"] + [
        "--data-path", prefix, "--tokenizer-type", "NullTokenizer", "--split", "1,0,0", "--eval-iters", "0",
        "--train-iters", "1", "--global-batch-size", "2", "--eod-mask-loss"]
    reset = ["--reset-position-ids", "--reset-attention-mask"]
    _, pipe = launch(2, flags + reset + ["--pipeline-model-parallel-size", "2"], str(tmp_path / "pipe"))
    _, plain = launch(1, flags + reset + ["--no-pipeline-parallel"], str(tmp_path / "plain"))
    _, without = launch(1, flags + ["--no-pipeline-parallel"], str(tmp_path / "without"))
    loss = plain[0]["losses"]["1"]
    assert pipe[1]["losses"]["1"] == pytest.approx(loss, rel=1e-5)
    assert abs(without[0]["losses"]["1"] - loss) > 1e-3


def test_refused_under_ulysses():
    """Each DeepSpeed-Ulysses rank holds a chunk of the sequence, not its documents: one line."""
    from megatron.runtime.refusal import ConfigError
    from tests.support.validated_args import validated
    for flag in ("--reset-position-ids", "--reset-attention-mask"):
        with pytest.raises(ConfigError, match="do not run with --ds-sequence-parallel-size > 1"):
            validated([flag, "--ds-sequence-parallel-size", "2", "--no-pipeline-parallel"], world_size=2)
    validated(["--reset-position-ids", "--reset-attention-mask", "--eod-mask-loss"])  # otherwise accepted
