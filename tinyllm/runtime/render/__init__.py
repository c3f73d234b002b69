"""Source renderers for fused kernels: C here, WGSL beside it in a later issue."""
