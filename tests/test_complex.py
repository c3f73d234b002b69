"""Complex tensors (tinyllm/complex.py) against torch: values and gradients on every runtime, hypothesis over shapes
and values, Meta's Llama RoPE (complex form) run unchanged with `import tinyllm as torch` against torch and against
tinyllm's interleaved RotaryEmbedding, and the errors torch raises.

Gradients: for a real loss L, torch's z.grad is dL/dRe z + i dL/dIm z (its docs, "Autograd for Complex Numbers");
each test takes L = sum(view_as_real(out) * w) for a fixed real w, in both libraries. Tolerance: float32 values
of a few products: rtol 1e-5, atol 1e-5 (1e-4 where a sum or a matmul adds up more terms)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import mutually_broadcastable_shapes

import tinyllm as tl

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = dict(rtol=1e-5, atol=1e-5)


def crandn(rng, shape, dtype=np.complex64, min_abs=0.0):
    """Complex values with |z| in [min_abs, min_abs + 2): a positive min_abs keeps divisors away from 0."""
    r = min_abs + 2 * rng.random(shape)
    phi = rng.uniform(-np.pi, np.pi, shape)
    return (r * np.exp(1j * phi)).astype(dtype)


def leaf(array):
    """(tinyllm leaf, torch leaf) of one NumPy array (complex or real), both requiring grad."""
    if np.iscomplexobj(array):
        z = tl.view_as_complex(tl.tensor(np.stack([array.real, array.imag], -1))).detach().requires_grad_()
    else:
        z = tl.tensor(array, requires_grad=True)
    return z, torch.tensor(array, requires_grad=True)


def backward_both(out, tout, seed=0):
    """L = sum(out_as_real * w) in both libraries (w real, fixed), backward."""
    real_out = tl.view_as_real(out) if out.is_complex() else out
    real_t = torch.view_as_real(tout) if tout.is_complex() else tout
    w = np.random.default_rng(seed).standard_normal(tuple(real_t.shape)).astype(real_t.detach().numpy().dtype)
    (real_out * tl.tensor(w)).sum().backward()
    (real_t * torch.tensor(w)).sum().backward()


def check(pairs, out, tout, tol=TOL):
    tout = tout.resolve_conj()  # (torch's conj() is a lazy bit; numpy() and view_as_real refuse it)
    assert out.shape == tuple(tout.shape) and out.dtype.name == str(tout.dtype).removeprefix("torch.")
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **tol)
    backward_both(out, tout)
    for x, t in pairs:
        assert (x.grad is None) == (t.grad is None)
        if t.grad is not None:
            assert x.grad.is_complex() == t.grad.is_complex()
            np.testing.assert_allclose(x.grad.numpy(), t.grad.resolve_conj().numpy(), **tol)


BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
          "div": lambda a, b: a / b, "pow": lambda a, b: a ** b}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("other", ["complex", "real", "float", "pycomplex"])
@settings(max_examples=5)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3), swap=st.booleans(),
       seed=st.integers(0, 2**16))
def test_binary_matches_torch(op, other, shapes, swap, seed):
    """z op w and w op z, w complex, real (broadcasting both ways) or a Python number."""
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    z, tz = leaf(crandn(rng, sa, min_abs=0.5))
    if other == "complex":
        w, tw = leaf(crandn(rng, sb, min_abs=0.5))
    elif other == "real":
        w, tw = leaf((rng.choice([-1, 1], sb) * rng.uniform(0.5, 2, sb)).astype(np.float32))
    else:
        w = tw = 1.5 if other == "float" else complex(0.75, -1.25)
    a, b, ta, tb = (w, z, tw, tz) if swap else (z, w, tz, tw)
    out, tout = BINARY[op](a, b), BINARY[op](ta, tb)
    pairs = [(z, tz)] + ([(w, tw)] if other in ("complex", "real") else [])
    check(pairs, out, tout, dict(rtol=1e-4, atol=1e-4) if op == "pow" else dict(rtol=1e-5, atol=1e-5))


UNARY = {"exp": lambda z: z.exp(), "conj": lambda z: z.conj(), "abs": lambda z: z.abs(), "angle": lambda z: z.angle(),
         "real": lambda z: z.real, "imag": lambda z: z.imag, "neg": lambda z: -z, "sum": lambda z: z.sum(),
         "mean": lambda z: z.mean(), "sum_dim": lambda z: z.sum(-1), "mean_keepdim": lambda z: z.mean(0, keepdim=True),
         "abs_fn": lambda z: abs(z), "transpose": lambda z: z.transpose(0, -1) * 2,
         "index": lambda z: z[1:, ..., None] * 2, "reshape": lambda z: z.reshape(-1) * 2,
         "flatten": lambda z: z.unsqueeze(0).squeeze(0).flatten() * 2, "last": lambda z: z[..., 0] * 2,
         "permute": lambda z: z.permute(*reversed(range(z.ndim))) * 2, "recip": lambda z: 1 / z,
         "log": lambda z: z.log(), "square": lambda z: z.square(), "reciprocal": lambda z: z.reciprocal(),
         "sqrt": lambda z: z.sqrt(), "sgn": lambda z: z.sgn(), "sin": lambda z: z.sin(), "cos": lambda z: z.cos(),
         "sinh": lambda z: z.sinh(), "cosh": lambda z: z.cosh(), "tanh": lambda z: z.tanh(),
         "pow0": lambda z: z ** 0, "pow2": lambda z: z ** 2, "pow3": lambda z: z.pow(3), "pow_half": lambda z: z ** 0.5,
         "pow_neg": lambda z: z ** -1.5, "pow_int_neg": lambda z: z ** -2, "pow_complex": lambda z: z ** (0.5 - 1j),
         "rpow": lambda z: 2 ** z, "rpow_complex": lambda z: (1 + 1j) ** z}


@pytest.mark.parametrize("name", sorted(UNARY))
@settings(max_examples=4)
@given(shape=st.lists(st.integers(2, 4), min_size=1, max_size=3), seed=st.integers(0, 2**16))
def test_unary_and_reductions_match_torch(name, shape, seed):
    z, tz = leaf(crandn(np.random.default_rng(seed), shape, min_abs=0.5))
    tol = dict(rtol=1e-4, atol=1e-4) if name.startswith(("pow", "rpow")) else dict(rtol=1e-5, atol=1e-4)
    check([(z, tz)], UNARY[name](z), UNARY[name](tz), tol)


# the edges: both signs of zero, the branch cut of sqrt and log (the negative real axis), zero, huge real parts
EDGES = np.array([0j, complex(-0.0, 0.0), complex(0.0, -0.0), -4 + 0j, complex(-4, -0.0), 4 + 0j, 3j, -3j,
                  1e-20 + 1j, -2 + 1e-7j, 30 + 1j, -30 - 2j, 1 + 30j], np.complex64)


@pytest.mark.parametrize("name", ["sqrt", "sgn", "sin", "cos", "tanh", "abs", "pow0", "pow2", "pow_half", "pow_neg",
                                  "pow_complex", "rpow", "rpow_complex"])
def test_unary_edges_match_torch(name):
    """Values at the edges (NaN where torch has NaN): the principal branch of sqrt with torch's sign of zero,
    torch's 0 ** p (1 for a number p = 0, 0 for Re p > 0, inf + nan i for Re p < 0), tanh of a huge real part."""
    out, tout = UNARY[name](tl.tensor(EDGES)), UNARY[name](torch.tensor(EDGES))
    if name in ("sin", "cos"):  # (cosh 30 is 5e12: compare where it stays small)
        out, tout = out[:-3], tout[:-3]
    np.testing.assert_allclose(out.numpy(), tout.numpy(), rtol=1e-5, atol=1e-6, equal_nan=True)


