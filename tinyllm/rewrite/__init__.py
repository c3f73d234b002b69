"""Graph rewrites: the pattern engine, the passes, and pipeline.py, the one place that orders them."""
from .engine import ANY, Fired, Pat, PatternMatcher, graph_rewrite, trace, tracing  # noqa: F401
