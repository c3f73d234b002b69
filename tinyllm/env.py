"""Settings read from the environment, parsed in one place."""
import os


def debug_level():
    """TINYLLM_DEBUG: 0 (default) silent; 1 prints each realize and the rewrites that fired; 2 and up add detail.
    A non-numeric value such as 'yes' means 1."""
    value = os.environ.get("TINYLLM_DEBUG", "").strip()
    if value in ("", "0"):
        return 0
    return int(value) if value.isdigit() else 1


def threads():
    """TINYLLM_THREADS: how many threads the C runtime's kernels use; 0 or unset: automatic, the cores other
    processes leave free (runtime_c/threads.h)."""
    value = os.environ.get("TINYLLM_THREADS", "").strip()
    if value == "":
        return 0
    if not value.isdigit():
        raise ValueError(f"TINYLLM_THREADS={value!r}: give a whole number of threads, e.g. TINYLLM_THREADS=2 "
                         "(0 or unset: automatic)")
    return int(value)
