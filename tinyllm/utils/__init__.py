"""Utilities under torch.utils' names: `tinyllm.utils.checkpoint.checkpoint` (also `tinyllm.checkpoint`)."""