def test_function_forms_of_the_new_ops():
    """tinyllm.sqrt / sgn / tanh / pow ... of a complex tensor are its methods; sgn of a real tensor is sign."""
    a, r = crandn(np.random.default_rng(11), (5,), min_abs=0.5), np.array([-2, 0, 3, -0.5], np.float32)
    for name, args in (("sqrt", ()), ("sgn", ()), ("tanh", ()), ("sin", ()), ("cosh", ()), ("pow", (1.5,))):
        np.testing.assert_allclose(getattr(tl, name)(tl.tensor(a), *args).numpy(),
                                   getattr(torch, name)(torch.tensor(a), *args).numpy(), **TOL)
    np.testing.assert_array_equal(tl.sgn(tl.tensor(r)).numpy(), torch.sgn(torch.tensor(r)).numpy())


def test_pow_at_zero_matches_torch():
    """A tensor exponent at base 0: torch's nan + nan i for Re w = 0 (0 ** 0 too: its 1 is the number exponent's)."""
    z, w = np.array([0j, 0j, 0j, 0j, 2 + 1j], np.complex64), np.array([0j, 1j, -1 + 1j, 1 - 1j, 0j], np.complex64)
    for ours, theirs in ((tl.tensor(z) ** tl.tensor(w), torch.tensor(z) ** torch.tensor(w)),
                         (0j ** tl.tensor(w), 0j ** torch.tensor(w)),
                         (tl.tensor(z) ** tl.tensor(w.real.copy()), torch.tensor(z) ** torch.tensor(w.real.copy()))):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, equal_nan=True)


