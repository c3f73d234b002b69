"""Graph rewrites: the pattern engine and the passes built on it, each a small named PatternMatcher."""
from .engine import Pat, PatternMatcher, graph_rewrite, trace  # noqa: F401
