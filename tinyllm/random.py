"""Random numbers, as torch.random: the Generator class, the default generator that `manual_seed` seeds, and the
NumPy Generator each random function draws from. At the bottom (it imports nothing of tinyllm), so the Tensor
methods that fill a tensor with random values (`exponential_`, `uniform_`, ...) and the factories share it."""
import copy

import numpy as np


class Generator:
    """A source of random numbers, as torch.Generator: `Generator().manual_seed(s)` makes whatever is drawn
    from it reproducible (`tinyllm.randn(..., generator=g)`, `tinyllm.sampling.sample(..., generator=g)`).
    It holds a NumPy Generator (PCG64), reseeded in place, so a reference to it stays valid; seed s gives the
    stream of `np.random.default_rng(s)`. Random numbers are drawn on the host whatever the device (`device`
    is accepted for torch's signature)."""

    def __init__(self, device=None):
        self._np = np.random.default_rng(0)
        self._initial_seed = 0

    def manual_seed(self, seed):
        """Seed it; returns the generator, as torch. A negative seed is taken modulo 2⁶⁴, as torch does."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"Generator.manual_seed: the seed must be an int, got {type(seed).__name__} {seed!r:.40}")
        seed = int(seed)
        if not -2 ** 63 <= seed < 2 ** 64:
            raise ValueError(f"Generator.manual_seed: seed {seed} is out of range [-2**63, 2**64)")
        seed %= 2 ** 64
        self._np.bit_generator.state = np.random.PCG64(seed).state
        self._initial_seed = seed
        return self

    def seed(self):
        """Seed it from the operating system's entropy; returns that seed (so it can be reported and reused)."""
        seed = int(np.random.SeedSequence().entropy) % 2 ** 64
        self.manual_seed(seed)
        return seed

    def initial_seed(self):
        """The seed it was last seeded with (0 for a generator never seeded)."""
        return self._initial_seed

    def get_state(self):
        """Its state, to restore later with set_state: NumPy's bit-generator state, a JSON-able dict (torch gives a
        byte tensor; this one can go into a checkpoint's JSON)."""
        return copy.deepcopy(self._np.bit_generator.state)

    def set_state(self, state):
        if not isinstance(state, dict) or state.get("bit_generator") != type(self._np.bit_generator).__name__:
            raise ValueError("Generator.set_state: expected a state returned by Generator.get_state(), got "
                             f"{type(state).__name__} {state!r:.60}")
        self._np.bit_generator.state = state
        return self

    def __repr__(self):
        return f"tinyllm.Generator(initial_seed={self._initial_seed})"


default_generator = Generator()


def manual_seed(seed):
    """Seed the default generator (what every random function draws from unless given `generator=`); returns it,
    as torch.manual_seed."""
    return default_generator.manual_seed(seed)


def generator():
    """The default generator's NumPy Generator (nn's initializers draw from it; a checkpoint saves its state)."""
    return default_generator._np


def numpy_generator(generator=None):
    """The NumPy Generator to draw from: the default one, a tinyllm.Generator's, or a numpy.random.Generator as is."""
    if generator is None:
        return default_generator._np
    if isinstance(generator, Generator):
        return generator._np
    if isinstance(generator, np.random.Generator):
        return generator
    kind = type(generator)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    raise TypeError(f"generator: expected a tinyllm.Generator (or a numpy.random.Generator), got {name}: make one "
                    "with tinyllm.Generator().manual_seed(seed)")
