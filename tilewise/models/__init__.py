"""Models written with tilewise.nn: a character-level GPT for the demo and the examples."""

from tilewise.models.gpt import GPT, CharTokenizer, GPTConfig

__all__ = ["GPT", "GPTConfig", "CharTokenizer"]
