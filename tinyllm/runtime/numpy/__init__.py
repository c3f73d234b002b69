"""The NumPy runtime: each primitive's own NumPy forward (tinyllm/ops/), the reference the others are tested against."""
