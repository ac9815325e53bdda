"""Convert a checkpoint of any TP x PP layout to a Hugging Face `transformers` model directory:
config.json + model.safetensors + tokenizer files, loadable with
AutoModelForCausalLM.from_pretrained(HF_DIR) and AutoTokenizer.from_pretrained(HF_DIR).

    python tools/convert_checkpoint_to_hf.py --load DIR --output HF_DIR [--iteration N]

The TP slices and pipeline stages are merged by megatron/checkpoint/reshard.py (the same reader
that resumes a checkpoint at another layout) by the split rules of the parameter table
(megatron/model/analytic.py). Each architecture is one entry of ARCHITECTURES:
`matches(checkpoint)` says whether it applies, `build(checkpoint, weights)` returns the
`transformers` class name, its config kwargs and its state dict, walking the table's entries
through its names (GPT2_NAMES, ...: table entry -> transformers name, fused QKV / GLU entries cut
into their parts by the table's `fused_parts`). A checkpoint none of them matches, or with a table
entry an architecture does not map, fails naming what does not map.
Needs the `hf` extra: pip install -e ".[hf]".
"""
import argparse
import json
import os
from typing import TYPE_CHECKING, Any

from megatron.model.shape import gpt2_variant
from megatron.runtime.refusal import ConfigError

if TYPE_CHECKING:  # torch and the reader load after the bad-input checks
    import torch

    from megatron.checkpoint.reshard import Checkpoint
    from megatron.model.analytic import ParamSpec
    from megatron.model.shape import ModelShape
    Weights = dict[tuple[int, str], torch.Tensor]
    Export = tuple[str, dict[str, Any], dict[str, torch.Tensor]]

# Variant fields no transformers target represents (at any value but GPT-2's): refused before any
# target is tried. --apply-residual-connection-post-layernorm: every target adds the norms' inputs.
UNREPRESENTED = ("apply_residual_connection_post_layernorm",)
# Converted exactly wherever they occur, so no target's match looks at them: --apply-layernorm-1p
# (every norm's weight + 1 is transformers' gamma, _hf_state_dict); the MLP activation is matched
# by each target that has one (ACTIVATIONS_BY_NAME)
CONVERTED = ("apply_layernorm_1p", "activation")
# our activation -> transformers' name (ACT2FN), for the targets with a configurable activation;
# torch's tanh GeLU is Megatron's openai_gelu
ACTIVATIONS_BY_NAME = {"gelu": "gelu", "openai_gelu": "gelu_pytorch_tanh", "squared_relu": "relu2"}


def _variant_differences(checkpoint, expected, ignored=CONVERTED):
    """{field: saved value} where the checkpoint's architecture variant differs from `expected`
    (fields in `ignored` left out)."""
    saved = checkpoint.shape.variant()
    return {k: v for k, v in saved.items() if expected.get(k) != v and k not in ignored}


# --- our parameter-table entries -> transformers names ------------------------------------------
# An architecture's names are keyed by table entry: (where, module) of each entry of
# megatron/model/analytic.py's table -- where: "embedding", "layer" (any transformer layer, {i}
# in the HF name is its 0-based index), "final_norm" or "output"; module: the entry's key without
# its .weight / .bias. The value is the HF module (the entry's suffix is appended), or for an
# entry that fuses projections (the table's `fused`) a dict part -> HF module (one tensor per
# part, analytic.fused_parts), or Concat(module): the parts concatenated in order. A tied model's
# output head is HF's copy of the word embedding.

class Concat(str):
    """An HF module name that takes a fused entry's parts concatenated in order ([q | k | v])."""


def _place(spec: "ParamSpec", shape: "ModelShape") -> tuple[str, str, str]:
    """(where, module, suffix) of a table entry."""
    module, _, suffix = spec.key.rpartition(".")
    L = shape.num_layers
    where = ("embedding" if spec.layer == 0 else "layer" if spec.layer <= L
             else "final_norm" if spec.layer == L + 1 else "output")
    return where, module, suffix


