"""Source renderers for fused kernels: c.py (C) and wgsl.py (WGSL), over what cstyle.py holds for both."""