def test_comparisons_and_float_classes_match_torch():
    """== and != of both parts (with complex, real and number operands), isclose / allclose / equal, isnan /
    isinf / isfinite of any part."""
    nan, inf = float("nan"), float("inf")
    a = np.array([1 + 2j, complex(nan, 1), complex(1, inf), 3, 0j, complex(inf, inf), 2j], np.complex64)
    b = np.array([1 + 2j, complex(nan, 1), complex(1, inf), 3 + 1e-7j, 1e-9j, complex(inf, -inf), 2.00001j],
                 np.complex64)
    r = np.array([1, nan, 1, 3, 0, inf, 0], np.float32)
    for lib in (tl, torch):
        z, w, x = lib.tensor(a), lib.tensor(b), lib.tensor(r)
        outs = [z == w, z != w, z == x, x != z, z == 3, z != 2j, z.isclose(w), z.isclose(w, equal_nan=True),
                lib.isclose(z, w, rtol=1e-3, atol=0), z.isnan(), z.isinf(), z.isfinite(), lib.isfinite(z)]
        flags = [z.allclose(w), z[:1].allclose(w[:1]), lib.equal(z, w), z[3:5].equal(z[3:5]), lib.equal(z[:1], w[:1])]
        if lib is tl:
            ours = [o.numpy() for o in outs], flags
        else:
            for o, t in zip(ours[0], outs):
                np.testing.assert_array_equal(o, t.numpy())
            assert ours[1] == flags


def test_in_place_updates_match_torch():
    """add_ / sub_ / mul_ / div_ / += / copy_ / zero_ / fill_ on complex tensors: values and gradients through them."""
    rng = np.random.default_rng(9)
    (a, ta), (b, tb) = leaf(crandn(rng, (2, 3), min_abs=0.5)), leaf(crandn(rng, (3,), min_abs=0.5))
    outs = []
    for lib, x, y in ((tl, a, b), (torch, ta, tb)):
        z = x * 1
        z.mul_(y)
        z.add_(2j)
        z += y
        z.sub_(1.5, alpha=2)
        z *= 1 - 1j
        z.div_(y)
        z /= 2
        outs.append(z)
    check([(a, ta), (b, tb)], *outs)
    for lib in (tl, torch):
        z = lib.tensor(crandn(rng, (2,)))
        z.copy_(lib.tensor([1 + 2j, 3j]))
        assert z.tolist() == [1 + 2j, 3j]
        z.fill_(2 - 1j)
        assert z.tolist() == [2 - 1j, 2 - 1j]
        z.zero_()
        assert z.tolist() == [0j, 0j]
    p = tl.tensor(crandn(rng, (2,))).requires_grad_()
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        p.mul_(2)
    with tl.no_grad():
        p.mul_(2)
    assert p.is_leaf and p.requires_grad