def _hf_state_dict(checkpoint: "Checkpoint", weights: "Weights", names: dict[tuple[str, str], Any],
                   architecture: str, transpose_linear: bool = False) -> dict[str, "torch.Tensor"]:
    """{HF name: tensor} for every entry of the checkpoint's parameter table, by `names`; an entry
    `names` has no place for fails naming it. transpose_linear: HF holds the layers' matrices as
    [in, out] (GPT-2's Conv1D), ours are [out, in]."""
    import torch

    from megatron.model.analytic import fused_parts, parameter_table
    shape, sd, left = checkpoint.shape, {}, []
    for spec in parameter_table(shape):
        where, module, suffix = _place(spec, shape)
        target = names.get((where, module))
        if target is None or (isinstance(target, dict) and spec.fused is None):
            left.append((spec.layer, spec.key))
            continue
        index = {"i": spec.layer - 1} if where == "layer" else {}
        tensor = weights[(spec.layer, spec.key)]
        if shape.apply_layernorm_1p and spec.component in ("layernorm", "embedding_layernorm") \
                and suffix == "weight":
            tensor = tensor + 1  # --apply-layernorm-1p stores gamma - 1
        parts = fused_parts(spec, shape, tensor)
        if isinstance(target, dict):
            pieces = {target[part].format(**index): t for part, t in parts.items()}
        elif isinstance(target, Concat):
            pieces = {target.format(**index): torch.cat(list(parts.values()))}
        else:
            pieces = {target.format(**index): tensor}
        for hf, t in pieces.items():
            sd[f"{hf}.{suffix}"] = t.t() if transpose_linear and where == "layer" and t.dim() == 2 else t
    if left:
        raise ConfigError(f"{architecture} has no place for parameters {', '.join(f'layer {l} {k}' for l, k in left)}")
    if shape.tied:  # the output layer is the word embedding
        sd[names["output", ""] + ".weight"] = sd[names["embedding", "word_embeddings"] + ".weight"]
    return {k: v.contiguous() for k, v in sd.items()}


def _gpt2_variant(checkpoint):
    return gpt2_variant(checkpoint.shape.num_attention_heads, checkpoint.shape.hidden_size)


def _gpt2_matches(checkpoint):
    """The plain GPT-2 block: learned positions, LayerNorm, GeLU MLP, fused QKV with biases, tied."""
    return not _variant_differences(checkpoint, _gpt2_variant(checkpoint))


# HF's c_attn output columns are [q | k | v]: our per-head fused QKV's parts, concatenated
GPT2_NAMES = {("embedding", "word_embeddings"): "transformer.wte",
              ("embedding", "position_embeddings"): "transformer.wpe",
              ("layer", "input_layernorm"): "transformer.h.{i}.ln_1",
              ("layer", "self_attention.query_key_value"): Concat("transformer.h.{i}.attn.c_attn"),
              ("layer", "self_attention.dense"): "transformer.h.{i}.attn.c_proj",
              ("layer", "post_attention_layernorm"): "transformer.h.{i}.ln_2",
              ("layer", "mlp.dense_h_to_4h"): "transformer.h.{i}.mlp.c_fc",
              ("layer", "mlp.dense_4h_to_h"): "transformer.h.{i}.mlp.c_proj",
              ("final_norm", ""): "transformer.ln_f", ("output", ""): "lm_head"}


def _gpt2_build(checkpoint: "Checkpoint", weights: "Weights") -> "Export":
    """GPT2LMHeadModel. HF's c_attn is a Conv1D (weight [in, out]) whose output columns are
    [q | k | v]; our Linear weights are [out, in]: every projection is transposed. GeLU is the
    exact erf form ("gelu"; --openai-gelu: "gelu_pytorch_tanh", --squared-relu: "relu2"), LayerNorms
    come before attention and MLP (pre-LN), as in GPT-2."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L, h, heads = shape.num_layers, shape.hidden_size, shape.num_attention_heads
    sd = _hf_state_dict(checkpoint, weights, GPT2_NAMES, "GPT2LMHeadModel", transpose_linear=True)
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, n_positions=shape.max_position_embeddings, n_embd=h,
                  n_layer=L, n_head=heads, n_inner=shape.ffn_hidden_size,
                  activation_function=ACTIVATIONS_BY_NAME[shape.activation],
                  layer_norm_epsilon=info.get("layernorm_epsilon", 1e-5),
                  resid_pdrop=info.get("hidden_dropout", 0.1), embd_pdrop=info.get("hidden_dropout", 0.1),
                  attn_pdrop=info.get("attention_dropout", 0.1), initializer_range=info.get("init_method_std", 0.02),
                  bos_token_id=eod, eos_token_id=eod, tie_word_embeddings=True)
    return "GPT2LMHeadModel", config, sd


def _llama_block(shape):
    """LLaMA's block: rotary positions over the whole head (as transformers rotates), RMSNorm,
    SwiGLU MLP, no embedding LayerNorm; any number of kv heads and any head dim; tied or untied."""
    return (shape.position_embedding_type == "rotary" and shape.normalization == "rmsnorm"
            and shape.glu_activation == "swiglu" and not shape.embed_layernorm and shape.rotary_percent == 1)


def _llama_matches(checkpoint):
    """LLaMA's block with or without linear biases (HF's attention_bias covers q, k, v and o
    alike: a bias on QKV only is Qwen2's)."""
    return _llama_block(checkpoint.shape) and not checkpoint.shape.add_qkv_bias


