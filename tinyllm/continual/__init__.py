"""A model that learns from its users (docs/continual.md): preference losses with TRL's names (losses.py), a
crash-safe feedback store (store.py), and the loop that tunes LoRA adapters on it (loop.py)."""
from .loop import Loop  # noqa: F401
from .losses import dpo_loss, kto_loss, sequence_logprobs  # noqa: F401
from .store import FeedbackStore, Record, tokenizer_fingerprint  # noqa: F401