INDEXES = {"mask": lambda m, i: m, "mask_row": lambda m, i: m[:, 0], "mask_ellipsis": lambda m, i: (m, ...),
           "index": lambda m, i: i, "index_cols": lambda m, i: (slice(None), i),
           "two_indexes": lambda m, i: (i[:2], i[1:]),
           "mask_then_int": lambda m, i: (m[:, 0], 1), "list": lambda m, i: [2, 0]}


@pytest.mark.parametrize("name", sorted(INDEXES))
def test_index_tensors_and_masks_match_torch(name):
    """z[index] with index tensors and bool masks over the complex shape (values and gradients), and
    z[index] = value of complex, real and number values."""
    rng = np.random.default_rng(10)
    a = crandn(rng, (3, 4))
    mask, idx = rng.random((3, 4)) > 0.4, np.array([2, 0, 1])
    mask[0, 0] = mask[1, 0] = True

    def index(lib):
        return INDEXES[name](lib.tensor(mask), lib.tensor(idx))

    (z, tz) = leaf(a)
    check([(z, tz)], z[index(tl)] * 2, tz[index(torch)] * 2)
    for value in (2j, 1.5, "complex", "real"):
        ours, theirs = tl.tensor(a), torch.tensor(a)
        shape = tuple(theirs[index(torch)].shape)
        if value == "complex":
            v = crandn(rng, shape[-1:])
        elif value == "real":
            v = rng.standard_normal(shape[-1:]).astype(np.float32)
        ours[index(tl)] = tl.tensor(v) if isinstance(value, str) else value
        theirs[index(torch)] = torch.tensor(v.astype(np.complex64)) if isinstance(value, str) else value  # (torch
        # wants complex there; tinyllm takes the real values too)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@pytest.mark.parametrize("sa, sb", [((3, 4), (4, 2)), ((2, 3, 4), (2, 4, 5)), ((4,), (4, 3))])
def test_matmul_matches_torch(sa, sb):
    rng = np.random.default_rng(1)
    (a, ta), (b, tb) = leaf(crandn(rng, sa)), leaf(crandn(rng, sb))
    check([(a, ta), (b, tb)], a @ b, ta @ tb, dict(rtol=1e-5, atol=1e-4))


def test_real_matmul_complex():
    """real @ complex and complex @ real: torch wants one dtype there, so its side promotes the real one first."""
    rng = np.random.default_rng(6)
    (x, tx), (z, tz) = leaf(rng.standard_normal((2, 3)).astype(np.float32)), leaf(crandn(rng, (3, 4)))
    check([(x, tx), (z, tz)], x @ z, tx.to(torch.complex64) @ tz, dict(rtol=1e-5, atol=1e-4))
    (x, tx), (z, tz) = leaf(rng.standard_normal((4, 2)).astype(np.float32)), leaf(crandn(rng, (3, 4)))
    check([(x, tx), (z, tz)], z @ x, tz @ tx.to(torch.complex64), dict(rtol=1e-5, atol=1e-4))


def test_einsum_and_outer_of_complex():
    """einsum and outer lower to the complex ops above (mul, sum, movement), so they take complex operands too."""
    rng = np.random.default_rng(8)
    (a, ta), (b, tb) = leaf(crandn(rng, (2, 3))), leaf(crandn(rng, (3, 4)))
    check([(a, ta), (b, tb)], tl.einsum("ij,jk->ik", a, b), torch.einsum("ij,jk->ik", ta, tb), dict(rtol=1e-5, atol=1e-4))
    (u, tu), (v, tv) = leaf(crandn(rng, (3,))), leaf(rng.standard_normal(4).astype(np.float32))
    check([(u, tu), (v, tv)], tl.outer(u, v), torch.outer(tu, tv.to(torch.complex64)))


def test_complex_and_polar_match_torch():
    rng = np.random.default_rng(2)
    (re, tre), (im, tim) = leaf(rng.standard_normal((3, 4)).astype(np.float32)), leaf(rng.standard_normal((4,)).astype(np.float32))
    check([(re, tre), (im, tim)], tl.complex(re, im), torch.complex(tre, tim))
    (r, tr), (phi, tphi) = leaf(rng.uniform(0.5, 2, (5,)).astype(np.float32)), leaf(rng.uniform(-3, 3, (5,)).astype(np.float32))
    check([(r, tr), (phi, tphi)], tl.polar(r, phi), torch.polar(tr, tphi))


