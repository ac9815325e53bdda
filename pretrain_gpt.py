"""Pretrain GPT: `deepspeed pretrain_gpt.py <Megatron-DeepSpeed flags>`."""
import sys
from argparse import Namespace
from typing import TYPE_CHECKING, Any

import torch

from megatron import mpu, print_rank_0
from megatron.model.config import GPTConfig
from megatron.model.gpt_model import GPTModel, GPTModelPipe
from megatron.model.moe import create_expert_groups
from megatron.runtime.refusal import ConfigError

# a run stopped by --check-for-nan-in-loss-and-grad or --check-for-spiky-loss (the table of exit codes:
# docs/long-runs.md#exit-codes)
NON_FINITE_EXIT_CODE = 3

if TYPE_CHECKING:
    from megatron.schedules.progress import TrainingProgress
    from megatron.training.trainer import TrainerHooks


def model_provider(args: Namespace) -> GPTModel | GPTModelPipe:
    config = GPTConfig.from_args(args)
    create_expert_groups(args.model_shape)  # MoE: DeepSpeed's expert groups, before the experts are built
    if args.ds_pipeline_enabled:
        return GPTModelPipe(config, topology=mpu.get_topology(), seed=args.seed)
    return GPTModel(config, seed=args.seed)


Inputs = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # tokens, or (tokens, doc_ids)


def get_batch(data: dict[str, torch.Tensor]) -> tuple[Inputs, tuple[torch.Tensor, torch.Tensor]]:
    """{"text": [b, s+1]} -> (tokens [b, s], (labels [b, s], loss_mask [b, s])); s/SP under
    DeepSpeed-Ulysses (--ds-sequence-parallel-size). With --reset-position-ids /
    --reset-attention-mask the inputs are (tokens, doc_ids [b, s]): each position's document
    (megatron/model/documents.py), a tuple as the forks' pipeline inputs are. --eod-mask-loss: no
    loss where the input is an end-of-document token (the forks' rule: the prediction made from it)."""
    from megatron import get_args, get_tokenizer
    from megatron.model.documents import document_ids
    args = get_args()
    text = data["text"].long()
    tokens, labels = text[:, :-1].contiguous(), text[:, 1:].contiguous()
    loss_mask = torch.ones(labels.shape, dtype=torch.float32)
    if args.eod_mask_loss:
        loss_mask[tokens == get_tokenizer().eod] = 0.0
    # DeepSpeed-Ulysses: the SP ranks of a replica read the same samples, each keeps its chunk
    tokens, labels, loss_mask = (mpu.sequence_chunk(t, 1) for t in (tokens, labels, loss_mask))
    if torch.cuda.is_available():
        tokens, labels, loss_mask = (t.cuda(non_blocking=True) for t in (tokens, labels, loss_mask))
    if args.reset_position_ids or args.reset_attention_mask:
        return (tokens, document_ids(tokens, get_tokenizer().eod)), (labels, loss_mask)
    return tokens, (labels, loss_mask)


def forward_step(batch: tuple[Inputs, tuple[torch.Tensor, torch.Tensor]], model: Any) -> torch.Tensor:
    # model: the DeepSpeed engine around GPTModel
    inputs, (labels, loss_mask) = batch
    if isinstance(inputs, tuple):
        tokens, doc_ids = inputs
        return model(tokens, labels, loss_mask, doc_ids=doc_ids)
    return model(inputs, labels, loss_mask)


def train_valid_test_datasets_provider(args: Namespace, train_valid_test_num_samples: list[int]) -> tuple[Any, ...]:
    # per split: a Dataset, [(group name, Dataset)] (--valid/--test-weighted-split-paths) or None
    print_rank_0(f"building train / valid / test datasets for {train_valid_test_num_samples} samples")
    if args.mock_data:
        from megatron import get_tokenizer
        from megatron.data.mock_dataset import build_mock_datasets
        return build_mock_datasets(train_valid_test_num_samples, args.seq_length, get_tokenizer().vocab_size,
                                   args.seed)
    from megatron.data.gpt_dataset import build_train_valid_test_datasets
    if args.weighted_split_groups:  # valid / test: [(group name, dataset)], each evaluated on its own
        from megatron.data.weighted_split_paths import build_datasets
        return build_datasets(args.weighted_split_groups, train_valid_test_num_samples, args.seq_length, args.seed,
                              args.data_impl, args.data_cache_path)
    try:
        if args.train_data_path:  # a path per split, each read whole (Megatron-LM; no --split)
            from megatron.data.gpt_dataset import build_per_split_datasets
            return build_per_split_datasets((args.train_data_path, args.valid_data_path, args.test_data_path),
                                            args.data_impl, train_valid_test_num_samples, args.seq_length, args.seed,
                                            skip_warmup=True, cache_path=args.data_cache_path)
        return build_train_valid_test_datasets(data_prefix=args.data_path, data_impl=args.data_impl,
                                               splits_string=args.split,
                                               train_valid_test_num_samples=train_valid_test_num_samples,
                                               seq_length=args.seq_length, seed=args.seed, skip_warmup=True,
                                               cache_path=args.data_cache_path)
    except (ValueError, OSError) as e:  # --data-path / --split that cannot give the samples asked for
        raise ConfigError(str(e)) from None


def main(args_list: list[str] | None = None,
         hooks: "TrainerHooks | None" = None) -> "tuple[Namespace, TrainingProgress]":
    """hooks: a megatron.training.TrainerHooks that watches the run (tests/pretrain_driver.py)."""
    from megatron.training import LossCheckStop, pretrain
    try:
        return pretrain(train_valid_test_datasets_provider, model_provider, forward_step, get_batch,
                        args_list=args_list, hooks=hooks)
    except ConfigError as e:
        # one line naming the flag and the fix, instead of a stack trace from deep inside; once per
        # job (global rank 0), every rank exiting with code 2 (megatron/runtime/refusal.py)
        from megatron.runtime.refusal import exit_refused
        exit_refused("pretrain_gpt.py", str(e))
    except LossCheckStop:  # its one line is out (rank 0); nothing was saved at that iteration
        sys.exit(NON_FINITE_EXIT_CODE)


if __name__ == "__main__":
    # every outcome (finished, refused, NaN stop, crash) leaves with its own exit code and without
    # interpreter teardown, which gloo's threads can turn into an abort (status 250)
    from megatron.runtime.process_exit import run_and_exit
    run_and_exit(main, "pretrain_gpt.py")
