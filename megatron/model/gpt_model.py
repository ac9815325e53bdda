"""GPT as a plain module (GPTModel, for --no-pipeline-parallel) and as a DeepSpeed
PipelineModule (GPTModelPipe, for --deepspeed at any PP, 1 included).

Both build layer i after seeding the RNG with `seed + i` (DeepSpeed's `seed_layers`), with the
same layer order (0: embedding, 1..L: transformer layers, L+1: final norm, L+2: output layer),
so every TP x PP layout and both wrappers start from the same full weights. The output layer is
the word embedding (tied, GPT-2) or, with --untie-embeddings-and-output-weights, its own weight.
"""
import torch
from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
from deepspeed.runtime.utils import set_random_seed
from torch import nn

from megatron import mpu
from .language_model import Embedding, OutputLayer, lm_loss, parallel_lm_logits
from .layer_norm import norm_class
from .moe import add_moe_loss
from .transformer import ParallelTransformer, ParallelTransformerLayerPipe


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
        return self.encoder(self.embedding(input_ids))


class GPTModel(nn.Module):
    """The whole model in one module; a tied output layer is the word embedding (one tensor)."""

    def __init__(self, config, seed=1234):
        super().__init__()
        self.language_model = TransformerLanguageModel(config, seed)

    def word_embeddings_weight(self):
        return self.language_model.embedding.word_embeddings_weight

    def output_weight(self):
        if self.language_model.output_layer is not None:
            return self.language_model.output_layer.weight
        return self.word_embeddings_weight()

    def forward(self, tokens, labels=None, loss_mask=None):
        logits = parallel_lm_logits(self.language_model(tokens), self.output_weight())
        if labels is None:
            return logits  # [s, b, V/tp]
        return add_moe_loss(lm_loss(logits, labels, loss_mask))  # MoE: backward adds the aux loss


class EmbeddingPipe(Embedding):
    """The tied "embed" module: input embedding on the first stage, output layer on the last."""


def _logits_helper(embedding, hidden_states):
    return parallel_lm_logits(hidden_states, embedding.word_embeddings_weight)


def _pipe_loss(logits, labels):
    labels, loss_mask = labels
    return lm_loss(logits, labels, loss_mask)


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
        specs.append(LayerSpec(norm_class(shape.normalization), shape.hidden_size, eps=config.layernorm_epsilon))
        if shape.tied:
            specs.append(TiedLayerSpec("embed", EmbeddingPipe, config, forward_fn=_logits_helper,
                                       tied_weight_attr="word_embeddings_weight"))
        else:
            specs.append(LayerSpec(OutputLayer, config))
        super().__init__(layers=specs, loss_fn=_pipe_loss, topology=topology,
                         seed_layers=True, base_seed=seed, seed_fn=_seed_layer,
                         partition_method="type:transformer")
        # seed_layers is for building only: left on, DeepSpeed would also reseed every layer in
        # every forward from a micro-batch counter that checkpoints do not save, so a resumed
        # run would replay the first iterations' dropout masks
        self.seed_layers = False
        self.checkpoint_num_layers = config.checkpoint_num_layers if config.checkpoint_activations else 0

    def forward(self, forward_input):
        """This stage's layers; with --checkpoint-activations every run of `checkpoint_num_layers`
        transformer layers is recomputed in backward. DeepSpeed's own interval chunking would
        count the embedding, the final LayerNorm and the output layer into the chunks and then
        recompute none of a chunk that touches them (with 2 layers and k = 2, nothing at all),
        so every transformer layer is recomputed here, as the FLOPs formula and the non-pipeline
        model assume."""
        if not (self.checkpoint_num_layers and torch.is_grad_enabled()):
            return super().forward(forward_input)
        x, funcs, i = forward_input, self.forward_funcs, 0
        while i < len(funcs):
            if not isinstance(funcs[i], ParallelTransformerLayerPipe):
                x = funcs[i](x)
                i += 1
                continue
            end = i
            while end < min(len(funcs), i + self.checkpoint_num_layers) and \
                    isinstance(funcs[end], ParallelTransformerLayerPipe):
                end += 1
            x = mpu.checkpoint(_run_layers(funcs[i:end]), x)
            i = end
        return x


def _run_layers(layers):
    def run(hidden_states):
        for layer in layers:
            hidden_states = layer(hidden_states)
        return hidden_states
    return run
