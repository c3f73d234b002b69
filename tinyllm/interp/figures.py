"""Pictures of what the instruments found: matplotlib (the `interp` extra) drawn off-screen and saved atomically."""
import io

from ..utils.files import atomic_write


def pyplot():
    """matplotlib.pyplot with the off-screen Agg backend, or a clear ImportError naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("tinyllm.interp's pictures need matplotlib, which is not installed: "
                          "pip install 'tinyllm[interp]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path, dpi=120):
    """Write `fig` to `path` as a PNG (atomically: a crash leaves the old file or the new one) and close it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    atomic_write(path, buffer.getvalue())
    return path
