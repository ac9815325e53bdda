"""GPT as a plain module (GPTModel, for --no-pipeline-parallel) and as a DeepSpeed
PipelineModule (GPTModelPipe, for --deepspeed at any PP, 1 included).

Both build layer i after seeding the RNG with `seed + i` (DeepSpeed's `seed_layers`), with the
same layer order (0: embedding, 1..L: transformer layers, L+1: final norm, L+2: output layer),
so every TP x PP layout and both wrappers start from the same full weights. The output layer is
the word embedding (tied, GPT-2) or, with --untie-embeddings-and-output-weights, its own weight.
"""
import dataclasses

import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.utils import set_random_seed
from torch import nn

from .language_model import Embedding, OutputLayer, lm_loss, parallel_lm_logits
from .layer_norm import norm_class
from .moe import add_moe_loss, pack_moe_loss, record_moe_loss, unpack_moe_loss
from .partition import DEFAULT_METHOD, stage_parts
from .transformer import ParallelTransformer, ParallelTransformerLayerPipe, checkpoint_chunks, checkpointed, run_layers


class TransformerLanguageModel(nn.Module):
    def __init__(self, config, seed):
        super().__init__()
        set_random_seed(seed)
        self.embedding = Embedding(config)
        self.encoder = ParallelTransformer(config, layer_seed_fn=lambda i: set_random_seed(seed + 1 + i))
        self.output_layer = None
        if not config.shape.tied:
            set_random_seed(seed + config.shape.num_layers + 2)  # GPTModelPipe's layer L+2
            self.output_layer = OutputLayer(config)

    def forward(self, input_ids):
        """Final hidden states, or (those, moe loss) for an MoE model."""
        return self.encoder(self.embedding(input_ids))


class GPTModel(nn.Module):
    """The whole model in one module; a tied output layer is the word embedding (one tensor)."""

    def __init__(self, config, seed=1234):
        super().__init__()
        self.language_model = TransformerLanguageModel(config, seed)
        self.is_moe = config.shape.is_moe

    def word_embeddings_weight(self):
        return self.language_model.embedding.word_embeddings_weight

    def output_weight(self):
        if self.language_model.output_layer is not None:
            return self.language_model.output_layer.weight
        return self.word_embeddings_weight()

    def forward(self, tokens, labels=None, loss_mask=None):
        hidden_states, moe_loss = _split_moe_loss(self.language_model(tokens))
        logits = parallel_lm_logits(hidden_states, self.output_weight())
        if labels is None:
            return logits  # [s, b, V/tp]
        if moe_loss is not None and self.training:
            record_moe_loss(moe_loss)
        return add_moe_loss(lm_loss(logits, labels, loss_mask), moe_loss)  # MoE: backward adds the moe loss


def _split_moe_loss(state):
    return state if isinstance(state, tuple) else (state, None)


class EmbeddingPipe(Embedding):
    """The tied "embed" module: input embedding on the first stage, output layer on the last."""


def _logits_helper(embedding, hidden_states):
    return parallel_lm_logits(hidden_states, embedding.word_embeddings_weight)


def _pipe_loss(logits, labels):
    labels, loss_mask = labels
    return lm_loss(logits, labels, loss_mask)


class _MoELossToTheLoss:
    """MoE models: the function after the last transformer layer keeps the moe loss, and the loss
    function (the same stage and micro-batch) adds it in gradient (add_moe_loss)."""

    def __init__(self):
        self.value = None

    def take(self, state):
        hidden_states, self.value = _split_moe_loss(state)
        return hidden_states

    def loss(self, logits, labels):
        return add_moe_loss(_pipe_loss(logits, labels), self.value)


def _seed_layer(seed):
    # DeepSpeed's type: partitioning yields numpy layer indices; `random.seed` wants an int
    set_random_seed(int(seed))


