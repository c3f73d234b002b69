"""The WGSL runtime (WebGPU through wgpu): runtime.py dispatches; device.py holds the adapter and its buffers;
render.py writes fused kernels and fills the templates of wgsl/*.wgsl; attention.py, rowwise.py and sort.py add
the kernels of the ops that passes make."""