# our fused QKV's kv groups: HF repeats kv head j for query heads j a/g .. (j+1) a/g - 1, the same
# grouping; our GLU's gate / value rows: HF's gate_proj / up_proj
LLAMA_NAMES = {("embedding", "word_embeddings"): "model.embed_tokens",
               ("layer", "input_layernorm"): "model.layers.{i}.input_layernorm",
               ("layer", "self_attention.query_key_value"): {"query": "model.layers.{i}.self_attn.q_proj",
                                                            "key": "model.layers.{i}.self_attn.k_proj",
                                                            "value": "model.layers.{i}.self_attn.v_proj"},
               ("layer", "self_attention.dense"): "model.layers.{i}.self_attn.o_proj",
               ("layer", "post_attention_layernorm"): "model.layers.{i}.post_attention_layernorm",
               ("layer", "mlp.dense_h_to_4h"): {"gate": "model.layers.{i}.mlp.gate_proj",
                                                "value": "model.layers.{i}.mlp.up_proj"},
               ("layer", "mlp.dense_4h_to_h"): "model.layers.{i}.mlp.down_proj",
               ("final_norm", ""): "model.norm", ("output", ""): "lm_head"}


def _llama_build(checkpoint: "Checkpoint", weights: "Weights") -> "Export":
    """LlamaForCausalLM. Rotary is the "rotate half" form over the full head dim, as HF's."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L, a, g, d = shape.num_layers, shape.num_attention_heads, shape.num_key_value_heads, shape.kv_channels
    bias = shape.add_bias_linear
    sd = _hf_state_dict(checkpoint, weights, LLAMA_NAMES, "LlamaForCausalLM")
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, hidden_size=shape.hidden_size,
                  intermediate_size=shape.ffn_hidden_size, num_hidden_layers=L, num_attention_heads=a,
                  num_key_value_heads=g, head_dim=d, hidden_act="silu",
                  max_position_embeddings=shape.max_position_embeddings,
                  rms_norm_eps=info.get("layernorm_epsilon", 1e-5),
                  rope_parameters={"rope_type": "default", "rope_theta": info.get("rope_theta", 10000.0)},
                  attention_bias=bias, mlp_bias=bias, tie_word_embeddings=shape.tied,
                  attention_dropout=info.get("attention_dropout", 0.0),
                  initializer_range=info.get("init_method_std", 0.02), bos_token_id=eod, eos_token_id=eod)
    return "LlamaForCausalLM", config, sd


def _qwen2_matches(checkpoint):
    """Qwen2's block: LLaMA's with a bias on q, k and v only (Megatron-LM's --disable-bias-linear
    --add-qkv-bias)."""
    return _llama_block(checkpoint.shape) and checkpoint.shape.add_qkv_bias


def _qwen2_build(checkpoint: "Checkpoint", weights: "Weights") -> "Export":
    """Qwen2ForCausalLM: LLaMA's names (Qwen2 keeps them), full attention in every layer (no
    sliding window)."""
    shape, info = checkpoint.shape, checkpoint.model_info
    sd = _hf_state_dict(checkpoint, weights, LLAMA_NAMES, "Qwen2ForCausalLM")
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, hidden_size=shape.hidden_size,
                  intermediate_size=shape.ffn_hidden_size, num_hidden_layers=shape.num_layers,
                  num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
                  head_dim=shape.kv_channels, hidden_act="silu", max_position_embeddings=shape.max_position_embeddings,
                  rms_norm_eps=info.get("layernorm_epsilon", 1e-5),
                  rope_parameters={"rope_type": "default", "rope_theta": info.get("rope_theta", 10000.0)},
                  use_sliding_window=False, tie_word_embeddings=shape.tied,
                  attention_dropout=info.get("attention_dropout", 0.0),
                  initializer_range=info.get("init_method_std", 0.02), bos_token_id=eod, eos_token_id=eod)
    return "Qwen2ForCausalLM", config, sd


def _neox_matches(checkpoint):
    """GPT-NeoX's block with sequential residuals: rotary on any share of the head (its
    partial_rotary_factor is Microsoft's --rotary-percent), LayerNorm, a non-gated MLP (any of our
    activations: its hidden_act), biases,
    multi-head attention of head dim h / a, no embedding LayerNorm; tied or untied."""
    shape = checkpoint.shape
    return (shape.position_embedding_type == "rotary" and shape.normalization == "layernorm"
            and shape.glu_activation is None and not shape.embed_layernorm and shape.add_bias_linear
            and shape.num_key_value_heads == shape.num_attention_heads
            and shape.kv_channels * shape.num_attention_heads == shape.hidden_size)


# its fused query_key_value rows are [head, (q, k, v), d]: ours with one query head per kv group,
# copied as is; its submodules carry Megatron's names
NEOX_NAMES = {("embedding", "word_embeddings"): "gpt_neox.embed_in",
              **{("layer", ours): f"gpt_neox.layers.{{i}}.{ours.replace('self_attention.', 'attention.')}"
                 for ours in ("input_layernorm", "post_attention_layernorm", "self_attention.query_key_value",
                              "self_attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")},
              ("final_norm", ""): "gpt_neox.final_layer_norm", ("output", ""): "lm_head"}


def _neox_build(checkpoint: "Checkpoint", weights: "Weights") -> "Export":
    """GPTNeoXForCausalLM (sequential residuals)."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L = shape.num_layers
    sd = _hf_state_dict(checkpoint, weights, NEOX_NAMES, "GPTNeoXForCausalLM")
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=L,
                  num_attention_heads=shape.num_attention_heads, intermediate_size=shape.ffn_hidden_size,
                  hidden_act=ACTIVATIONS_BY_NAME[shape.activation],
                  max_position_embeddings=shape.max_position_embeddings,
                  rope_parameters={"rope_type": "default", "rope_theta": info.get("rope_theta", 10000.0),
                                   "partial_rotary_factor": shape.rotary_percent},
                  layer_norm_eps=info.get("layernorm_epsilon", 1e-5), use_parallel_residual=False,
                  attention_bias=True, tie_word_embeddings=shape.tied,
                  hidden_dropout=info.get("hidden_dropout", 0.0), attention_dropout=info.get("attention_dropout", 0.0),
                  initializer_range=info.get("init_method_std", 0.02), bos_token_id=eod, eos_token_id=eod)
    return "GPTNeoXForCausalLM", config, sd


