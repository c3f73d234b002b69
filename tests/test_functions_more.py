"""Functions and methods users reach for (issue 43, point 3): the deterministic ones against torch on every runtime,
the random ones by their statistics (chi-squared goodness of fit, Kolmogorov-Smirnov) and their seeding.

empty, empty_like, logspace, bincount, histc, searchsorted, bucketize, unique, unique_consecutive, isin, equal,
isclose, allclose, finfo, iinfo, data_ptr, storage_offset, untyped_storage; multinomial (with and without
replacement) and the in-place fills exponential_, uniform_, normal_, bernoulli_, geometric_, random_.

The statistical tests draw from fixed seeds, so each gives the same p-value on every run; each passes at a
threshold of 1e-3 and the test beside it shows that a biased sampler fails the same check by far.
"""
import math

import numpy as np
import pytest
import torch

import tinyllm as tl
from conftest import RUNTIMES, wgsl_skip_reason
from helpers import chi2_pvalue

ALPHA = 1e-3  # a fair sampler fails one of these checks with probability 1e-3 per seed; the seeds are fixed


@pytest.fixture(params=RUNTIMES)
def device(request):
    if request.param == "wgsl":
        reason = wgsl_skip_reason()
        if reason:
            pytest.skip(reason)
    return request.param


def same(got, want):
    """A tinyllm tensor (or tuple of them) equal to torch's: shape, dtype name and values."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w)
        return
    assert got.shape == tuple(want.shape)
    assert got.dtype.name == str(want.dtype).removeprefix("torch."), (got.dtype, want.dtype)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ---- deterministic functions, against torch ------------------------------------------------------------------------
@pytest.mark.parametrize("args", [(0, 3, 4), (-2.0, 2.0, 9), (1, 10, 10, 2), (0.5, -1.5, 5, 3.0), (2, 2, 1),
                                  (0, 1, 0), (-1, 1, 7, 0.5)])
def test_logspace(device, args):
    got = tl.logspace(*args, device=device)
    want = torch.logspace(*args)
    assert got.shape == tuple(want.shape) and got.dtype is tl.float32 and got.device == device
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
    if device != "wgsl":  # no float64 there
        np.testing.assert_allclose(tl.logspace(*args, dtype=tl.float64, device=device).numpy(),
                                   torch.logspace(*args, dtype=torch.float64), rtol=1e-13)


def test_empty(device):
    x = tl.empty(2, 3, device=device)
    assert x.shape == (2, 3) and x.dtype is tl.float32 and x.device == device
    assert tl.empty((4,), dtype=tl.int64).dtype is tl.int64
    y = tl.empty_like(x, dtype=tl.float16)
    assert y.shape == (2, 3) and y.dtype is tl.float16 and y.device == device
    assert tl.empty(3, requires_grad=True).requires_grad
    x.fill_(2.0)  # (float32: a float16 kernel needs shader-f16, which CI's OpenGL adapter lacks)
    assert x.numpy().tolist() == [[2.0] * 3] * 2


def test_bincount(device):
    x = [0, 1, 1, 3, 7, 3, 3]
    same(tl.tensor(x, device=device).bincount(), torch.tensor(x).bincount())
    same(tl.bincount(tl.tensor(x, device=device), minlength=10), torch.bincount(torch.tensor(x), minlength=10))
    same(tl.bincount(tl.tensor([], dtype=tl.int64, device=device)), torch.bincount(torch.tensor([], dtype=torch.long)))
    w = [0.5, 1.0, 2.0, -1.0, 3.0, 0.25, 4.0]
    same(tl.tensor(x, device=device).bincount(tl.tensor(w, device=device)), torch.tensor(x).bincount(torch.tensor(w)))
    if device != "wgsl":  # float64 results
        ints = [1, 2, 3, 4, 5, 6, 7]
        same(tl.tensor(x, device=device).bincount(tl.tensor(ints, device=device)),
             torch.tensor(x).bincount(torch.tensor(ints)))


def test_bincount_errors():
    with pytest.raises(RuntimeError, match="bincount only supports 1-d non-negative integral inputs"):
        tl.tensor([1, -1, 2]).bincount()
    with pytest.raises(RuntimeError, match="bincount only supports 1-d non-negative integral inputs"):
        tl.tensor([1.0, 2.0]).bincount()
    with pytest.raises(RuntimeError, match="bincount only supports 1-d"):
        tl.tensor([[1, 2]]).bincount()
    with pytest.raises(RuntimeError, match="same length"):
        tl.tensor([1, 2]).bincount(tl.tensor([1.0]))


@pytest.mark.parametrize("kwargs", [{}, {"bins": 7}, {"bins": 5, "min": -1, "max": 1},
                                    {"bins": 3, "min": 0.5, "max": 0.5},
                                    {"bins": 10, "min": -3, "max": 0}])
def test_histc(device, kwargs):
    values = np.random.default_rng(1).standard_normal(200).astype(np.float32)
    values[:3] = [-1.0, 1.0, 0.5]  # on the edges of a range above: min and max themselves are counted
    same(tl.tensor(values, device=device).histc(**kwargs), torch.tensor(values).histc(**kwargs))
    same(tl.histc(tl.tensor([2.0, 2.0], device=device), bins=4), torch.histc(torch.tensor([2.0, 2.0]), bins=4))


def test_histc_on_bin_edges_as_torch():
    """Values on and beside the bin edges land in torch's bins: its linear interpolation, in the input's type."""
    rng = np.random.default_rng(0)
    for it in range(200):
        bins = int(rng.integers(1, 40))
        lo = float(rng.integers(-5, 3)) + rng.random() * (it % 2)
        hi = lo + float(rng.integers(1, 6)) * rng.random()
        x = np.concatenate([rng.standard_normal(50) * 3, np.linspace(lo, hi, bins + 1)])
        if it % 5 == 0:
            x = np.round(x * 4) / 4
        for dtype in (np.float32, np.float64):
            same(tl.tensor(x.astype(dtype)).histc(bins, lo, hi), torch.tensor(x.astype(dtype)).histc(bins, lo, hi))


def test_searchsorted_and_bucketize(device):
    seq = torch.tensor([1.0, 3.0, 3.0, 5.0, 7.0, float("inf")])
    values = torch.tensor([[0.0, 3.0, 4.0], [7.0, 8.0, float("inf")]])
    s, v = tl.tensor(seq.numpy(), device=device), tl.tensor(values.numpy(), device=device)
    for kw in ({}, {"right": True}, {"side": "left"}, {"side": "right"}):
        same(tl.searchsorted(s, v, **kw), torch.searchsorted(seq, values, **kw))
        same(tl.bucketize(v, s, **({"right": kw.get("right", kw.get("side") == "right")})),
             torch.bucketize(values, seq, right=kw.get("right", kw.get("side") == "right")))
    rows = torch.tensor([[1, 2, 3, 4], [0, 10, 20, 30]])
    q = torch.tensor([[2, 5], [10, 35]])
    same(tl.searchsorted(tl.tensor(rows.numpy(), device=device), tl.tensor(q.numpy(), device=device), right=True),
         torch.searchsorted(rows, q, right=True))
    with pytest.raises(RuntimeError, match="side and right can't be set to opposites"):
        tl.searchsorted(s, v, right=True, side="left")
    with pytest.raises(RuntimeError, match="boundaries tensor should be 1 dimension"):
        tl.searchsorted(tl.tensor(rows.numpy()), tl.tensor([[1, 2, 3]] * 3))


def test_unique(device):
    x = torch.tensor([[3, 1, 2, 1], [2, 2, 9, 1], [3, 1, 2, 1]])
    t = tl.tensor(x.numpy(), device=device)
    same(t.unique(), x.unique())
    for inv in (False, True):
        for cnt in (False, True):
            same(tl.unique(t, return_inverse=inv, return_counts=cnt),
                 torch.unique(x, return_inverse=inv, return_counts=cnt))
            same(tl.unique(t, return_inverse=inv, return_counts=cnt, dim=0),
                 torch.unique(x, return_inverse=inv, return_counts=cnt, dim=0))
            same(t.unique(return_inverse=inv, return_counts=cnt, dim=1),
                 x.unique(return_inverse=inv, return_counts=cnt, dim=1))
    f = torch.tensor([0.5, -1.0, 0.5, 2.0])
    same(tl.tensor(f.numpy(), device=device).unique(return_counts=True), f.unique(return_counts=True))


def test_unique_consecutive(device):
    x = torch.tensor([1, 1, 2, 2, 3, 1, 1, 2])
    t = tl.tensor(x.numpy(), device=device)
    for inv in (False, True):
        for cnt in (False, True):
            same(tl.unique_consecutive(t, return_inverse=inv, return_counts=cnt),
                 torch.unique_consecutive(x, return_inverse=inv, return_counts=cnt))
    m = torch.tensor([[1, 1, 2], [1, 1, 2], [0, 1, 2], [1, 1, 2]])
    tm = tl.tensor(m.numpy(), device=device)
    same(tm.unique_consecutive(return_inverse=True, return_counts=True, dim=0),
         m.unique_consecutive(return_inverse=True, return_counts=True, dim=0))
    same(tm.unique_consecutive(return_counts=True, dim=1), m.unique_consecutive(return_counts=True, dim=1))
    same(tm.unique_consecutive(), m.unique_consecutive())


def test_isin(device):
    e, s = torch.tensor([[1, 2, 3], [4, 5, 6]]), torch.tensor([2, 6, 9])
    te, ts = tl.tensor(e.numpy(), device=device), tl.tensor(s.numpy(), device=device)
    same(tl.isin(te, ts), torch.isin(e, s))
    same(tl.isin(te, ts, invert=True), torch.isin(e, s, invert=True))
    same(tl.isin(te, 5), torch.isin(e, 5))


def test_equal(device):
    a = tl.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    assert tl.equal(a, a.clone()) and a.equal(tl.tensor([[1.0, 2.0], [3.0, 4.0]], device=device))
    assert not tl.equal(a, a + 1e-3)
    assert not tl.equal(a, a.reshape(4))  # another shape, the same values
    nan = tl.tensor([float("nan")], device=device)
    assert tl.equal(nan, nan) is torch.equal(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is False


EDGES = [0.0, 1.0, -1.0, 1e-9, 1.00001, 1e10, float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("equal_nan", [False, True])
@pytest.mark.parametrize("tol", [{}, {"rtol": 0.0, "atol": 0.0}, {"rtol": 1e-3, "atol": 1e-2}, {"rtol": 0.5}])
def test_isclose_edge_cases_as_torch(device, equal_nan, tol):
    """Every pair of EDGES: infinities close only to themselves, NaN only with equal_nan, and the tolerances."""
    a, b = np.meshgrid(np.array(EDGES, np.float32), np.array(EDGES, np.float32))
    want = torch.isclose(torch.tensor(a), torch.tensor(b), equal_nan=equal_nan, **tol)
    got = tl.isclose(tl.tensor(a, device=device), tl.tensor(b, device=device), equal_nan=equal_nan, **tol)
    same(got, want)
    for i in range(len(EDGES)):
        x, y = a[i:i + 1], b[i:i + 1]
        assert tl.tensor(x, device=device).allclose(tl.tensor(y, device=device), equal_nan=equal_nan, **tol) \
            == torch.allclose(torch.tensor(x), torch.tensor(y), equal_nan=equal_nan, **tol)


def test_isclose_integers_and_errors(device):
    a, b = torch.tensor([1, 2, 100]), torch.tensor([1, 3, 101])
    same(tl.isclose(tl.tensor(a.numpy(), device=device), tl.tensor(b.numpy(), device=device)), torch.isclose(a, b))
    same(tl.isclose(tl.tensor(a.numpy(), device=device), tl.tensor(b.numpy(), device=device), rtol=0.01, atol=0),
         torch.isclose(a, b, rtol=0.01, atol=0))
    with pytest.raises(RuntimeError, match="rtol must be greater than or equal to zero"):
        tl.tensor([1.0]).isclose(tl.tensor([1.0]), rtol=-1)
    assert tl.allclose(tl.tensor([1.0, float("inf")]), tl.tensor([1.0 + 1e-7, float("inf")]))
    assert not tl.allclose(tl.tensor([float("inf")]), tl.tensor([-float("inf")]))
    assert not tl.allclose(tl.tensor([1e30]), tl.tensor([float("inf")]))


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_finfo_as_torch(name):
    got, want = tl.finfo(getattr(tl, name)), torch.finfo(getattr(torch, name))
    for field in ("bits", "eps", "max", "min", "tiny", "smallest_normal", "resolution", "dtype"):
        assert getattr(got, field) == getattr(want, field), field
    assert tl.finfo().dtype == torch.finfo().dtype == "float32"


@pytest.mark.parametrize("name", ["uint8", "int8", "int64"])
def test_iinfo_as_torch(name):
    got, want = tl.iinfo(getattr(tl, name)), torch.iinfo(getattr(torch, name))
    for field in ("bits", "max", "min", "dtype"):
        assert getattr(got, field) == getattr(want, field), field
    with pytest.raises(TypeError, match="not an integer dtype"):
        tl.iinfo(tl.float32)
    with pytest.raises(TypeError, match="not a floating-point dtype"):
        tl.finfo(tl.int64)


def test_data_ptr_storage_offset_and_storage(device):
    """Views share their base's storage as torch's: a transpose has the same data_ptr, a slice base +
    offset·itemsize; the storage's bytes are the base's."""
    for dtype, tdtype in ((tl.float32, torch.float32), (tl.int64, torch.int64)):
        x = tl.tensor(np.arange(12).reshape(3, 4), dtype=dtype, device=device) * 2  # not realized yet
        r = torch.arange(12, dtype=tdtype).reshape(3, 4) * 2
        assert x.T.data_ptr() == x.data_ptr()  # the view first: the base is realized, the view over it
        for view in (lambda t: t[1:], lambda t: t[1:, 2:], lambda t: t[2], lambda t: t[:, 1], lambda t: t.T[1:]):
            v, w = view(x), view(r)
            assert v.storage_offset() == w.storage_offset()
            assert v.data_ptr() - x.data_ptr() == w.data_ptr() - r.data_ptr()
            assert v.untyped_storage().nbytes() == x.untyped_storage().nbytes()
        assert x.storage_offset() == 0 and x.element_size() == r.element_size()
        if device != "wgsl":  # a GPU buffer is padded to 16 bytes
            assert x.untyped_storage().nbytes() == r.untyped_storage().nbytes()
    a, b = tl.ones(4, device=device) * 2, tl.ones(4, device=device) * 3
    assert a.data_ptr() != b.data_ptr()


def test_no_function_forms_for_memory_methods():
    for name in ("data_ptr", "storage_offset", "untyped_storage", "element_size"):
        assert not hasattr(tl, name)
    assert callable(tl.bincount) and callable(tl.unique) and callable(tl.isin) and callable(tl.searchsorted)


# ---- multinomial ----------------------------------------------------------------------------------------------------
P = np.array([0.05, 0.1, 0.15, 0.3, 0.4])


def pair_probabilities(p):
    """P(first draw i, second draw j) without replacement: p_i · p_j / (1 - p_i), i != j."""
    out = p[:, None] * p[None, :] / (1 - p[:, None])
    np.fill_diagonal(out, 0)
    return out


def test_multinomial_without_replacement_first_and_pair_frequencies():
    """The first draw follows p, the ordered pair (first, second) follows p_i p_j / (1 - p_i): sequential draws
    without putting back, as torch's."""
    g = tl.Generator().manual_seed(1234)
    rows = 20000
    draws = tl.multinomial(tl.tensor(np.tile(P, (rows, 1))), 3, generator=g).numpy()
    assert draws.shape == (rows, 3) and draws.dtype == np.int64
    assert all(len(set(r)) == 3 for r in draws[:500])  # never the same category twice in a row
    assert chi2_pvalue(np.bincount(draws[:, 0], minlength=5), P) > ALPHA
    pairs = np.bincount(draws[:, 0] * 5 + draws[:, 1], minlength=25)
    assert chi2_pvalue(pairs, pair_probabilities(P).reshape(-1)) > ALPHA


