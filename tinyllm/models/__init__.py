"""The model families (nanoGPT's GPT, Hugging Face's Llama) and their checkpoint directories
(`from_pretrained` / `save_pretrained`, `AutoModelForCausalLM`: tinyllm/models/pretrained.py)."""
from .gpt import GPT, GPTConfig  # noqa: F401
from .llama import Llama, LlamaConfig  # noqa: F401
from .pretrained import AutoModelForCausalLM, CheckpointError  # noqa: F401
