"""The C runtime: runtime.py dispatches; the prebuilt kernels (runtime_c/, the cffi module tinyllm._kernels) run the
products, attention and copies; render.py writes fused elementwise/reduction kernels as C, which compiler.py
compiles and caches; record.py, program.py, arena.py, donate.py and chain.py replay a schedule's C calls."""
