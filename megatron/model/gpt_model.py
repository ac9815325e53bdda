"""GPT as a plain module (GPTModel, for --no-pipeline-parallel) and as a DeepSpeed
PipelineModule (GPTModelPipe, for --deepspeed at any PP, 1 included).

Both build layer i after seeding the RNG with `seed + i` (DeepSpeed's `seed_layers`), with the
same layer order (0: embedding, 1..L: transformer layers, L+1: final norm, L+2: output layer;
an MoE pipe has `take` at L+1, which moves the last two up by one), so every TP x PP layout and
both wrappers start from the same full weights. The output layer is
the word embedding (tied, GPT-2) or, with --untie-embeddings-and-output-weights, its own weight.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from torch import nn

from megatron.mpu import mark_sequence_parallel
from megatron.runtime.deepspeed_internals import set_random_seed, set_stage_bounds, stop_reseeding_layers

from .analytic import stage_parts
from .config import GPTConfig
from .language_model import Embedding, OutputLayer, lm_loss, parallel_lm_logits
from .layer_norm import LAYER_NORM_TYPES, norm_spec
from .moe.aux_loss import collect_aux_losses, record_moe_loss
from .partition import DEFAULT_METHOD, FLOPS_METHOD
from .shape import PipeLayer
from .transformer import ParallelTransformer, ParallelTransformerLayerPipe, checkpoint_chunks, checkpointed, run_layers


class TransformerLanguageModel(nn.Module):
    def __init__(self, config: GPTConfig, seed: int) -> None:
        super().__init__()
        set_random_seed(seed)
        self.embedding = Embedding(config)
        self.encoder = ParallelTransformer(config, layer_seed_fn=lambda i: set_random_seed(seed + 1 + i))
        self.output_layer = None
        if not config.shape.tied:
            # GPTModelPipe's index of the output layer: L+2, or L+3 after an MoE pipe's `take` at L+1
            set_random_seed(seed + config.shape.num_layers + 2 + int(config.shape.is_moe))
            self.output_layer = OutputLayer(config)

    def forward(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states [s, b, h]; doc_ids: megatron/model/documents.py."""
        return self.encoder(self.embedding(input_ids, doc_ids), doc_ids)


class GPTModel(nn.Module):
    """The whole model in one module; a tied output layer is the word embedding (one tensor)."""

    def __init__(self, config: GPTConfig, seed: int = 1234) -> None:
        super().__init__()
        self.language_model = TransformerLanguageModel(config, seed)
        self.is_moe = config.shape.is_moe
        self.sequence_parallel = config.sequence_parallel

    def word_embeddings_weight(self) -> torch.Tensor:
        return self.language_model.embedding.word_embeddings_weight

    def output_weight(self) -> torch.Tensor:
        if self.language_model.output_layer is not None:
            return self.language_model.output_layer.weight
        return self.word_embeddings_weight()

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor | None = None,
                loss_mask: torch.Tensor | None = None, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [s, b, V/tp] without labels, else the lm loss (an MoE model's backward adds the
        moe loss: megatron/model/moe/aux_loss.py). doc_ids [b, s]: the samples' documents, with
        --reset-position-ids / --reset-attention-mask (megatron/model/documents.py)."""
        with collect_aux_losses() as aux_losses:
            hidden_states = self.language_model(tokens, doc_ids)
        logits = parallel_lm_logits(hidden_states, self.output_weight(), self.sequence_parallel)
        if labels is None:
            return logits
        if self.is_moe and self.training and torch.is_grad_enabled():
            record_moe_loss(aux_losses, like=hidden_states)
        return lm_loss(logits, labels, loss_mask)


class EmbeddingPipe(Embedding):
    """The tied "embed" module: input embedding on the first stage, output layer on the last."""


def _logits_helper(embedding, hidden_states):
    return parallel_lm_logits(hidden_states, embedding.word_embeddings_weight, embedding.sequence_parallel)


def _pipe_loss(logits, labels):
    labels, loss_mask = labels
    return lm_loss(logits, labels, loss_mask)


def take(hidden_states: torch.Tensor) -> torch.Tensor:
    """MoE models: an identity after the last transformer layer. It once carried the moe loss to
    the loss function; it keeps its pipe index (L + 1) and name, which the layer files of MoE
    checkpoints, the layer seeds after it, partition.py and megatron/utils.py's table names count."""
    return hidden_states


