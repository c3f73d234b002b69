"""Graph rewrites: the pattern engine and the passes built on it, each a small named PatternMatcher."""
from .engine import ANY, Fired, Pat, PatternMatcher, graph_rewrite, trace, tracing  # noqa: F401