def test_complex128(each_runtime):
    if each_runtime == "wgsl":
        pytest.skip("WGSL runtime: no float64 in WebGPU, so no complex128")
    rng = np.random.default_rng(3)
    (a, ta), (b, tb) = leaf(crandn(rng, (2, 3), np.complex128)), leaf(crandn(rng, (3,), np.complex64))
    out, tout = a * b, ta * tb  # complex128 * complex64 -> complex128, as torch
    assert out.dtype is tl.complex128
    check([(a, ta), (b, tb)], out, tout)


def test_dtype_and_flags():
    z = tl.complex(tl.randn(2, 3), tl.randn(2, 3))
    assert z.dtype is tl.complex64 and z.dtype.is_complex and z.is_complex() and tl.is_complex(z)
    assert not tl.float32.is_complex and not tl.randn(2).is_complex() and not tl.randn(2).dtype.is_complex
    assert z.shape == (2, 3) and z.ndim == 2 and z.size(-1) == 3 and z.numel() == 6 and len(z) == 2
    assert z.stride() == (3, 1) and z.T.shape == (3, 2)
    a = z.numpy()
    assert a.dtype == np.complex64 and a.shape == (2, 3)
    assert isinstance(z[0, 1].item(), complex)
    assert tl.complex64 is tl.cfloat and tl.zeros(1).to(tl.float64).double().dtype is tl.float64
    assert "complex64" in repr(z)


def test_factories_and_function_forms(each_runtime):
    """tensor / from_numpy of complex data, zeros / ones / full / randn with a complex dtype, cat, stack, where and
    the function forms with a real first argument, against torch."""
    rng = np.random.default_rng(5)
    a, b, r = crandn(rng, (2, 3)), crandn(rng, (2, 3)), rng.standard_normal((2, 3)).astype(np.float32)
    z, w, x = tl.tensor(a), tl.from_numpy(b), tl.tensor(r)
    tz, tw, tx = torch.tensor(a), torch.from_numpy(b), torch.tensor(r)
    mask = r > 0
    for ours, theirs in ((tl.tensor([1 + 2j, 3j]), torch.tensor([1 + 2j, 3j])),
                         (tl.zeros(2, 3, dtype=tl.complex64), torch.zeros(2, 3, dtype=torch.complex64)),
                         (tl.ones_like(z), torch.ones_like(tz)), (tl.full((2,), 1 - 2j), torch.full((2,), 1 - 2j)),
                         (tl.cat([z, w], 1), torch.cat([tz, tw], 1)), (tl.cat([x, z]), torch.cat([tx, tz])),
                         (tl.stack([z, w], -1), torch.stack([tz, tw], -1)),
                         (tl.where(tl.tensor(mask), z, w), torch.where(torch.tensor(mask), tz, tw)),
                         (tl.mul(x, z), torch.mul(tx, tz)), (tl.add(x, z), torch.add(tx, tz)),
                         (tl.sub(2.0, z), torch.sub(2.0, tz)), (tl.exp(z), torch.exp(tz)), (tl.conj(z), torch.conj(tz))):
        assert ours.is_complex() and ours.shape == tuple(theirs.shape)
        assert ours.dtype.name == str(theirs.dtype).removeprefix("torch.")
        np.testing.assert_allclose(ours.numpy(), theirs.resolve_conj().numpy(), **TOL)
    if each_runtime != "wgsl":  # (no float64 there)
        np.testing.assert_array_equal(tl.tensor(a.astype(np.complex128)).numpy(), a.astype(np.complex128))
        assert tl.tensor(a.astype(np.complex128)).dtype is tl.complex128
    x = tl.tensor([-2.0, 0.0, 3.0, float("nan")], requires_grad=True)
    tx = torch.tensor([-2.0, 0.0, 3.0, float("nan")], requires_grad=True)
    check([(x, tx)], tl.angle(x), torch.angle(tx))  # a real tensor's: pi or 0, gradient 0
    np.testing.assert_array_equal(tl.real(z).numpy(), torch.real(tz).numpy())
    np.testing.assert_array_equal(tl.imag(z).numpy(), torch.imag(tz).numpy())
    x = tl.randn(3)
    assert x.real is x and x.conj() is x
    with pytest.raises(RuntimeError, match="imag is not implemented for tensors with non-complex dtypes"):
        x.imag
    n = tl.randn(4000, dtype=tl.complex64).numpy()  # torch's: each part of variance 1/2
    assert n.dtype == np.complex64 and abs(n.real.var() - 0.5) < 0.05 and abs(n.imag.var() - 0.5) < 0.05


