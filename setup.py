from setuptools import find_packages, setup

# The DeepSpeed releases the suite ran on. megatron/runtime/deepspeed_internals.py reaches into DeepSpeed's
# internals, which change between releases: outside this range it prints one warning line at startup.
DEEPSPEED_TESTED = ">=0.19,<0.20"

setup(
    name="megatron-ds-exact",
    version="0.1.0",
    description="Megatron-DeepSpeed-style GPT pretraining with an exact, once-computed parameter count",
    packages=find_packages(include=["megatron", "megatron.*"]),
    py_modules=["pretrain_gpt"],  # the entry point's providers, importable by tests and benchmarks
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.1",
        "deepspeed>=0.17.1",  # MoE checkpoints use checkpoint_engine.is_data_parallel_writer (0.17.1+)
        "numpy",
        "tensorboard",
        "regex",
        "six",
        "psutil",  # a process's start time (--exit-duration-in-mins); DeepSpeed needs it too
    ],
    extras_require={
        # tools/convert_checkpoint_to_hf.py only; training never imports them
        "hf": ["transformers>=5", "safetensors", "tokenizers"],
        # tools/compare_runs.py only (pictures and the power-law fit); training never imports them
        "plots": ["matplotlib", "scipy"],
        # --tokenizer-type GPTSentencePieceTokenizer
        "sentencepiece": ["sentencepiece"],
        # --wandb-project (Weights & Biases logging); training without it never imports it
        "wandb": ["wandb"],
        # tokenizers: an independent reference encoder for the BPE tests and the vocab trainer
        # ruff, mypy: the lint and type check CI runs before the tests (ruff.toml, mypy.ini);
        # transformers, safetensors: the HF export;
        # matplotlib, scipy: tools/compare_runs.py; sentencepiece: the SentencePiece tokenizer tests;
        # wandb: the offline W&B run the logging test reads back
        "test": ["pytest", "tokenizers", "ruff==0.17.6", "mypy==2.4.1", "transformers>=5", "safetensors", "matplotlib",
                 "scipy", "sentencepiece", "wandb"],
    },
)
