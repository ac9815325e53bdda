"""Convert a checkpoint of any TP x PP layout to a Hugging Face `transformers` model directory:
config.json + model.safetensors + tokenizer files, loadable with
AutoModelForCausalLM.from_pretrained(HF_DIR) and AutoTokenizer.from_pretrained(HF_DIR).

    python tools/convert_checkpoint_to_hf.py --load DIR --output HF_DIR [--iteration N]

The TP slices and pipeline stages are merged by megatron/checkpoint_reshard.py (the same reader
that resumes a checkpoint at another layout). Each architecture is one entry of ARCHITECTURES:
`matches(checkpoint)` says whether it applies, `build(checkpoint, weights)` returns the
`transformers` class name, its config kwargs and its state dict. A checkpoint none of them
matches, or with a parameter an architecture does not map, fails naming what does not map.
Needs the `hf` extra: pip install -e ".[hf]".
"""
import argparse
import json
import os

from megatron.model.shape import ConfigError, gpt2_variant

def _variant_differences(checkpoint, expected):
    """{field: saved value} where the checkpoint's architecture variant differs from `expected`."""
    saved = checkpoint.shape.variant()
    return {k: v for k, v in saved.items() if expected.get(k) != v}


def _gpt2_variant(checkpoint):
    return gpt2_variant(checkpoint.shape.num_attention_heads, checkpoint.shape.hidden_size)


def _gpt2_matches(checkpoint):
    """The plain GPT-2 block: learned positions, LayerNorm, GeLU MLP, fused QKV with biases, tied."""
    return not _variant_differences(checkpoint, _gpt2_variant(checkpoint))


