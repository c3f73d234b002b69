"""tinyllm.jit: a step recorded, then replayed; jit.py explains it (record.py, tape.py; C: runtime/c_*.py)."""