def test_backward_with_a_complex_gradient():
    """z.backward(g) for a complex z, as torch; without g, torch's error."""
    rng = np.random.default_rng(7)
    (a, ta), (b, tb) = leaf(crandn(rng, (3,))), leaf(crandn(rng, (3,)))
    g = crandn(rng, (3,))
    out, tout = (a * b).exp(), (ta * tb).exp()
    out.backward(tl.tensor(g))
    tout.backward(torch.tensor(g))
    for x, t in ((a, ta), (b, tb)):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-4)
    with pytest.raises(RuntimeError, match="gradient must be a complex tensor of shape"):
        (a * b).backward(tl.ones(3))


def test_views_share_storage():
    x = tl.randn(2, 3, 2, requires_grad=True)
    z = tl.view_as_complex(x)
    r = tl.view_as_real(z)
    assert z.shape == (2, 3) and r.shape == (2, 3, 2)
    assert z.node is x.node and r.node is x.node  # zero-copy: one node, one storage
    assert z.requires_grad and not z.is_leaf
    np.testing.assert_array_equal(r.detach().numpy(), x.detach().numpy())
    np.testing.assert_array_equal(z.real.detach().numpy(), x.detach().numpy()[..., 0])
    (z.abs() ** 2).sum().backward()  # d/dx (x² + y²) = 2x: the storage's gradient
    np.testing.assert_allclose(x.grad.numpy(), 2 * x.detach().numpy(), **TOL)


def test_complex_leaf_grad_is_torchs_convention():
    """(|z|²).sum(): torch's z.grad is 2z (dL/dx + i dL/dy)."""
    z, tz = leaf(crandn(np.random.default_rng(4), (4,)))
    (z.abs() ** 2).sum().backward()
    (tz.abs() ** 2).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), tz.grad.numpy(), **TOL)
    np.testing.assert_allclose(z.grad.numpy(), 2 * z.detach().numpy(), **TOL)
    z, tz = leaf(np.array([0j, 3 + 4j], np.complex64))  # |z| at 0: torch's gradient there is 0
    z.abs().sum().backward()
    tz.abs().sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), tz.grad.numpy(), **TOL)


def meta_rope(torch):
    """Meta's llama/model.py RoPE, verbatim but for the type annotations."""
    def precompute_freqs_cis(dim, end, theta=10000.0):
        freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
        t = torch.arange(end, device=freqs.device)  # type: ignore
        freqs = torch.outer(t, freqs).float()  # type: ignore
        freqs_cis = torch.polar(torch.ones_like(freqs), freqs)  # complex64
        return freqs_cis

    def reshape_for_broadcast(freqs_cis, x):
        ndim = x.ndim
        assert 0 <= 1 < ndim
        assert freqs_cis.shape == (x.shape[1], x.shape[-1])
        shape = [d if i == 1 or i == ndim - 1 else 1 for i, d in enumerate(x.shape)]
        return freqs_cis.view(*shape)

    def apply_rotary_emb(xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        freqs_cis = reshape_for_broadcast(freqs_cis, xq_)
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)
    return precompute_freqs_cis, apply_rotary_emb