def test_the_pair_check_catches_a_biased_sampler():
    """Drawing without replacement by keys U/p (uniform, not exponential) is a common mistake: its first draw is
    already off, and the check above rejects it by far."""
    rng = np.random.default_rng(1234)
    keys = rng.random((20000, 5)) / P
    draws = np.argsort(keys, -1)[:, :2]
    pairs = np.bincount(draws[:, 0] * 5 + draws[:, 1], minlength=25)
    assert chi2_pvalue(pairs, pair_probabilities(P).reshape(-1)) < 1e-12


def test_multinomial_with_replacement_and_zero_weights():
    g = tl.Generator().manual_seed(7)
    w = np.array([0.0, 2.0, 0.0, 1.0, 5.0])  # weights, not normalised
    draws = tl.multinomial(tl.tensor(w), 20000, replacement=True, generator=g).numpy()
    assert draws.shape == (20000,)
    assert chi2_pvalue(np.bincount(draws, minlength=5), w) > ALPHA  # zero-weight categories never drawn
    out = tl.multinomial(tl.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]), 2, generator=g).numpy()
    assert set(out[0]) == {1, 2}  # without replacement: both non-zero categories
    same(tl.tensor(out[1]), torch.multinomial(torch.tensor([1.0, 0.0, 0.0]), 2))  # then zero weights, as torch


