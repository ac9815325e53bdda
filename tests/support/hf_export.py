"""Helpers of the transformers-export tests: run the converter, and our own logits for the same
checkpoint (the TP=1 GPTModel loaded with the merged weights) to compare with."""
import os
import subprocess
import sys

import torch

from tests.support.launch import ROOT

CONVERTER = os.path.join(ROOT, "tools", "convert_checkpoint_to_hf.py")


def convert(*argv):
    return subprocess.run([sys.executable, CONVERTER, *map(str, argv)], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), check=False)


def our_logits(load_dir, tokens):
    """Our GPTModel (TP=1, no pipeline) with the checkpoint's merged weights: [b, s, V]."""
    from megatron.checkpoint.reshard import Checkpoint, table_key
    from megatron.model.config import GPTConfig
    from megatron.model.gpt_model import GPTModel
    checkpoint = Checkpoint(load_dir)
    info = checkpoint.model_info
    model = GPTModel(GPTConfig(checkpoint.shape, hidden_dropout=0.0, attention_dropout=0.0,
                               rope_theta=info.get("rope_theta", 10000.0),
                               layernorm_epsilon=info.get("layernorm_epsilon", 1e-5))).eval()
    full = checkpoint.read_weights()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(full[table_key(name, checkpoint.shape, False)])
        return model(tokens).transpose(0, 1).contiguous()
