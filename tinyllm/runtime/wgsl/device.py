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
        self.log = None  # while a schedule runs for a Plan (plan.py): what it allocates, frees and dispatches
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
            self.submit()
            storage = self.alloc(array.nbytes)
        else:
            size = max(16, -(-array.nbytes // 16) * 16)
            storage = self._new_storage(size)
            storage.recycler.detach()  # never pooled: nothing can be recorded on it before it is written
        if array.nbytes:
            data = array.tobytes()
            data += b"\0" * (-len(data) % 4)  # writes are in whole 4-byte words
            self.queue.write_buffer(storage.buffer, 0, data)
        return storage

    def download(self, storage, nbytes):
        """The first `nbytes` of `storage`, after everything submitted so far has run (read_buffer waits)."""
        if self.log is not None:
            self.log.append(("host",))
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
            group = self.device.create_bind_group(layout=layout, entries=[
                {"binding": i, "resource": {"buffer": s.buffer, "offset": 0, "size": s.nbytes}}
                for i, s in enumerate(storages)])
            # the entry keeps the buffers alive, so their ids cannot be reused while it is cached
            entry = self.bind_groups[key] = (group, tuple(s.buffer for s in storages))
        pass_ = self.open_pass()
        pass_.set_pipeline(pipe)
        pass_.set_bind_group(0, entry[0])
        pass_.dispatch_workgroups(*groups)
        if self.log is not None:
            self.log.append(("run", pipe, entry[0], tuple(groups)))

    def open_pass(self):
        """The compute pass dispatches are recorded into (one command buffer until the next submit)."""
        if self.pass_ is None:
            self.encoder = self.device.create_command_encoder()
            self.pass_ = self.encoder.begin_compute_pass()
        return self.pass_

    def submit(self):
        """Send what was recorded (one command buffer) to the GPU; does not wait."""
        if self.pass_ is not None:
            self.pass_.end()
            self.queue.submit([self.encoder.finish()])
            self.submits += 1
            self.encoder = self.pass_ = None