def _bloom_matches(checkpoint):
    """BLOOM's block: ALiBi, an embedding LayerNorm, LayerNorm, GeLU MLP, fused QKV with biases,
    multi-head with head dim h / a, tied (transformers' BloomForCausalLM has no other variant)."""
    shape = checkpoint.shape
    return (shape.position_embedding_type == "alibi" and shape.embed_layernorm and shape.normalization == "layernorm"
            and shape.glu_activation is None and shape.activation in ("gelu", "openai_gelu")
            and shape.add_bias_linear and shape.tied
            and shape.num_key_value_heads == shape.num_attention_heads
            and shape.kv_channels * shape.num_attention_heads == shape.hidden_size)


# its fused query_key_value is viewed as [heads, 3, head dim] per output row: our multi-head
# layout, copied as is; every layer name maps one to one (HF's Linear weights are [out, in])
BLOOM_NAMES = {("embedding", "word_embeddings"): "transformer.word_embeddings",
               ("embedding", "embedding_layernorm"): "transformer.word_embeddings_layernorm",
               **{("layer", ours): f"transformer.h.{{i}}.{ours}"
                  for ours in ("input_layernorm", "self_attention.query_key_value", "self_attention.dense",
                               "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")},
               ("final_norm", ""): "transformer.ln_f", ("output", ""): "lm_head"}


