/*
The WGSL runtime's replayed dispatches (tinyllm/runtime/wgsl/plan.py) encoded into an open compute pass in one call
instead of two or three wgpu-py calls each. wgpu-native's functions arrive as addresses taken from wgpu-py's own cffi
library, so the module links to nothing new and calls the same library wgpu-py does.
    wgpu_encode_dispatches:  for i < n, into the compute pass `pass`: set_pipeline(pipes[i]) where it is not the
                             pipeline set last (`last`: the one the pass has now, 0 for none), set_bind_group(0,
                             groups[i]) and dispatch_workgroups(xyz[3i], xyz[3i + 1], xyz[3i + 2]). fns: the addresses
                             of wgpuComputePassEncoderSetPipeline, ...SetBindGroup and ...DispatchWorkgroups. Returns
                             the pipeline set last.
    wgpu_encode_copies:      for i < n, into the command encoder `encoder` (outside any pass): copy sizes[i] bytes
                             from buffer src[i] at byte src_at[i] to the start of dst[i]. fn: the address of
                             wgpuCommandEncoderCopyBufferToBuffer.
*/
#include <stdint.h>
#include <stddef.h>

uintptr_t wgpu_encode_dispatches(const uintptr_t *fns, uintptr_t pass, int64_t n, const uintptr_t *pipes,
                                 const uintptr_t *groups, const uint32_t *xyz, uintptr_t last);
void wgpu_encode_copies(uintptr_t fn, uintptr_t encoder, int64_t n, const uintptr_t *src, const uint64_t *src_at,
                        const uintptr_t *dst, const uint64_t *sizes);