@pytest.mark.parametrize("B, S, H, D", [(2, 5, 3, 8), (1, 7, 2, 16)])
def test_meta_rope_runs_unchanged(B, S, H, D):
    """Values and gradients to xq, xk against torch, and values against RotaryEmbedding(interleaved=True)."""
    rng = np.random.default_rng(D)
    q, k = rng.standard_normal((B, S, H, D)).astype(np.float32), rng.standard_normal((B, S, H, D)).astype(np.float32)
    gq, gk = rng.standard_normal(q.shape).astype(np.float32), rng.standard_normal(k.shape).astype(np.float32)
    results = {}
    for name, mod in (("tinyllm", tl), ("torch", torch)):
        precompute, apply = meta_rope(mod)
        freqs_cis = precompute(D, S)
        assert str(freqs_cis.dtype).endswith("complex64") and tuple(freqs_cis.shape) == (S, D // 2)
        xq, xk = mod.tensor(q, requires_grad=True), mod.tensor(k, requires_grad=True)
        oq, ok = apply(xq, xk, freqs_cis)
        ((oq * mod.tensor(gq)).sum() + (ok * mod.tensor(gk)).sum()).backward()
        results[name] = [t.detach().numpy() for t in (oq, ok, xq.grad, xk.grad)] + [freqs_cis.numpy()]
    for a, b in zip(results["tinyllm"], results["torch"]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)
    cos, sin = tl.nn.RotaryEmbedding(D, S, interleaved=True)(tl.arange(S))
    for x, out in ((q, results["tinyllm"][0]), (k, results["tinyllm"][1])):  # (B, S, H, D): cos (S, 1, D)
        ref = tl.nn.rotary.apply_rotary_pos_emb(tl.tensor(x), cos[:, None], sin[:, None], interleaved=True)
        np.testing.assert_allclose(out, ref.numpy(), rtol=1e-5, atol=2e-5)


def test_errors_as_torch():
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        tl.view_as_complex(tl.randn(3, 4))
    with pytest.raises(RuntimeError, match="last dimension with stride 1"):
        tl.view_as_complex(tl.randn(2, 4).T)
    with pytest.raises(RuntimeError, match="only supported for float and double"):
        tl.view_as_complex(tl.ones(3, 2, dtype=tl.int64))
    with pytest.raises(RuntimeError, match="complex: expected imag to be a float or double tensor, got tinyllm.float16"):
        tl.complex(tl.randn(2), tl.randn(2).half())
    with pytest.raises(RuntimeError, match="polar: expected abs to be a float or double tensor"):
        tl.polar(tl.ones(2, dtype=tl.int64), tl.randn(2))
    with pytest.raises(RuntimeError, match="only supported for complex"):
        tl.view_as_real(tl.randn(3, 2))
    z = tl.complex(tl.randn(3), tl.randn(3))
    for op, name in ((lambda: z < z, "lt"), (lambda: z >= 1, "ge"), (lambda: z.relu(), "relu"),
                     (lambda: z.softmax(-1), "softmax"), (lambda: z % 2, "mod"), (lambda: z.max(), "max"),
                     (lambda: z.sigmoid(), "sigmoid"), (lambda: z.clamp(0, 1), "clamp")):
        with pytest.raises(TypeError, match=f"^{name}: not supported for complex tensors"):
            op()
    with pytest.raises(RuntimeError, match="real scalar outputs"):
        z.sum().backward()
    with pytest.raises(TypeError, match="casting complex64 to float32"):
        z.to(tl.float32)
    with pytest.raises(TypeError, match="^float: not supported"):
        z.float()


def test_setitem_gradients_match_torch():
    """z[mask] = f(y) and z[:, 1] = number on a non-leaf z: values, and gradients to both x (z's source) and y."""
    rng = np.random.default_rng(12)
    (x, tx), (y, ty) = leaf(crandn(rng, (3, 4))), leaf(crandn(rng, (4,)))
    mask = np.array([True, False, True])
    outs = []
    for lib, a, b in ((tl, x, y), (torch, tx, ty)):
        z = a * 1
        z[lib.tensor(mask)] = b * 2
        z[:, 1] = 3j
        outs.append(z)
    check([(x, tx), (y, ty)], *outs)