def _bloom_build(checkpoint: "Checkpoint", weights: "Weights") -> "Export":
    """BloomForCausalLM. Its ALiBi adds slope x key position, ours slope x (key - query
    position): the same softmax. Its GeLU is the tanh approximation (Megatron's fused bias-GeLU):
    exactly --openai-gelu's; against our default exact erf form logits differ by the gap between
    the two, a few 1e-5 for a small model."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L, h = shape.num_layers, shape.hidden_size
    sd = _hf_state_dict(checkpoint, weights, BLOOM_NAMES, "BloomForCausalLM")
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, hidden_size=h, n_layer=L, n_head=shape.num_attention_heads,
                  layer_norm_epsilon=info.get("layernorm_epsilon", 1e-5),
                  apply_residual_connection_post_layernorm=False,
                  hidden_dropout=info.get("hidden_dropout", 0.0), attention_dropout=info.get("attention_dropout", 0.0),
                  initializer_range=info.get("init_method_std", 0.02), bos_token_id=eod, eos_token_id=eod,
                  tie_word_embeddings=True)
    return "BloomForCausalLM", config, sd


# (name, matches, build): the first that matches converts
ARCHITECTURES = [("GPT2LMHeadModel", _gpt2_matches, _gpt2_build), ("LlamaForCausalLM", _llama_matches, _llama_build),
                 ("GPTNeoXForCausalLM", _neox_matches, _neox_build), ("BloomForCausalLM", _bloom_matches, _bloom_build),
                 ("Qwen2ForCausalLM", _qwen2_matches, _qwen2_build)]


def to_hf(checkpoint: "Checkpoint", weights: "Weights") -> "Export":
    representable = not any(checkpoint.shape.variant()[k] != _gpt2_variant(checkpoint)[k] for k in UNREPRESENTED)
    for _, matches, build in ARCHITECTURES if representable else []:
        if matches(checkpoint):
            return build(checkpoint, weights)
    unmapped = _variant_differences(checkpoint, _gpt2_variant(checkpoint), ignored=("apply_layernorm_1p",))
    raise ConfigError(f"{checkpoint.step_dir}: no transformers architecture maps the variant "
                      f"{checkpoint.shape.describe()} ({', '.join(f'{k}={v}' for k, v in unmapped.items())}; "
                      f"known: {', '.join(name for name, _, _ in ARCHITECTURES)})")


# --- tokenizer --------------------------------------------------------------------------------

def _external_tokenizer(checkpoint: Any, args: argparse.Namespace) -> tuple[str, str] | None:
    """(type, path) of the Hugging Face / SentencePiece tokenizer the run used, or None."""
    info = checkpoint.model_info
    kind = info.get("tokenizer_type")
    if args.vocab_file or kind not in ("PretrainedFromHF", "HFTokenizer", "GPTSentencePieceTokenizer"):
        return None
    path = info.get("tokenizer_name_or_path") if kind == "PretrainedFromHF" else info.get("tokenizer_model")
    if not path or not os.path.exists(path):
        raise ConfigError(f"{checkpoint.step_dir}: the run's {kind} tokenizer {path} (recorded in the checkpoint) "
                          f"does not exist; restore it at that path")
    return kind, path


def write_external_tokenizer(kind: str, path: str, output: str) -> int | None:
    """The run's tokenizer next to the model; returns its end-of-document id. A Hugging Face
    tokenizer is saved as transformers loads it; a SentencePiece model is copied as tokenizer.model."""
    if kind == "GPTSentencePieceTokenizer":
        import shutil

        import sentencepiece
        shutil.copyfile(path, os.path.join(output, "tokenizer.model"))
        return sentencepiece.SentencePieceProcessor(model_file=path).eos_id()
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.save_pretrained(output)
    return tokenizer.eos_token_id


def _tokenizer_files(checkpoint: Any, args: argparse.Namespace) -> tuple[str, str] | None:
    """(vocab, merges) paths, or None with the reason printed."""
    info = checkpoint.model_info
    if info.get("tokenizer_type") == "NullTokenizer" and not args.vocab_file:
        print("no tokenizer written: the model was trained with NullTokenizer (the data was token ids)")
        return None
    if not (args.vocab_file or info.get("vocab_file")):
        print("no tokenizer written: the checkpoint records no tokenizer files; pass --vocab-file and --merge-file")
        return None
    files = []
    for flag, given, saved in (("--vocab-file", args.vocab_file, info.get("vocab_file")),
                               ("--merge-file", args.merge_file, info.get("merge_file"))):
        path = given or saved
        if not path or not os.path.isfile(path):
            where = f"{path} (recorded in the checkpoint) does not exist" if path else "the checkpoint records none"
            raise ConfigError(f"{flag}: {where}; pass the GPT-2 BPE file the model was trained with")
        files.append(path)
    vocab, merges = files
    return vocab, merges


def write_tokenizer(vocab_file: str, merge_file: str, output: str, model_max_length: int) -> int | None:
    """GPT-2 byte-level BPE from vocab.json + merges.txt, as transformers 5 builds it; the plain
    files go along for older readers."""
    import shutil

    from transformers import GPT2Tokenizer
    with open(vocab_file, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merge_file, encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n") if line and not line.startswith("#version")]
    # transformers 5 takes the merges as pairs (its annotation still says strings)
    tokenizer = GPT2Tokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)  # type: ignore[arg-type]
    tokenizer.save_pretrained(output)
    shutil.copyfile(vocab_file, os.path.join(output, "vocab.json"))
    shutil.copyfile(merge_file, os.path.join(output, "merges.txt"))
    return vocab.get("<|endoftext|>")


# --- main -------------------------------------------------------------------------------------

def convert(args: argparse.Namespace) -> int:
    from megatron.checkpoint.reshard import Checkpoint
    from megatron.model.analytic import analytic_parameter_counts

    # bad input fails first, in a second, before transformers is imported
    checkpoint = Checkpoint(args.load, args.iteration)
    experts = checkpoint.layout.num_experts
    if experts and max(experts) > 1:
        per_layer = "/".join(map(str, experts))
        raise ConfigError(f"{checkpoint.step_dir}: a mixture-of-experts model ({per_layer} experts per MoE layer) "
                          f"has no transformers architecture here "
                          f"({', '.join(name for name, _, _ in ARCHITECTURES)} are dense)")
    checkpoint.check_readable()
    from megatron.checkpoint.manifest import verify_step
    problem = verify_step(checkpoint.step_dir)[1]  # a shard altered in place would export garbage
    if problem:
        raise ConfigError(problem)
    external = _external_tokenizer(checkpoint, args)
    tokenizer_files = None if external else _tokenizer_files(checkpoint, args)
    import torch
    import transformers
    weights = {k: v.float() for k, v in checkpoint.read_weights().items()}
    if tokenizer_files:
        with open(tokenizer_files[0], encoding="utf-8") as f:
            checkpoint.model_info["eod_id"] = json.load(f).get("<|endoftext|>")
    name, config_kwargs, state_dict = to_hf(checkpoint, weights)
    config = getattr(transformers, name.replace("ForCausalLM", "Config").replace("LMHeadModel", "Config"))(
        **config_kwargs)
    with torch.device("meta"):
        model = getattr(transformers, name)(config)
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.tie_weights()
    count = model.num_parameters()
    expected = analytic_parameter_counts(checkpoint.shape).total
    if count != expected:
        raise ConfigError(f"{name} holds {count:,} parameters, the trainer's count for this shape is {expected:,}")
    os.makedirs(args.output, exist_ok=True)
    if external:
        eod = write_external_tokenizer(*external, args.output)
        model.config.bos_token_id = model.config.eos_token_id = eod
    model.save_pretrained(args.output)
    if tokenizer_files:
        write_tokenizer(*tokenizer_files, args.output, checkpoint.shape.max_position_embeddings)
    print(f"converted {checkpoint.step_dir} ({checkpoint.describe()}, iteration {checkpoint.iteration}) "
          f"to {name} in {args.output}")
    print(f"parameters: {count:,} (estimated model parameters: {count / 1e9})")
    return count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", required=True, help="checkpoint directory (as passed to pretrain_gpt.py --save)")
    parser.add_argument("--output", required=True, help="transformers model directory to write")
    parser.add_argument("--iteration", type=int, default=None, help="iteration to convert (default: the latest)")
    parser.add_argument("--vocab-file", default=None, help="GPT-2 vocab.json (default: the one the run used)")
    parser.add_argument("--merge-file", default=None, help="GPT-2 merges.txt (default: the one the run used)")
    args = parser.parse_args(argv)
    import importlib.util
    for package in ("transformers", "safetensors"):
        if importlib.util.find_spec(package) is None:
            parser.exit(2, f"convert_checkpoint_to_hf.py: error: {package} is not installed: "
                           f"pip install -e \".[hf]\"\n")
    if os.path.abspath(args.output) == os.path.abspath(args.load):
        parser.exit(2, "convert_checkpoint_to_hf.py: error: --output must differ from --load (the checkpoint is "
                       "never written to)\n")
    try:
        convert(args)
    except ConfigError as e:
        parser.exit(2, f"convert_checkpoint_to_hf.py: error: {e}\n")


if __name__ == "__main__":
    main()
