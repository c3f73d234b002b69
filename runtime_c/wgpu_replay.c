/* wgpu_replay.h: a replayed run of dispatches encoded without a Python call per dispatch. */
#include "wgpu_replay.h"

typedef void (*set_pipeline_fn)(void *pass, void *pipeline);
typedef void (*set_bind_group_fn)(void *pass, uint32_t index, void *group, size_t n_offsets, const uint32_t *offsets);
typedef void (*dispatch_fn)(void *pass, uint32_t x, uint32_t y, uint32_t z);
typedef void (*copy_fn)(void *encoder, void *src, uint64_t src_offset, void *dst, uint64_t dst_offset, uint64_t size);

uintptr_t wgpu_encode_dispatches(const uintptr_t *fns, uintptr_t pass, int64_t n, const uintptr_t *pipes,
                                 const uintptr_t *groups, const uint32_t *xyz, uintptr_t last) {
    set_pipeline_fn set_pipeline = (set_pipeline_fn)fns[0];
    set_bind_group_fn set_bind_group = (set_bind_group_fn)fns[1];
    dispatch_fn dispatch = (dispatch_fn)fns[2];
    void *p = (void *)pass;
    for (int64_t i = 0; i < n; i++) {
        if (pipes[i] != last) {
            set_pipeline(p, (void *)pipes[i]);
            last = pipes[i];
        }
        set_bind_group(p, 0, (void *)groups[i], 0, NULL);
        dispatch(p, xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]);
    }
    return last;
}

void wgpu_encode_copies(uintptr_t fn, uintptr_t encoder, int64_t n, const uintptr_t *src, const uint64_t *src_at,
                        const uintptr_t *dst, const uint64_t *sizes) {
    copy_fn copy = (copy_fn)fn;
    for (int64_t i = 0; i < n; i++)
        copy((void *)encoder, (void *)src[i], src_at[i], (void *)dst[i], 0, sizes[i]);
}
