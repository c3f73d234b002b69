"""The NumPy runtime: every primitive's own NumPy forward (tinyllm/ops/), the reference the others are tested against."""