# PipelineModule's constructor broadcasts the tied word embedding from the first stage to the last
# (DeepSpeed's _synchronize_tied_weights) with grad mode on; c10d::broadcast_ has no autograd kernel,
# so torch's fallback hooks the mutated leaf parameter with a hook that only warns when its
# gradient is computed: once per rank, in the first backward. The hook passes the gradient through
# unchanged (tests/integration/test_pipeline.py: with the warning raised, every PP=2 update equals PP=1's, the
# tied embedding's included), so this exact message is filtered and nothing else.
TIED_BROADCAST_WARNING = r"c10d::broadcast_: an autograd kernel was not registered to the Autograd key"


def _pipe_layer_spec(config: GPTConfig, item: PipeLayer) -> Any:
    """DeepSpeed's spec (or function) for one entry of ModelShape.pipe_layers."""
    shape = config.shape
    if item.kind == "embedding":
        if shape.tied:
            return TiedLayerSpec("embed", EmbeddingPipe, config, tied_weight_attr="word_embeddings_weight")
        return LayerSpec(EmbeddingPipe, config)
    if item.kind == "transformer":
        return LayerSpec(ParallelTransformerLayerPipe, config, layer_number=item.layer)
    if item.kind == "moe_loss":
        return take
    if item.kind == "norm":
        cls, kwargs = norm_spec(shape.normalization, shape.hidden_size, config.layernorm_epsilon,
                                one_plus=shape.apply_layernorm_1p, mixed=config.fp32_residual_connection)
        return LayerSpec(cls, shape.hidden_size, **kwargs)
    if item.kind == "tied_output":
        return TiedLayerSpec("embed", EmbeddingPipe, config, forward_fn=_logits_helper,
                             tied_weight_attr="word_embeddings_weight")
    return LayerSpec(OutputLayer, config)


def _built_name(spec: Any) -> str:
    return spec.typename.__name__ if isinstance(spec, LayerSpec) else spec.__name__


def _seed_layer(seed):
    # DeepSpeed's type: partitioning yields numpy layer indices; `random.seed` wants an int
    set_random_seed(int(seed))