class GPTModelPipe(PipelineModule):
    """Pipeline inputs: tokens [b, s]; labels: (labels [b, s], loss_mask [b, s]). Attention is
    causal and positions are implicit, so only hidden states [s, b, h] cross stage boundaries.
    Untied, the output layer is a plain layer of the last stage: no TiedLayerSpec, no tied-gradient
    all-reduce between the first and last stage."""

    def __init__(self, config, topology, seed=1234):
        shape = config.shape
        if shape.tied:
            specs = [TiedLayerSpec("embed", EmbeddingPipe, config, tied_weight_attr="word_embeddings_weight")]
        else:
            specs = [LayerSpec(EmbeddingPipe, config)]
        specs += [LayerSpec(ParallelTransformerLayerPipe, config, layer_number=i + 1) for i in range(shape.num_layers)]
        moe_loss = _MoELossToTheLoss() if shape.is_moe else None
        if moe_loss is not None:
            specs.append(moe_loss.take)
        specs.append(LayerSpec(norm_class(shape.normalization), shape.hidden_size, eps=config.layernorm_epsilon))
        if shape.tied:
            specs.append(TiedLayerSpec("embed", EmbeddingPipe, config, forward_fn=_logits_helper,
                                       tied_weight_attr="word_embeddings_weight"))
        else:
            specs.append(LayerSpec(OutputLayer, config))
        # the analytic split (partition.py; balanced by FLOPs by default) for the topology's stages
        self._parts = stage_parts(dataclasses.replace(shape, pipeline_model_parallel_size=topology.get_dim("pipe")))
        method = shape.pp_partition_method or DEFAULT_METHOD
        super().__init__(layers=specs, loss_fn=_pipe_loss if moe_loss is None else moe_loss.loss, topology=topology,
                         seed_layers=True, base_seed=seed, seed_fn=_seed_layer, partition_method=method)
        if tuple(self.parts) != self._parts:  # DeepSpeed's own methods: it split, we predicted
            raise RuntimeError(f"--pp-partition-method {method}: DeepSpeed split the layers at {list(self.parts)}, "
                               f"megatron/model/partition.py predicts {list(self._parts)}")
        self.num_transformer_layers = shape.num_layers
        # seed_layers is for building only: left on, DeepSpeed would also reseed every layer in
        # every forward from a micro-batch counter that checkpoints do not save, so a resumed
        # run would replay the first iterations' dropout masks
        self.seed_layers = False
        self.checkpoint_num_layers = config.checkpoint_num_layers if config.checkpoint_activations else 0
        self.checkpoint_method = config.checkpoint_method
        self.moe_loss = moe_loss
        self.is_moe = shape.is_moe  # whether or not this stage holds an MoE layer

    def _partition_layers(self, method):
        """DeepSpeed's methods stay DeepSpeed's (checked against ours above); its PipelineModule
        has no method that weighs layers by cost, so the default split is set here."""
        if method.lower() != DEFAULT_METHOD:
            return super()._partition_layers(method=method)
        self.parts = list(self._parts)
        stage = self.stage_id
        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    def forward(self, forward_input):
        """This stage's layers. An MoE model passes (hidden states, moe loss) between its layers
        and one packed tensor between stages (pack_moe_loss)."""
        if self.moe_loss is None:
            return self._run_stage(forward_input)
        received = None
        if self.stage_id > 0:
            hidden_states, received = unpack_moe_loss(forward_input)
            forward_input = (hidden_states, received)
        output = self._run_stage(forward_input)
        last = self.stage_id == self.num_stages - 1
        hidden_states, moe_loss = (output, self.moe_loss.value) if last else _split_moe_loss(output)
        if self.training and torch.is_grad_enabled():  # every stage records its layers' part
            record_moe_loss(_difference(moe_loss, received, hidden_states))
        return output if last else pack_moe_loss(hidden_states, moe_loss)

    def _run_stage(self, state):
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


def _difference(total, received, like):
    """This stage's part of the moe loss (either may be None: no MoE layer so far)."""
    if total is None:
        return like.new_zeros(())
    return total if received is None else total - received