def test_multinomial_errors_as_torch():
    with pytest.raises(RuntimeError, match=r"cannot sample n_sample > prob_dist.size\(-1\) samples without"):
        tl.multinomial(tl.tensor([0.5, 0.5]), 3)
    with pytest.raises(RuntimeError, match="probability tensor contains either `inf`, `nan` or element < 0"):
        tl.multinomial(tl.tensor([-0.5, 0.5]), 1)
    with pytest.raises(RuntimeError, match="probability tensor contains either `inf`, `nan` or element < 0"):
        tl.multinomial(tl.tensor([float("nan"), 0.5]), 1)
    with pytest.raises(RuntimeError, match="sum of probabilities <= 0"):
        tl.multinomial(tl.tensor([0.0, 0.0]), 1, replacement=True)
    with pytest.raises(RuntimeError, match="prob_dist must be 1 or 2 dim"):
        tl.multinomial(tl.ones(2, 2, 2), 1)
    with pytest.raises(RuntimeError, match="n_sample <= 0"):
        tl.multinomial(tl.ones(2), 0)
    assert tl.multinomial(tl.tensor([0.5, 0.5]), 3, replacement=True).shape == (3,)


def test_multinomial_seeding():
    probs = tl.tensor(np.tile(P, (4, 1)))
    tl.manual_seed(3)
    a = tl.multinomial(probs, 3).numpy()
    tl.manual_seed(3)
    np.testing.assert_array_equal(tl.multinomial(probs, 3).numpy(), a)
    g1, g2 = tl.Generator().manual_seed(5), tl.Generator().manual_seed(5)
    np.testing.assert_array_equal(tl.multinomial(probs, 2, generator=g1).numpy(),
                                  tl.multinomial(probs, 2, generator=g2).numpy())