class GPTModelPipe(PipelineModule):
    """Pipeline inputs: tokens [b, s]; labels: (labels [b, s], loss_mask [b, s]). Attention is
    causal and positions are implicit, so only hidden states [s, b, h] cross stage boundaries;
    with --reset-position-ids / --reset-attention-mask the inputs are (tokens, doc_ids [b, s]) and
    (hidden states, doc_ids) cross them (megatron/model/documents.py).
    Untied, the output layer is a plain layer of the last stage: no TiedLayerSpec, no tied-gradient
    all-reduce between the first and last stage."""

    def __init__(self, config: GPTConfig, topology: Any, seed: int = 1234) -> None:  # DeepSpeed's ProcessTopology
        shape = config.shape
        order = shape.pipe_layers()
        specs = [_pipe_layer_spec(config, item) for item in order]
        # DeepSpeed's type:REGEX split matches these names; the analytic split matches the order's
        built = [_built_name(spec) for spec in specs]
        if built != [item.name for item in order]:
            raise RuntimeError(f"GPTModelPipe builds {built}, ModelShape.pipe_layers describes {list(order)}")
        # the analytic split (partition.py; type:transformer by default) for the topology's stages
        self._parts = stage_parts(dataclasses.replace(shape, pipeline_model_parallel_size=topology.get_dim("pipe")))
        method = shape.pp_partition_method or DEFAULT_METHOD
        warnings.filterwarnings("ignore", message=TIED_BROADCAST_WARNING, category=UserWarning)
        super().__init__(layers=specs, loss_fn=_pipe_loss, topology=topology,
                         seed_layers=True, base_seed=seed, seed_fn=_seed_layer, partition_method=method)
        if tuple(self.parts) != self._parts:  # DeepSpeed's own methods: it split, we predicted
            raise RuntimeError(f"--pp-partition-method {method}: DeepSpeed split the layers at {list(self.parts)}, "
                               f"megatron/model/partition.py predicts {list(self._parts)}")
        self.num_transformer_layers = shape.num_layers
        if config.sequence_parallel:  # the final norm (a plain LayerSpec) runs on a sequence shard too
            for module in self.forward_funcs:
                if isinstance(module, LAYER_NORM_TYPES):
                    for p in module.parameters():
                        mark_sequence_parallel(p)
        # seed_layers is for building only: left on, DeepSpeed would also reseed every layer in
        # every forward from a micro-batch counter that checkpoints do not save, so a resumed
        # run would replay the first iterations' dropout masks
        stop_reseeding_layers(self)
        self.checkpoint_num_layers = config.checkpoint_num_layers if config.checkpoint_activations else 0
        self.checkpoint_method = config.checkpoint_method
        self.moe_loss = take if shape.is_moe else None  # utils.py: an MoE pipe has the extra index
        self.is_moe = shape.is_moe  # whether or not this stage holds an MoE layer

    def _partition_layers(self, method):
        """DeepSpeed's methods stay DeepSpeed's (checked against ours above); its PipelineModule
        has no method that weighs layers by cost, so the flops split is set here."""
        if method.lower() != FLOPS_METHOD:
            return super()._partition_layers(method=method)
        set_stage_bounds(self, self._parts)

    def forward(self, forward_input: torch.Tensor | tuple[torch.Tensor, torch.Tensor]) -> Any:
        """This stage's layers; only hidden states (and doc_ids, see the class) cross a stage
        boundary. In an MoE model every stage records its own layers' moe loss for a training
        micro-batch (0 without MoE layers)."""
        def run() -> Any:
            if isinstance(forward_input, tuple):
                return self._run_documents(*forward_input)
            return self._run_stage(forward_input)
        if not self.is_moe:
            return run()
        with collect_aux_losses() as aux_losses:
            output = run()
        if self.training and torch.is_grad_enabled():
            record_moe_loss(aux_losses, like=output[0] if isinstance(output, tuple) else output)
        return output

    def _run_documents(self, state: torch.Tensor, doc_ids: torch.Tensor) -> Any:
        """The stage with doc_ids at the embedding and every transformer layer; the same chunks of
        checkpointed layers as _run_stage. Returns
        (hidden states, doc_ids) for the next stage, or the last stage's logits."""
        funcs = self.forward_funcs
        layers = [i for i, f in enumerate(funcs) if isinstance(f, ParallelTransformerLayerPipe)]
        chunks: dict[int, tuple[int, bool]] = {}
        if self.checkpoint_num_layers and torch.is_grad_enabled():
            chunks = {layers[start]: (layers[end - 1] + 1, recomputed) for start, end, recomputed in
                      checkpoint_chunks(len(layers), self.checkpoint_method, self.checkpoint_num_layers)}
        i = 0
        while i < len(funcs):
            if i in chunks:
                end, recomputed = chunks[i]
                state = (checkpointed if recomputed else run_layers)(funcs[i:end], state, doc_ids)
                i = end
                continue
            f = funcs[i]
            state = f(state, doc_ids) if isinstance(f, (EmbeddingPipe, ParallelTransformerLayerPipe)) else f(state)
            i += 1
        return state if self.stage_id == self.num_stages - 1 else (state, doc_ids)

    def _run_stage(self, state: torch.Tensor) -> torch.Tensor:
        """With activation checkpointing the stage's transformer layers run in the chunks of
        `checkpoint_chunks` (uniform: every run of `checkpoint_num_layers` layers recomputed in
        backward; block: the stage's first `checkpoint_num_layers` layers). DeepSpeed's own interval
        chunking would count the embedding, the final LayerNorm and the output layer into the chunks
        and then recompute none of a chunk that touches them (with 2 layers and k = 2, nothing at
        all), so the chunks are cut here over transformer layers only, as the FLOPs formula and the
        non-pipeline model assume."""
        if not (self.checkpoint_num_layers and torch.is_grad_enabled()):
            return super().forward(state)
        funcs = self.forward_funcs
        layers = [i for i, f in enumerate(funcs) if isinstance(f, ParallelTransformerLayerPipe)]
        chunks = {layers[start]: (layers[end - 1] + 1, recomputed) for start, end, recomputed in
                  checkpoint_chunks(len(layers), self.checkpoint_method, self.checkpoint_num_layers)}
        i = 0
        while i < len(funcs):
            if i not in chunks:
                state = funcs[i](state)
                i += 1
                continue
            end, recomputed = chunks[i]
            state = checkpointed(funcs[i:end], state) if recomputed else run_layers(funcs[i:end], state)
            i = end
        return state

