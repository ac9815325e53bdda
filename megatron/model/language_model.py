"""Input embedding (word + learned position) and the output logits that reuse the word
embedding's weight."""
import torch
import torch.nn.functional as F
from torch import nn

from megatron import mpu


class Embedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        shape = config.shape
        self.word_embeddings = mpu.VocabParallelEmbedding(shape.padded_vocab_size, shape.hidden_size,
                                                          config.init_method(), config.params_dtype)
        # replicated on every TP rank; initialised on CPU like the TP layers so layouts agree
        weight = torch.empty(shape.max_position_embeddings, shape.hidden_size, dtype=torch.float32)
        config.init_method()(weight)
        self.position_embeddings = nn.Embedding.from_pretrained(weight.to(config.params_dtype), freeze=False)
        self.embedding_dropout = nn.Dropout(config.hidden_dropout)

    @property
    def word_embeddings_weight(self):
        return self.word_embeddings.weight

    def forward(self, input_ids):
        # input_ids: [b, s] -> [s, b, h]
        position_ids = torch.arange(input_ids.size(1), device=input_ids.device)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
        return self.embedding_dropout(embeddings.transpose(0, 1).contiguous())


def parallel_lm_logits(hidden_states, word_embeddings_weight):
    """[s, b, h] x [V/tp, h] -> [s, b, V/tp]: logits for this TP rank's vocabulary slice."""
    hidden_states = mpu.copy_to_tensor_model_parallel_region(hidden_states)
    return F.linear(hidden_states, word_embeddings_weight)


def lm_loss(logits, labels, loss_mask):
    """Mean token loss over the unmasked tokens. logits [s, b, V/tp]; labels, loss_mask [b, s]."""
    losses = mpu.vocab_parallel_cross_entropy(logits, labels.t())  # [s, b]
    loss_mask = loss_mask.t().float()
    return (losses * loss_mask).sum() / loss_mask.sum()
