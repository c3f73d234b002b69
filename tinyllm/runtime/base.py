"""What a runtime provides: buffers it owns, copies to and from NumPy, and running a schedule of kernels."""


class Buffer:
    """A realized value on one runtime. `data` is whatever the runtime keeps (a NumPy array for the CPU ones)."""
    __slots__ = ("runtime", "data", "shape", "dtype", "__weakref__")

    def __init__(self, runtime, data, shape, dtype):
        self.runtime, self.data, self.shape, self.dtype = runtime, data, tuple(shape), dtype

    def numpy(self):
        return self.runtime.to_numpy(self)

    def __repr__(self):
        return f"<Buffer {self.runtime.name} {self.shape} {self.dtype.name}>"


class Runtime:
    name = "?"
    passes = ()  # rewrite passes this runtime adds after the common ones: (name, fn(roots) -> roots)

    def from_numpy(self, array, dtype):
        raise NotImplementedError

    def to_numpy(self, buffer):
        raise NotImplementedError

    def execute(self, schedule, feeds=()):
        """Run `schedule` (see tinyllm/schedule.py) with feeds[i] the Buffer for its i-th SLOT input; return
        one Buffer per output node."""
        raise NotImplementedError
