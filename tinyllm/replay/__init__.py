"""tinyllm.jit: a step recorded, then replayed (jit.py's docstring explains it)."""
