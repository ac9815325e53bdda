from .tokenizer import build_tokenizer

__all__ = ["build_tokenizer"]