# ---- in-place random fills ------------------------------------------------------------------------------------------
def ks_pvalue(samples, cdf):
    """Kolmogorov-Smirnov: P(D >= d) for n samples against a continuous CDF (Kolmogorov's asymptotic series)."""
    x = np.sort(np.asarray(samples, np.float64))
    n = len(x)
    f = cdf(x)
    d = max((np.arange(1, n + 1) / n - f).max(), (f - np.arange(n) / n).max())
    t = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    return float(min(1.0, max(0.0, 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * t * t) for k in range(1, 101)))))


def test_exponential_distribution():
    tl.manual_seed(11)
    for lambd in (1.0, 2.5):
        x = tl.empty(20000, dtype=tl.float64).exponential_(lambd).numpy()
        assert x.min() >= 0
        assert abs(x.mean() - 1 / lambd) < 4 / lambd / math.sqrt(len(x))
        assert ks_pvalue(x, lambda v: 1 - np.exp(-lambd * v)) > ALPHA
    assert ks_pvalue(x * 1.1, lambda v: 1 - np.exp(-2.5 * v)) < 1e-6  # the check sees a 10% scale error
    with pytest.raises(RuntimeError, match="exponential_ expects lambda > 0.0, but found lambda=0"):
        tl.empty(2).exponential_(0)


