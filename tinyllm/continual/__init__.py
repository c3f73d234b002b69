"""A model that learns from its users (docs/continual.md): preference losses with TRL's names (losses.py), a
crash-safe feedback store (store.py), and the loop that tunes LoRA adapters on it (loop.py)."""
