"""An independent reference: GPT-2 written here in plain PyTorch (no project code in its math),
loaded with the weights our trainer built at TP=1, must give the same logits, loss and gradients
on a batch, and the same losses and gradient norms over real training steps of our trainer
(pipeline engine, two micro-batches per step, AdamW with biases and norms undecayed, clipping,
warmup + cosine LR). TP-vs-TP and PP-vs-PP tests cannot catch an error in the math they share;
this one can."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.support.distributed import run_distributed

L, H, HEADS, SEQ, VOCAB, PADDED_VOCAB = 2, 64, 4, 32, 600, 640
MICRO, GLOBAL, ITERS, WARMUP_ITERS = 2, 4, 6, 2
LR, MIN_LR, WEIGHT_DECAY, CLIP, BETAS, EPS = 3e-3, 3e-4, 0.1, 0.3, (0.9, 0.95), 1e-8
FLAGS = ["--num-layers", L, "--hidden-size", H, "--num-attention-heads", HEADS, "--seq-length", SEQ,
         "--max-position-embeddings", SEQ, "--micro-batch-size", MICRO, "--global-batch-size", GLOBAL,
         "--train-iters", ITERS, "--lr", LR, "--min-lr", MIN_LR, "--lr-warmup-iters", WARMUP_ITERS,
         "--lr-decay-style", "cosine", "--weight-decay", WEIGHT_DECAY, "--clip-grad", CLIP,
         "--adam-beta1", BETAS[0], "--adam-beta2", BETAS[1], "--adam-eps", EPS, "--mock-data", "--vocab-size", VOCAB,
         "--hidden-dropout", 0, "--attention-dropout", 0, "--eval-iters", 0, "--log-interval", 1000, "--seed", 1234]


class Block(nn.Module):
    """Pre-LayerNorm GPT-2 block. Megatron's fused QKV weight keeps each head's rows together:
    rows [3 d i, 3 d (i+1)) are head i's query, key and value (d rows each)."""

    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(H), nn.LayerNorm(H)
        self.qkv, self.proj = nn.Linear(H, 3 * H), nn.Linear(H, H)
        self.fc1, self.fc2 = nn.Linear(H, 4 * H), nn.Linear(4 * H, H)

    def forward(self, x):  # [b, s, h]
        b, s, _ = x.shape
        d = H // HEADS
        q, k, v = self.qkv(self.ln1(x)).view(b, s, HEADS, 3 * d).transpose(1, 2).split(d, dim=-1)  # [b, a, s, d]
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, H)
        x = x + self.proj(context)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class ReferenceGPT(nn.Module):
    """Word + learned position embeddings, blocks, final LayerNorm, output layer = word embedding."""

    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(PADDED_VOCAB, H), nn.Embedding(SEQ, H)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(H)

    def logits(self, tokens):  # [b, s] -> [b, s, V]
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.size(1)))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()

    def loss(self, tokens, labels):
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, PADDED_VOCAB), labels.reshape(-1))


def reference_name(ours):
    """Our pipeline module's parameter name -> the reference's (layer 0 and L+2: the tied embedding,
    1..L: blocks, L+1: final LayerNorm)."""
    if ours.startswith("tied_modules.embed."):
        return {"word_embeddings.weight": "wte.weight",
                "position_embeddings.weight": "wpe.weight"}[ours[len("tied_modules.embed."):]]
    layer, rest = ours.split(".", 1)
    if int(layer) == L + 1:
        return f"ln_f.{rest}"
    module, kind = rest.rsplit(".", 1)
    short = {"input_layernorm": "ln1", "self_attention.query_key_value": "qkv", "self_attention.dense": "proj",
             "post_attention_layernorm": "ln2", "mlp.dense_h_to_4h": "fc1", "mlp.dense_4h_to_h": "fc2"}[module]
    return f"blocks.{int(layer) - 1}.{short}.{kind}"