def _gpt2_build(checkpoint, weights):
    """GPT2LMHeadModel. Our fused QKV rows are grouped per head [q_i, k_i, v_i] (transformer.py);
    HF's c_attn is a Conv1D (weight [in, out]) whose output columns are [q | k | v]. Our Linear
    weights are [out, in]: every projection is transposed. GeLU is the exact erf form ("gelu"),
    LayerNorms come before attention and MLP (pre-LN), as in GPT-2."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L, h, heads = shape.num_layers, shape.hidden_size, shape.num_attention_heads
    d = shape.head_dim
    taken = set()

    def w(layer, key):
        taken.add((layer, key))
        return weights[(layer, key)]

    def qkv_columns(t):  # [3h(, h)] per-head interleaved -> [q | k | v]
        return t.view(heads, 3, d, *t.shape[1:]).transpose(0, 1).reshape(3 * h, *t.shape[1:])

    sd = {"transformer.wte.weight": w(0, "word_embeddings.weight"),
          "transformer.wpe.weight": w(0, "position_embeddings.weight")}
    for i in range(L):
        layer, pre = i + 1, f"transformer.h.{i}."
        for ours, theirs in (("input_layernorm", "ln_1"), ("post_attention_layernorm", "ln_2")):
            sd[pre + theirs + ".weight"] = w(layer, ours + ".weight")
            sd[pre + theirs + ".bias"] = w(layer, ours + ".bias")
        sd[pre + "attn.c_attn.weight"] = qkv_columns(w(layer, "self_attention.query_key_value.weight")).t()
        sd[pre + "attn.c_attn.bias"] = qkv_columns(w(layer, "self_attention.query_key_value.bias"))
        for ours, theirs in (("self_attention.dense", "attn.c_proj"), ("mlp.dense_h_to_4h", "mlp.c_fc"),
                             ("mlp.dense_4h_to_h", "mlp.c_proj")):
            sd[pre + theirs + ".weight"] = w(layer, ours + ".weight").t()
            sd[pre + theirs + ".bias"] = w(layer, ours + ".bias")
    sd["transformer.ln_f.weight"] = w(L + 1, "weight")
    sd["transformer.ln_f.bias"] = w(L + 1, "bias")
    sd["lm_head.weight"] = sd["transformer.wte.weight"]  # tied: the output layer is the word embedding
    _check_all_mapped(weights, taken, "GPT2LMHeadModel")
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, n_positions=shape.max_position_embeddings, n_embd=h,
                  n_layer=L, n_head=heads, n_inner=shape.ffn_hidden_size, activation_function="gelu",
                  layer_norm_epsilon=info.get("layernorm_epsilon", 1e-5),
                  resid_pdrop=info.get("hidden_dropout", 0.1), embd_pdrop=info.get("hidden_dropout", 0.1),
                  attn_pdrop=info.get("attention_dropout", 0.1), initializer_range=info.get("init_method_std", 0.02),
                  bos_token_id=eod, eos_token_id=eod, tie_word_embeddings=True)
    return "GPT2LMHeadModel", config, {k: v.contiguous() for k, v in sd.items()}


def _check_all_mapped(weights, taken, architecture):
    left = sorted(set(weights) - taken)
    if left:
        raise ConfigError(f"{architecture} has no place for parameters {', '.join(f'layer {l} {k}' for l, k in left)}")


def _llama_matches(checkpoint):
    """LLaMA's block: rotary positions, RMSNorm, SwiGLU MLP, no embedding LayerNorm; any number
    of kv heads and any head dim; tied or untied; with or without linear biases."""
    shape = checkpoint.shape
    return (shape.position_embedding_type == "rotary" and shape.normalization == "rmsnorm"
            and shape.glu_activation == "swiglu" and not shape.embed_layernorm
            and shape.rotary_percent == 1)  # transformers' LLaMA rotates the whole head


def _llama_build(checkpoint, weights):
    """LlamaForCausalLM. Our fused QKV has one row block per kv group: its a/g query heads, then
    its key head, then its value head (HF repeats kv head j for query heads j*a/g .. (j+1)*a/g-1,
    the same grouping). Our GLU rows alternate gate / value (row 2j, 2j+1): HF's gate_proj and
    up_proj. Rotary is the "rotate half" form over the full head dim, as HF's."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L, a, g, d = shape.num_layers, shape.num_attention_heads, shape.num_key_value_heads, shape.kv_channels
    bias = shape.add_bias_linear
    taken = set()

    def w(layer, key):
        taken.add((layer, key))
        return weights[(layer, key)]

    def split_qkv(t):  # [(a + 2g) d (, h)] -> q [a d], k [g d], v [g d]
        groups = t.view(g, a // g + 2, d, *t.shape[1:])
        rest = t.shape[1:]
        return (groups[:, :a // g].reshape(a * d, *rest), groups[:, a // g].reshape(g * d, *rest),
                groups[:, a // g + 1].reshape(g * d, *rest))

    sd = {"model.embed_tokens.weight": w(0, "word_embeddings.weight")}
    for i in range(L):
        layer, pre = i + 1, f"model.layers.{i}."
        sd[pre + "input_layernorm.weight"] = w(layer, "input_layernorm.weight")
        sd[pre + "post_attention_layernorm.weight"] = w(layer, "post_attention_layernorm.weight")
        for suffix in ("weight", "bias") if bias else ("weight",):
            q, k, v = split_qkv(w(layer, f"self_attention.query_key_value.{suffix}"))
            sd.update({pre + f"self_attn.q_proj.{suffix}": q, pre + f"self_attn.k_proj.{suffix}": k,
                       pre + f"self_attn.v_proj.{suffix}": v,
                       pre + f"self_attn.o_proj.{suffix}": w(layer, f"self_attention.dense.{suffix}")})
            h_to_4h = w(layer, f"mlp.dense_h_to_4h.{suffix}")
            sd.update({pre + f"mlp.gate_proj.{suffix}": h_to_4h[0::2], pre + f"mlp.up_proj.{suffix}": h_to_4h[1::2],
                       pre + f"mlp.down_proj.{suffix}": w(layer, f"mlp.dense_4h_to_h.{suffix}")})
    sd["model.norm.weight"] = w(L + 1, "weight")
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"] if shape.tied else w(L + 2, "weight")
    _check_all_mapped(weights, taken, "LlamaForCausalLM")
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
    return "LlamaForCausalLM", config, {k: v.contiguous() for k, v in sd.items()}


def _neox_matches(checkpoint):
    """GPT-NeoX's block with sequential residuals: rotary on any share of the head (its
    partial_rotary_factor is Microsoft's --rotary-percent), LayerNorm, GeLU MLP, biases,
    multi-head attention of head dim h / a, no embedding LayerNorm; tied or untied."""
    shape = checkpoint.shape
    return (shape.position_embedding_type == "rotary" and shape.normalization == "layernorm"
            and shape.glu_activation is None and not shape.embed_layernorm and shape.add_bias_linear
            and shape.num_key_value_heads == shape.num_attention_heads
            and shape.kv_channels * shape.num_attention_heads == shape.hidden_size)


def _neox_build(checkpoint, weights):
    """GPTNeoXForCausalLM. Its fused query_key_value rows are [head, (q, k, v), d], the per-head
    grouping ours has with one query head per group, and its submodules carry Megatron's names."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L = shape.num_layers
    taken = set()

    def w(layer, key):
        taken.add((layer, key))
        return weights[(layer, key)]

    sd = {"gpt_neox.embed_in.weight": w(0, "word_embeddings.weight")}
    for i in range(L):
        for module in ("input_layernorm", "post_attention_layernorm", "attention.query_key_value",
                       "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"):
            ours = module.replace("attention.", "self_attention.")
            for suffix in ("weight", "bias"):
                sd[f"gpt_neox.layers.{i}.{module}.{suffix}"] = w(i + 1, f"{ours}.{suffix}")
    sd["gpt_neox.final_layer_norm.weight"] = w(L + 1, "weight")
    sd["gpt_neox.final_layer_norm.bias"] = w(L + 1, "bias")
    sd["lm_head.weight"] = sd["gpt_neox.embed_in.weight"] if shape.tied else w(L + 2, "weight")
    _check_all_mapped(weights, taken, "GPTNeoXForCausalLM")
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=L,
                  num_attention_heads=shape.num_attention_heads, intermediate_size=shape.ffn_hidden_size,
                  hidden_act="gelu", max_position_embeddings=shape.max_position_embeddings,
                  rope_parameters={"rope_type": "default", "rope_theta": info.get("rope_theta", 10000.0),
                                   "partial_rotary_factor": shape.rotary_percent},
                  layer_norm_eps=info.get("layernorm_epsilon", 1e-5), use_parallel_residual=False,
                  attention_bias=True, tie_word_embeddings=shape.tied,
                  hidden_dropout=info.get("hidden_dropout", 0.0), attention_dropout=info.get("attention_dropout", 0.0),
                  initializer_range=info.get("init_method_std", 0.02), bos_token_id=eod, eos_token_id=eod)
    return "GPTNeoXForCausalLM", config, {k: v.contiguous() for k, v in sd.items()}


def _bloom_matches(checkpoint):
    """BLOOM's block: ALiBi, an embedding LayerNorm, LayerNorm, GeLU MLP, fused QKV with biases,
    multi-head with head dim h / a, tied (transformers' BloomForCausalLM has no other variant)."""
    shape = checkpoint.shape
    return (shape.position_embedding_type == "alibi" and shape.embed_layernorm and shape.normalization == "layernorm"
            and shape.glu_activation is None and shape.add_bias_linear and shape.tied
            and shape.num_key_value_heads == shape.num_attention_heads
            and shape.kv_channels * shape.num_attention_heads == shape.hidden_size)


def _bloom_build(checkpoint, weights):
    """BloomForCausalLM. Its fused query_key_value is viewed as [heads, 3, head dim] per output
    row, our multi-head layout (one row block per head: q, k, v), so the QKV is copied as is; every
    other name maps one to one (HF's Linear weights are [out, in] like ours). Its ALiBi adds
    slope x key position, ours slope x (key - query position): the same softmax. Its GeLU is the
    tanh approximation (Megatron's fused bias-GeLU), ours the exact erf form: logits differ by the
    gap between the two, a few 1e-5 for a small model."""
    shape, info = checkpoint.shape, checkpoint.model_info
    L, h = shape.num_layers, shape.hidden_size
    taken = set()

    def w(layer, key):
        taken.add((layer, key))
        return weights[(layer, key)]

    sd = {"transformer.word_embeddings.weight": w(0, "word_embeddings.weight"),
          "transformer.word_embeddings_layernorm.weight": w(0, "embedding_layernorm.weight"),
          "transformer.word_embeddings_layernorm.bias": w(0, "embedding_layernorm.bias")}
    for i in range(L):
        layer, pre = i + 1, f"transformer.h.{i}."
        for name in ("input_layernorm", "self_attention.query_key_value", "self_attention.dense",
                     "post_attention_layernorm", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"):
            for suffix in ("weight", "bias"):
                sd[f"{pre}{name}.{suffix}"] = w(layer, f"{name}.{suffix}")
    sd["transformer.ln_f.weight"] = w(L + 1, "weight")
    sd["transformer.ln_f.bias"] = w(L + 1, "bias")
    sd["lm_head.weight"] = sd["transformer.word_embeddings.weight"]  # tied
    _check_all_mapped(weights, taken, "BloomForCausalLM")
    eod = info.get("eod_id")
    config = dict(vocab_size=shape.padded_vocab_size, hidden_size=h, n_layer=L, n_head=shape.num_attention_heads,
                  layer_norm_epsilon=info.get("layernorm_epsilon", 1e-5),
                  apply_residual_connection_post_layernorm=False,
                  hidden_dropout=info.get("hidden_dropout", 0.0), attention_dropout=info.get("attention_dropout", 0.0),
                  initializer_range=info.get("init_method_std", 0.02), bos_token_id=eod, eos_token_id=eod,
                  tie_word_embeddings=True)
    return "BloomForCausalLM", config, {k: v.contiguous() for k, v in sd.items()}


# (name, matches, build): the first that matches converts
ARCHITECTURES = [("GPT2LMHeadModel", _gpt2_matches, _gpt2_build), ("LlamaForCausalLM", _llama_matches, _llama_build),
                 ("GPTNeoXForCausalLM", _neox_matches, _neox_build), ("BloomForCausalLM", _bloom_matches, _bloom_build)]


def to_hf(checkpoint, weights):
    for _, matches, build in ARCHITECTURES:
        if matches(checkpoint):
            return build(checkpoint, weights)
    unmapped = _variant_differences(checkpoint, _gpt2_variant(checkpoint))
    raise ConfigError(f"{checkpoint.step_dir}: no transformers architecture maps the variant "
                      f"{checkpoint.shape.describe()} ({', '.join(f'{k}={v}' for k, v in unmapped.items())}; "
                      f"known: {', '.join(name for name, _, _ in ARCHITECTURES)})")


# --- tokenizer --------------------------------------------------------------------------------

def _external_tokenizer(checkpoint, args):
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


def write_external_tokenizer(kind, path, output):
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


def _tokenizer_files(checkpoint, args):
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
    return files


def write_tokenizer(vocab_file, merge_file, output, model_max_length):
    """GPT-2 byte-level BPE from vocab.json + merges.txt, as transformers 5 builds it; the plain
    files go along for older readers."""
    import shutil

    from transformers import GPT2Tokenizer
    with open(vocab_file, encoding="utf-8") as f:
        vocab = json.load(f)
    with open(merge_file, encoding="utf-8") as f:
        merges = [tuple(line.split()) for line in f.read().split("\n") if line and not line.startswith("#version")]
    tokenizer = GPT2Tokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)
    tokenizer.save_pretrained(output)
    shutil.copyfile(vocab_file, os.path.join(output, "vocab.json"))
    shutil.copyfile(merge_file, os.path.join(output, "merges.txt"))
    return vocab.get("<|endoftext|>")


# --- main -------------------------------------------------------------------------------------

def convert(args):
    from megatron.checkpoint_reshard import Checkpoint
    from megatron.model.analytic import analytic_parameter_counts

    # bad input fails first, in a second, before transformers is imported
    checkpoint = Checkpoint(args.load, args.iteration)
    experts = checkpoint.layout.get("num_experts")
    if experts and max(experts) > 1:
        per_layer = "/".join(map(str, experts))
        raise ConfigError(f"{checkpoint.step_dir}: a mixture-of-experts model ({per_layer} experts per MoE layer) "
                          f"has no transformers architecture here "
                          f"({', '.join(name for name, _, _ in ARCHITECTURES)} are dense)")
    checkpoint.check_readable()
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


def main(argv=None):
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
