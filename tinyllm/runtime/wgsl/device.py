"""The WebGPU device behind the WGSL runtime, through wgpu-py (docs/architecture.md, "The WGSL runtime": Device).

Environment:
  TINYLLM_WGPU_ADAPTER   the adapter whose name contains this text (any case); default: wgpu's high-performance one
  TINYLLM_WGPU_BACKEND   one backend only (vulkan, metal, dx12, gl); default: any, and OpenGL where Vulkan is missing
"""
import heapq
import itertools
import os
import tempfile
import threading
import weakref

import numpy as np

from ..memory import track, untrack

INSTALL_HINT = ("install a WebGPU-capable driver: on Debian/Ubuntu `apt-get install mesa-vulkan-drivers libvulkan1` "
                "gives the software Vulkan adapter lavapipe; on a GPU machine install its Vulkan driver")
ADAPTER_TIMEOUT_S = 20.0  # a driver that never answers is an error, not a hang
BACKENDS = {"vulkan": "Vulkan", "metal": "Metal", "dx12": "DX12", "gl": "GL", "opengl": "GL"}
MAX_BIND_GROUPS_CACHED = 4096


class NoAdapterError(RuntimeError):
    pass


def _quiet_xdg():
    """lavapipe complains on stderr when XDG_RUNTIME_DIR is unset: give it a private 0700 directory."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="tinyllm-xdg-")  # mkdtemp makes it 0700


def _request_adapter():
    import wgpu
    backend = os.environ.get("TINYLLM_WGPU_BACKEND", "").strip().lower()
    if backend:
        if backend not in BACKENDS:
            raise ValueError(f"TINYLLM_WGPU_BACKEND={backend!r}: choose one of {', '.join(sorted(BACKENDS))}")
        from wgpu.backends.wgpu_native.extras import set_instance_extras
        set_instance_extras(backends=[BACKENDS[backend]])
    wanted = os.environ.get("TINYLLM_WGPU_ADAPTER", "").strip()
    if wanted:
        adapters = wgpu.gpu.enumerate_adapters_sync()
        names = [a.summary for a in adapters]
        for a, name in zip(adapters, names):
            if wanted.lower() in name.lower():
                return a
        raise NoAdapterError(f"TINYLLM_WGPU_ADAPTER={wanted!r} matches no adapter; found: "
                             f"{'; '.join(names) or 'none'}" + ("" if names else f" ({INSTALL_HINT})"))
    return wgpu.gpu.request_adapter_sync(power_preference="high-performance")


def find_adapter(timeout=ADAPTER_TIMEOUT_S):
    """The adapter, asked for on a daemon thread so that a stuck driver raises after `timeout` seconds."""
    _quiet_xdg()
    try:
        import wgpu  # noqa: F401
    except ImportError:
        raise NoAdapterError("the WGSL runtime needs the Python package wgpu: `pip install wgpu`") from None
    result = {}

    def ask():
        try:
            result["adapter"] = _request_adapter()
        except BaseException as e:  # handed to the caller's thread
            result["error"] = e

    thread = threading.Thread(target=ask, daemon=True, name="tinyllm-wgpu-adapter")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise NoAdapterError(f"no WebGPU adapter answered within {timeout:.0f} s; {INSTALL_HINT}")
    error = result.get("error")
    if isinstance(error, (NoAdapterError, ValueError)):
        raise error
    if error is not None or result.get("adapter") is None:
        raise NoAdapterError(f"no WebGPU adapter found ({error}); {INSTALL_HINT}")
    return result["adapter"]


class Storage:
    """One GPU buffer of `nbytes` (a multiple of 16, so vec4 views fit), the `order`-th the device made. When
    Python frees it, its buffer goes back to the device's pool (as torch's caching allocator keeps freed blocks)."""
    __slots__ = ("buffer", "nbytes", "order", "recycler", "__weakref__")

    def __init__(self, buffer, nbytes, device, order):
        self.buffer, self.nbytes, self.order = buffer, nbytes, order
        self.recycler = weakref.finalize(self, device.recycle, buffer, nbytes, order)
        self.recycler.atexit = False  # at exit, recycling would make new finalizers to run, without end


def _give_back(pool, storage):
    # Free buffers of a size form a heap by `order`, the oldest going out first: which buffer an allocation gets
    # depends on which are free, not on the order they were freed in, so a step run again gets the same buffers
    # and finds its bind groups (cached by buffer) again.
    heapq.heappush(pool.setdefault(storage.nbytes, []), (storage.order, storage))


class Device:
    def __init__(self):
        import wgpu
        self.wgpu = wgpu
        self.adapter = find_adapter()
        offered = self.adapter.features
        self.features = sorted(f for f in ("shader-f16", "subgroup") if f in offered)
        self.has_f16 = "shader-f16" in self.features
        # all the adapter offers of the limits shaders meet
        wanted = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
                  "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                  "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
                  "max-compute-workgroups-per-dimension", "max-bind-groups")
        limits = {k: self.adapter.limits[k] for k in wanted if k in self.adapter.limits}
        self.device = self.adapter.request_device_sync(required_features=self.features, required_limits=limits)
        self.limits = dict(self.device.limits)
        self.queue = self.device.queue
        info = self.adapter.info
        self.info = {"device": info.get("device", ""), "vendor": info.get("vendor", ""),
                     "backend": info.get("backend_type", ""), "adapter_type": info.get("adapter_type", ""),
                     "description": info.get("description", ""), "features": self.features}
        self.pipelines = {}  # (source, read-only flags) -> (pipeline, bind group layout)
        self.bind_groups = {}  # (pipeline, buffers) -> bind group: a training step binds the same buffers again
        self.pool = {}  # nbytes -> heap of (order, free Storage)
        self.made = itertools.count()  # Storage orders
        self.encoder = self.pass_ = None
        self.submits = 0  # command buffers submitted (read-backs aside)
        self.encoded = 0  # dispatches replayed through encode (in C they make no wgpu-py call to count)
        self.log = None  # while a schedule runs for a Plan (plan.py): what it allocates, frees and dispatches
        self.trace = None  # while a jit replay is observed for a Chain (chain.py): each dispatch's Run (None: host I/O)
        self.native = _native_encoder()
        self.last_pipe = 0  # the handle of the pipeline the open pass has set (0: none)
        usage = wgpu.BufferUsage
        self.usage = usage.STORAGE | usage.COPY_SRC | usage.COPY_DST

    # ---- buffers ----
    def alloc(self, nbytes):
        """A Storage of at least `nbytes`, from the pool when one of that size is free."""
        size = max(16, -(-nbytes // 16) * 16)
        if size > self.limits["max-storage-buffer-binding-size"]:
            raise MemoryError(f"WGSL runtime: a buffer of {size} bytes is over this device's storage binding limit "
                              f"({self.limits['max-storage-buffer-binding-size']} bytes); use smaller tensors")
        free = self.pool.get(size)
        storage = heapq.heappop(free)[1] if free else self._new_storage(size)
        if self.log is not None:
            self.log.append(("alloc", size, storage.order))
        return track(storage, size)

    def _new_storage(self, size):
        return Storage(self.device.create_buffer(size=size, usage=self.usage), size, self, next(self.made))

    def recycle(self, buffer, nbytes, order):
        """A Storage Python freed: its buffer back to the pool, in a Storage of its own (logged as a free)."""
        if self.log is not None:
            self.log.append(("free", order))
        _give_back(self.pool, Storage(buffer, nbytes, self, order))

    def release(self, storage):
        """`storage` holds nothing anyone needs: keep it for the next allocation of its size."""
        if self.log is not None:
            self.log.append(("free", storage.order))
        untrack(storage)
        _give_back(self.pool, storage)

    def empty_cache(self):
        for free in self.pool.values():
            for _, storage in free:
                storage.recycler.detach()  # really freed this time
        self.pool.clear()
        self.bind_groups.clear()

    def upload(self, array, pooled=True):
        """A Storage holding `array`. A queue write runs before every command buffer submitted after it, so a
        pooled buffer that recorded dispatches may still use is written only after they are submitted;
        pooled=False makes a buffer of its own (constants in the middle of recording)."""
        array = np.ascontiguousarray(array)
        if pooled:
            if self.log is not None:
                self.log.append(("host",))              # (data from the host: a replay could not repeat it)
            if self.trace is not None:
                self.trace.append(None)
            self.submit()
            storage = self.alloc(array.nbytes)
        else:
            size = max(16, -(-array.nbytes // 16) * 16)
            storage = self._new_storage(size)
            storage.recycler.detach()  # never pooled: nothing can be recorded on it before it is written
        self.write(storage, array)
        return storage

    def write(self, storage, array):
        """`array`'s bytes to the start of `storage` (a queue write: it runs before what is submitted after it)."""
        if array.nbytes:
            data = np.ascontiguousarray(array).tobytes()
            data += b"\0" * (-len(data) % 4)  # writes are in whole 4-byte words
            self.queue.write_buffer(storage.buffer, 0, data)

    def download(self, storage, nbytes):
        """The first `nbytes` of `storage`, after everything submitted so far has run (read_buffer waits)."""
        if self.log is not None:
            self.log.append(("host",))
        if self.trace is not None:
            self.trace.append(None)
        self.submit()
        if nbytes == 0:
            return b""
        return self.queue.read_buffer(storage.buffer, 0, -(-nbytes // 4) * 4)[:nbytes]

    # ---- pipelines and dispatches ----
    def pipeline(self, source, read_only):
        """The compute pipeline of `source` (entry point `main`, bindings 0..n-1 in group 0, binding i read-only
        when read_only[i], exactly as the shader declares them), compiled once."""
        key = (source, tuple(read_only))
        hit = self.pipelines.get(key)
        if hit is None:
            if not self.has_f16 and "enable f16;" in source:
                raise TypeError(f"WGSL runtime: a kernel computing in float16 needs the adapter feature shader-f16, "
                                f"which {self.info['device']} via {self.info['backend']} lacks; here float16 tensors "
                                "are only stored, read back, argsorted and used as quantized weights' scales: make "
                                "them float32 on another runtime first (t.to('numpy').float().to('wgsl')), or use an "
                                "adapter with shader-f16")
            storage_count = len(read_only)
            if storage_count > self.limits["max-storage-buffers-per-shader-stage"]:
                raise RuntimeError(f"WGSL runtime: a kernel binds {storage_count} storage buffers, more than this "
                                   f"device allows ({self.limits['max-storage-buffers-per-shader-stage']})")
            wgpu = self.wgpu
            layout = self.device.create_bind_group_layout(entries=[
                {"binding": i, "visibility": wgpu.ShaderStage.COMPUTE,
                 "buffer": {"type": "read-only-storage" if ro else "storage"}} for i, ro in enumerate(read_only)])
            module = self.device.create_shader_module(code=source)
            pipe = self.device.create_compute_pipeline(
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": "main"})
            hit = self.pipelines[key] = (pipe, layout)
        return hit

    def dispatch(self, source, storages, read_only, groups):
        """Record one dispatch of `source` over `groups` (x, y, z) workgroups into the open compute pass."""
        pipe, layout = self.pipeline(source, read_only)
        key = (id(pipe), tuple(id(s.buffer) for s in storages))
        entry = self.bind_groups.get(key)
        if entry is None:
            if len(self.bind_groups) >= MAX_BIND_GROUPS_CACHED:
                self.bind_groups.clear()
            bound = tuple((s.buffer, s.nbytes) for s in storages)
            # the entry keeps the buffers alive, so their ids cannot be reused while it is cached
            entry = self.bind_groups[key] = (self.bind_group(layout, bound), bound)
        pass_ = self.open_pass()
        pass_.set_pipeline(pipe)
        self.last_pipe = 0  # (a handle is taken only where a replay needs it)
        pass_.set_bind_group(0, entry[0])
        pass_.dispatch_workgroups(*groups)
        if self.log is not None or self.trace is not None:
            run = Run(pipe, entry[0], tuple(groups), layout, entry[1])
            if self.log is not None:
                self.log.append(("run", run))
            if self.trace is not None:
                self.trace.append(run)

    def bind_group(self, layout, bound):
        """A bind group of `layout` binding each (buffer, size) of `bound` whole, in order."""
        return self.device.create_bind_group(layout=layout, entries=[
            {"binding": i, "resource": {"buffer": buffer, "offset": 0, "size": size}}
            for i, (buffer, size) in enumerate(bound)])

    def encode(self, runs):
        """Record `runs` (a Runs) into the open pass: in one C call where the kernels are built, else two or
        three wgpu-py calls a dispatch."""
        pass_ = self.open_pass()
        self.encoded += len(runs)
        if self.native is not None and runs.arrays is not None:
            lib, ffi, fns, _ = self.native
            pipes, groups, xyz = runs.arrays
            self.last_pipe = lib.wgpu_encode_dispatches(fns, handle(pass_), len(runs), ffi.from_buffer(
                "uintptr_t[]", pipes), ffi.from_buffer("uintptr_t[]", groups), ffi.from_buffer("uint32_t[]", xyz),
                self.last_pipe)
            return
        last = None
        for run in runs.items:
            if run.pipe is not last:
                pass_.set_pipeline(run.pipe)
                last = run.pipe
            pass_.set_bind_group(0, run.group)
            pass_.dispatch_workgroups(*run.groups)
        self.last_pipe = 0

    def submit_step(self, before, fixed, runs, after):
        """One command buffer, submitted: the buffer copies `before` and `fixed`, one compute pass of `runs` (a
        Runs), the copies `after`. A copy is (source, its byte offset, destination, bytes) into the destination's
        start (a Chain's run: `fixed` a Copies it made once)."""
        self.submit()
        encoder = self.device.create_command_encoder()
        self._copies(encoder, before)
        self._copies(encoder, fixed)
        self.encoder, self.pass_, self.last_pipe = encoder, encoder.begin_compute_pass(), 0
        self.encode(runs)
        self.pass_.end()
        self.encoder = self.pass_ = None
        self._copies(encoder, after)
        self.queue.submit([encoder.finish()])
        self.submits += 1

    def _copies(self, encoder, copies):
        if not copies:
            return
        if self.native is None:
            for src, at, dst, size in copies:
                encoder.copy_buffer_to_buffer(src, at, dst, 0, size)
            return
        lib, ffi, _, copy = self.native
        src, at, dst, sizes = (copies if isinstance(copies, Copies) else Copies(copies)).arrays
        lib.wgpu_encode_copies(copy, handle(encoder), len(copies), ffi.from_buffer("uintptr_t[]", src),
                               ffi.from_buffer("uint64_t[]", at), ffi.from_buffer("uintptr_t[]", dst),
                               ffi.from_buffer("uint64_t[]", sizes))

    def open_pass(self):
        """The compute pass dispatches are recorded into (one command buffer until the next submit)."""
        if self.pass_ is None:
            self.encoder = self.device.create_command_encoder()
            self.pass_ = self.encoder.begin_compute_pass()
            self.last_pipe = 0
        return self.pass_

    def submit(self):
        """Send what was recorded (one command buffer) to the GPU; does not wait."""
        if self.pass_ is not None:
            self.pass_.end()
            self.queue.submit([self.encoder.finish()])
            self.submits += 1
            self.encoder = self.pass_ = None


class Run:
    """One dispatch as recorded: the pipeline, bind group and workgroups (x, y, z), and what the group binds: its
    layout and each binding's (buffer, size), for a Chain that binds other buffers in their place."""
    __slots__ = ("pipe", "group", "groups", "layout", "bound")

    def __init__(self, pipe, group, groups, layout, bound):
        self.pipe, self.group, self.groups, self.layout, self.bound = pipe, group, groups, layout, bound


class Runs:
    """Dispatches to record again and again (Device.encode): the Run objects (kept alive: the arrays hold their
    handles), and the handles as arrays for the C encoder."""
    __slots__ = ("items", "arrays")

    def __init__(self, items, native):
        self.items = list(items)
        self.arrays = None
        if native is not None:
            self.arrays = (np.array([handle(r.pipe) for r in self.items], np.uintp),
                           np.array([handle(r.group) for r in self.items], np.uintp),
                           np.array([r.groups for r in self.items], np.uint32).reshape(-1))

    def __len__(self):
        return len(self.items)


class Copies(list):
    """Buffer copies (source, its byte offset, destination, bytes) and their handles as arrays for the C encoder (a
    Chain makes those it runs every call once)."""

    def __init__(self, copies):
        super().__init__(copies)
        self.arrays = (np.array([handle(c[0]) for c in self], np.uintp), np.array([c[1] for c in self], np.uint64),
                       np.array([handle(c[2]) for c in self], np.uintp), np.array([c[3] for c in self], np.uint64))


def handle(obj):
    """The address of a wgpu-py object's wgpu-native handle."""
    from wgpu.backends.wgpu_native._ffi import ffi
    return int(ffi.cast("uintptr_t", obj._internal))


def _native_encoder():
    """(lib, ffi, fns, copy) for runtime_c/wgpu_replay.c's encoders, fns and copy the addresses of the wgpu-native
    functions they call (those wgpu-py calls); None without the C kernels."""
    try:
        from ... import _kernels
        from wgpu.backends.wgpu_native._ffi import ffi as wffi, lib as wlib
    except ImportError:
        return None
    if not hasattr(_kernels.lib, "wgpu_encode_dispatches"):
        return None
    names = ("wgpuComputePassEncoderSetPipeline", "wgpuComputePassEncoderSetBindGroup",
             "wgpuComputePassEncoderDispatchWorkgroups")
    address = lambda name: int(wffi.cast("uintptr_t", wffi.addressof(wlib, name)))  # noqa: E731
    fns = _kernels.ffi.new("uintptr_t[]", [address(n) for n in names])
    return _kernels.lib, _kernels.ffi, fns, address("wgpuCommandEncoderCopyBufferToBuffer")