def _our_trainer():
    """Our trainer as pretrain() builds it; one batch through the built model, then real steps."""
    import pretrain_gpt
    from megatron.training import Trainer
    from megatron.training.initialize import initialize_megatron

    args = initialize_megatron(args_list=[str(f) for f in FLAGS])
    trainer = Trainer(args, pretrain_gpt.model_provider, pretrain_gpt.forward_step)
    trainer.build_data_iterators(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.get_batch)
    engine = trainer.engine
    module = engine.module
    initial = {name: p.detach().clone() for name, p in module.named_parameters()}

    micro_batches = []

    def recorded():
        for batch in trainer.train_iter:
            micro_batches.append(batch)
            yield batch
    batches = recorded()

    tokens, (labels, loss_mask) = first = next(batches)
    logits = module(tokens)  # [s, b, V]
    loss = module.loss_fn(logits, (labels, loss_mask))
    loss.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    module.zero_grad(set_to_none=True)

    def replay_then_continue():  # the training steps start with the batch used above
        yield first
        yield from batches
    engine.train()
    losses, norms = [], []
    data = replay_then_continue()
    for _ in range(ITERS):
        step_loss, _ = trainer.train_step(data)
        losses.append(float(step_loss))
        norms.append(float(engine.get_global_grad_norm()))
    return {"initial": initial, "logits": logits.detach().transpose(0, 1), "loss": loss.item(), "grads": grads,
            "micro_batches": micro_batches, "losses": losses, "norms": norms}


@pytest.fixture(scope="module")
def ours():
    [result] = run_distributed(1, _our_trainer)
    return result


def loaded_reference(weights):
    model = ReferenceGPT()
    named = dict(model.named_parameters())
    assert {reference_name(n) for n in weights} == set(named)  # every tensor mapped, none left over
    with torch.no_grad():
        for name, value in weights.items():
            named[reference_name(name)].copy_(value)
    return model


def test_same_logits_loss_and_gradients(ours):
    model = loaded_reference(ours["initial"])
    tokens, (labels, loss_mask) = ours["micro_batches"][0]
    assert loss_mask.eq(1).all()  # the reference's plain mean
    torch.testing.assert_close(model.logits(tokens), ours["logits"], rtol=1e-5, atol=1e-5)
    loss = model.loss(tokens, labels)
    assert loss.item() == pytest.approx(ours["loss"], rel=1e-6)
    loss.backward()
    named = dict(model.named_parameters())
    for name, grad in ours["grads"].items():
        torch.testing.assert_close(grad, named[reference_name(name)].grad, rtol=1e-4, atol=1e-6, msg=name)


def reference_lr(samples):
    """Linear warmup over 2 iterations of 4 samples, then cosine from LR to MIN_LR at 6 x 4 samples."""
    warmup, decay = WARMUP_ITERS * GLOBAL, ITERS * GLOBAL
    if samples <= warmup:
        return LR * samples / warmup
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1 + math.cos(math.pi * (samples - warmup) / (decay - warmup)))


def test_same_training_losses(ours):
    model = loaded_reference(ours["initial"])
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or ".ln" in n or n.startswith("ln_f")]
    decay = [p for p in model.parameters() if all(p is not q for q in no_decay)]
    assert len(decay) == 2 + 4 * L  # the embeddings and every Linear weight
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    batches = iter(ours["micro_batches"])
    losses, norms = [], []
    for it in range(ITERS):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(GLOBAL // MICRO):
            tokens, (labels, _) = next(batches)
            loss = model.loss(tokens, labels)
            (loss / (GLOBAL // MICRO)).backward()
            total += loss.item()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        for group in optimizer.param_groups:
            group["lr"] = reference_lr(it * GLOBAL)  # the samples consumed before this step
        optimizer.step()
        losses.append(total / (GLOBAL // MICRO))
    assert min(norms) > CLIP  # clipping was active in every step
    assert ours["norms"] == pytest.approx(norms, rel=1e-4)
    assert ours["losses"] == pytest.approx(losses, rel=1e-5)
    assert losses[-1] < losses[0] - 0.1  # and it trained
