"""Settings read from the environment, parsed in one place."""
import os


def debug_level():
    """TINYLLM_DEBUG: 0 (default) silent; 1 prints each realize and the rewrites that fired; 2 and up add detail.
    A non-numeric value such as 'yes' means 1."""
    value = os.environ.get("TINYLLM_DEBUG", "").strip()
    if value in ("", "0"):
        return 0
    return int(value) if value.isdigit() else 1