def test_uniform_and_normal_distributions():
    tl.manual_seed(12)
    u = tl.empty(20000, dtype=tl.float64).uniform_(-2, 3).numpy()
    assert u.min() >= -2 and u.max() < 3
    assert ks_pvalue(u, lambda v: (v + 2) / 5) > ALPHA
    n = tl.empty(20000, dtype=tl.float64).normal_(1.5, 0.5).numpy()
    assert ks_pvalue(n, lambda v: 0.5 * (1 + np.vectorize(math.erf)((v - 1.5) / (0.5 * math.sqrt(2))))) > ALPHA
    f16 = tl.empty(100, dtype=tl.float16).normal_()
    assert f16.dtype is tl.float16 and np.isfinite(f16.numpy()).all()
    with pytest.raises(RuntimeError, match="uniform_ expects to return a \\[from, to\\) range"):
        tl.empty(2).uniform_(2, 1)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0"):
        tl.empty(2).normal_(0, -1)


def test_bernoulli_geometric_and_random_distributions():
    tl.manual_seed(13)
    b = tl.empty(20000).bernoulli_(0.3).numpy()
    assert set(np.unique(b)) <= {0.0, 1.0}
    assert chi2_pvalue(np.bincount(b.astype(np.int64), minlength=2), [0.7, 0.3]) > ALPHA
    p = tl.tensor([0.0, 1.0, 0.5])
    rows = tl.empty(4000, 3).bernoulli_(p).numpy()
    assert (rows[:, 0] == 0).all() and (rows[:, 1] == 1).all() and 0.4 < rows[:, 2].mean() < 0.6
    g = tl.empty(20000, dtype=tl.int64).geometric_(0.25).numpy()
    assert g.min() >= 1
    k = np.arange(1, 16)
    expected = np.append(0.75 ** (k - 1) * 0.25, 0.75 ** 15)  # 1..15, then the tail
    assert chi2_pvalue(np.bincount(np.minimum(g, 16) - 1, minlength=16), expected) > ALPHA
    r = tl.empty(20000, dtype=tl.int64).random_(3, 9).numpy()
    assert chi2_pvalue(np.bincount(r - 3, minlength=6), np.ones(6)) > ALPHA
    assert set(np.unique(tl.empty(500).random_(4).numpy())) == {0.0, 1.0, 2.0, 3.0}
    assert (tl.empty(1000, dtype=tl.uint8).random_().numpy() <= 255).all()
    assert 0 <= tl.empty(1000).random_().numpy().max() <= 2 ** 24
    with pytest.raises(RuntimeError, match="bernoulli_ expects p to be in \\[0, 1\\], but got p=1.5"):
        tl.empty(2).bernoulli_(1.5)
    with pytest.raises(RuntimeError, match="geometric_ expects p to be in \\(0, 1\\)"):
        tl.empty(2).geometric_(0)
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to'"):
        tl.empty(2).random_(5, 5)


FILLS = [("exponential_", (2.0,)), ("uniform_", (-1, 1)), ("normal_", (0, 2)), ("bernoulli_", (0.4,)),
         ("geometric_", (0.3,)), ("random_", (0, 100))]


@pytest.mark.parametrize("name,args", FILLS)
def test_fills_are_seeded_by_manual_seed_and_generator(name, args):
    tl.manual_seed(21)
    a = getattr(tl.empty(50), name)(*args).numpy()
    tl.manual_seed(21)
    b = getattr(tl.empty(50), name)(*args).numpy()
    np.testing.assert_array_equal(a, b)
    c = getattr(tl.empty(50), name)(*args).numpy()
    assert not np.array_equal(a, c)  # the stream moved on
    tl.manual_seed(21)
    g = tl.Generator().manual_seed(99)
    d = getattr(tl.empty(50), name)(*args, generator=g).numpy()
    np.testing.assert_array_equal(getattr(tl.empty(50), name)(*args).numpy(), a)  # the default stream untouched
    g.manual_seed(99)
    np.testing.assert_array_equal(getattr(tl.empty(50), name)(*args, generator=g).numpy(), d)


def test_fill_returns_self_keeps_dtype_and_device(device):
    x = tl.zeros(3, 4, device=device)
    assert x.uniform_() is x and x.shape == (3, 4) and x.dtype is tl.float32 and x.device == device
    w = tl.zeros(5, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        w.normal_()
    with tl.no_grad():
        w.normal_()
    assert w.requires_grad and w.is_leaf and np.isfinite(w.numpy()).all()
