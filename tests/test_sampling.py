"""tinyllm.sampling: sampled frequencies fit the exact filtered distribution (Pearson's chi-squared, with a check
that the statistic does reject a wrong one), the filters equal Hugging Face's warpers written in torch, greedy,
seeds, the support, argument errors; speculative sampling emits the target's own law; tinyllm.Generator; and
no_grad as a decorator."""
import inspect
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, strategies as st

import tinyllm as tl
from tinyllm import factory
from tinyllm.sampling import probs, sample, speculative_accept

from helpers import chi2_pvalue


# ---- references ------------------------------------------------------------------------------------------------
def hf_reference(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The filtered distribution of one row (V,), step by step as Hugging Face's Temperature, TopK, TopP and MinP
    warpers do it, in torch float64 (with a stable sort, so ties are broken one known way)."""
    s = torch.tensor(np.asarray(logits, np.float64))
    if temperature == 0:
        return torch.nn.functional.one_hot(s.argmax(), s.numel()).double().numpy()
    s = s / temperature
    if top_k is not None:
        kth = torch.topk(s, min(top_k, s.numel())).values[-1]
        s = s.masked_fill(s < kth, -math.inf)
    if top_p is not None and top_p < 1:
        ascending, order = torch.sort(s, stable=True)
        remove = ascending.softmax(-1).cumsum(-1) <= 1 - top_p
        remove[-1] = False  # min_tokens_to_keep=1
        s = s.masked_fill(remove.scatter(0, order, remove), -math.inf)
    if min_p is not None:
        p = s.softmax(-1)
        s = s.masked_fill(p < min_p * p.max(), -math.inf)
    return s.softmax(-1).numpy()


LOGITS = np.random.default_rng(20).normal(0.0, 1.0, (2, 12))  # two rows, 12 tokens: no near-ties at any edge
DRAWS = 10_000  # per row: 20k draws per case


def draw_counts(logits, n=DRAWS, seed=0, **kw):
    """Token counts per row of `logits` (R, V) over n draws of each row, all in one sample() call."""
    R, V = logits.shape
    x = tl.tensor(np.repeat(logits, n, axis=0), dtype=tl.float64, device="numpy")
    tokens = sample(x, generator=tl.Generator().manual_seed(seed), **kw).numpy().reshape(R, n)
    return np.stack([np.bincount(t, minlength=V) for t in tokens])


CASES = [dict(), dict(temperature=0.5), dict(temperature=2.0), dict(top_k=4), dict(top_p=0.7), dict(min_p=0.2),
         dict(temperature=0.7, top_k=6, top_p=0.8), dict(top_p=0.9, min_p=0.15),
         dict(temperature=1.5, top_k=8, top_p=0.85, min_p=0.1)]


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "plain")
def test_frequencies_fit_the_filtered_distribution(kw):
    counts = draw_counts(LOGITS, **kw)
    for row, c in zip(LOGITS, counts):
        expected = hf_reference(row, **kw)
        assert 0 < (expected > 0).sum() <= 12
        assert chi2_pvalue(c, expected) > 1e-4, (kw, c, expected * DRAWS)


def test_chi2_rejects_a_wrong_distribution():
    """The statistic has power: the same draws are far from a distribution they do not follow."""
    counts = draw_counts(LOGITS[:1], top_p=0.7)[0]
    assert chi2_pvalue(counts, hf_reference(LOGITS[0], top_p=0.7)) > 1e-4
    assert chi2_pvalue(counts, hf_reference(LOGITS[0])) < 1e-6  # against the unfiltered distribution
    plain = draw_counts(LOGITS[:1])[0]  # a 10 % change of temperature is seen too
    assert chi2_pvalue(plain, hf_reference(LOGITS[0])) > 1e-4
    assert chi2_pvalue(plain, hf_reference(LOGITS[0], temperature=1.1)) < 1e-6


finite = st.floats(-30, 30, allow_nan=False, width=64)


@given(logits=st.lists(finite, min_size=1, max_size=24), temperature=st.sampled_from([0, 0.3, 1.0, 2.5]),
       top_k=st.one_of(st.none(), st.integers(1, 30)), top_p=st.one_of(st.none(), st.floats(0.01, 1.0)),
       min_p=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_probs_equal_hugging_face_warpers(logits, temperature, top_k, top_p, min_p):
    x = np.array(logits)
    if top_p is not None and temperature:  # no cumulative mass within rounding of top-p's edge
        s = x / temperature
        if top_k is not None:
            s = s[s >= np.sort(s)[-min(top_k, len(s))]]
        c = np.cumsum(np.sort(np.exp(s - s.max())))
        assume(np.abs(c / c[-1] - (1 - top_p)).min() > 1e-9)
    if min_p is not None and temperature:  # no probability within rounding of min-p's edge
        assume(np.abs(np.exp((x - x.max()) / temperature) - min_p).min() > 1e-9)
    ours = probs(x[None], temperature, top_k, top_p, min_p)[0]
    np.testing.assert_allclose(ours, hf_reference(x, temperature, top_k, top_p, min_p), rtol=1e-9, atol=1e-12)


# ---- greedy, seeds, support --------------------------------------------------------------------------------------
@given(rows=st.integers(1, 4), v=st.integers(2, 40), seed=st.integers(0, 2 ** 32 - 1),
       kw=st.sampled_from([{}, dict(top_k=3), dict(top_p=0.5, min_p=0.3)]))
def test_temperature_zero_is_argmax(rows, v, seed, kw):
    x = np.random.default_rng(seed).normal(size=(rows, v)).astype(np.float32)
    x[0, -1] = -np.inf
    got = sample(tl.tensor(x, device="numpy"), temperature=0, **kw)
    assert got.shape == (rows, 1) and got.dtype is tl.int64
    np.testing.assert_array_equal(got.numpy()[:, 0], torch.tensor(x).argmax(-1).numpy())


@pytest.mark.parametrize("device", ["numpy", "c"])
def test_result_is_an_int64_column_on_the_logits_device(device):
    x = tl.tensor(LOGITS, device=device)
    got = sample(x, top_k=5)
    assert got.shape == (2, 1) and got.dtype is tl.int64 and got.device == x.device


def test_same_seed_same_tokens():
    x = tl.tensor(np.repeat(LOGITS, 200, axis=0), device="numpy")
    kw = dict(temperature=0.8, top_k=7, top_p=0.9)
    a = sample(x, generator=tl.Generator().manual_seed(7), **kw).numpy()
    b = sample(x, generator=tl.Generator().manual_seed(7), **kw).numpy()
    c = sample(x, generator=tl.Generator().manual_seed(8), **kw).numpy()
    np.testing.assert_array_equal(a, b)
    assert (a != c).any()
    tl.manual_seed(7)
    d = sample(x, **kw).numpy()
    tl.manual_seed(7)
    np.testing.assert_array_equal(sample(x, **kw).numpy(), d)
    np.testing.assert_array_equal(d, a)  # the default generator seeded with 7 is Generator().manual_seed(7)
    g = tl.Generator().manual_seed(3)
    state = g.get_state()
    e = sample(x, generator=g).numpy()
    np.testing.assert_array_equal(sample(x, generator=g.set_state(state)).numpy(), e)


def test_never_outside_the_support():
    rng = np.random.default_rng(5)
    x = rng.normal(0.0, 2.0, (4, 30))
    x[:, ::3] = -np.inf  # never drawn, whatever the filter
    big = tl.tensor(np.repeat(x, 500, axis=0), device="numpy")
    for kw in [{}, dict(top_k=3), dict(top_k=40), dict(top_p=0.5), dict(min_p=0.3), dict(temperature=3.0, top_p=0.6),
               dict(top_k=5, top_p=0.8, min_p=0.2)]:
        tokens = sample(big, generator=tl.Generator().manual_seed(1), **kw).numpy().reshape(4, 500)
        for row, t in zip(x, tokens):
            support = np.flatnonzero(hf_reference(row, **kw) > 0)
            assert np.isin(t, support).all(), (kw, set(t) - set(support))


def test_tiny_top_p_keeps_the_top_token():
    x = tl.tensor(np.repeat(LOGITS, 300, axis=0), device="numpy")
    for kw in [dict(top_p=1e-9), dict(top_p=1e-9, top_k=3), dict(min_p=1.0), dict(top_k=1)]:
        tokens = sample(x, **kw).numpy().reshape(2, 300)
        for row, t in zip(LOGITS, tokens):
            assert (t == row.argmax()).all(), kw


def test_top_k_keeps_ties_as_hugging_face():
    x = np.array([[1.0, 3.0, 2.0, 3.0, 2.0, 0.0]])
    np.testing.assert_allclose(probs(x, top_k=1), hf_reference(x[0], top_k=1)[None])  # both 3.0s
    np.testing.assert_allclose(probs(x, top_k=3), hf_reference(x[0], top_k=3)[None])  # 3, 3, 2, 2
    assert (probs(x, top_k=3) > 0).sum() == 4


@pytest.mark.parametrize("layout", ["random", "ties", "sorted", "half -inf"])
@pytest.mark.parametrize("k", [1, 7, 50, 700])
def test_top_k_on_a_large_vocabulary(layout, k):
    """A 50257 row takes the strided-threshold path of top-k (tinyllm/sampling.py, _top_k); it keeps what HF keeps."""
    rng = np.random.default_rng(k)
    x = rng.normal(0.0, 3.0, 50257)
    if layout == "ties":
        x = np.round(x)
    elif layout == "sorted":
        x = np.sort(x)
    elif layout == "half -inf":
        x[rng.random(x.size) < 0.5] = -np.inf
    np.testing.assert_allclose(probs(x, top_k=k), hf_reference(x, top_k=k), rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("kw", [dict(top_p=0.9), dict(top_p=0.3, min_p=0.01), dict(temperature=0.5, top_p=0.95)])
def test_top_p_on_a_large_vocabulary(kw):
    """Only the tokens that can be in the nucleus are sorted (a threshold lowered until they hold top_p)."""
    x = np.random.default_rng(1).normal(0.0, 2.0, 50257)
    np.testing.assert_allclose(probs(x, **kw), hf_reference(x, **kw), rtol=1e-9, atol=1e-15)


def test_bad_arguments_say_what_is_wrong():
    x = tl.tensor(LOGITS, device="numpy")
    for kw, fragment in [(dict(top_k=0), "top_k"), (dict(top_k=-2), "top_k"), (dict(top_k=2.5), "top_k"),
                         (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(top_p=-0.1), "top_p"),
                         (dict(min_p=-0.1), "min_p"), (dict(min_p=1.01), "min_p"),
                         (dict(temperature=-1), "temperature"), (dict(temperature=math.nan), "temperature"),
                         (dict(temperature=math.inf), "temperature")]:
        with pytest.raises(ValueError, match=fr"sample: {fragment}"):
            sample(x, **kw)
    for bad, fragment in [(math.nan, "NaN"), (math.inf, r"\+inf")]:
        y = LOGITS.copy()
        y[1, 3] = bad
        with pytest.raises(ValueError, match=fr"sample: logits row 1 contains {fragment}"):
            sample(tl.tensor(y, device="numpy"))
    with pytest.raises(ValueError, match="sample: logits row 0 contains only -inf"):
        sample(np.full((1, 4), -np.inf))
    for shape in [(12,), (2, 3, 4), (2, 0)]:
        with pytest.raises(ValueError, match=fr"sample: expected logits of shape \(B, V\).*{shape}"):
            sample(np.zeros(shape))
    with pytest.raises(TypeError, match="generator"):
        sample(x, generator=3)


# ---- speculative sampling ------------------------------------------------------------------------------------------
V = 4
P_POS = probs(np.random.default_rng(11).normal(0, 1.0, (4, V)))  # the target at positions 0..3 (context-free)
Q_POS = probs(np.random.default_rng(12).normal(0, 1.0, (4, V)))  # the draft, unlike it


def speculate(rows, pos, k, rng):
    """One speculative step for `rows` rows at position pos: draft k tokens from Q_POS, verify against P_POS."""
    q = np.broadcast_to(Q_POS[pos:pos + k], (rows, k, V))
    p = np.broadcast_to(P_POS[pos:pos + k + 1], (rows, k + 1, V))
    draft = np.stack([rng.choice(V, size=rows, p=Q_POS[pos + i]) for i in range(k)], axis=1)
    return speculative_accept(p, q, draft, generator=rng)


def test_speculative_emits_the_targets_joint_law():
    """Two tokens made by speculative steps (k=2; a second step where the first rejected at once) follow
    P_POS[0] ⊗ P_POS[1], the target's own law, and not the draft's."""
    rng, n = np.random.default_rng(0), 20_000
    accepted, tokens = speculate(n, 0, 2, rng)
    assert ((0 <= accepted) & (accepted <= 2)).all() and (tokens[np.arange(n), accepted] >= 0).all()
    assert (tokens[accepted < 2, 2] == -1).all()
    assert 0 < (accepted == 0).mean() < 1 and (accepted == 2).any()
    first, second = tokens[:, 0], tokens[:, 1].copy()
    again = accepted == 0
    _, more = speculate(int(again.sum()), 1, 2, rng)
    second[again] = more[:, 0]
    assert chi2_pvalue(np.bincount(first, minlength=V), P_POS[0]) > 1e-4
    assert chi2_pvalue(np.bincount(first, minlength=V), Q_POS[0]) < 1e-6  # power: the draft's law is rejected
    joint = np.bincount(first * V + second, minlength=V * V)
    assert chi2_pvalue(joint, np.outer(P_POS[0], P_POS[1]).ravel()) > 1e-4
    kept = accepted >= 1  # given the first draft was accepted, the second token still follows the target
    assert chi2_pvalue(np.bincount(tokens[kept, 1], minlength=V), P_POS[1]) > 1e-4


def test_speculative_accepts_everything_when_draft_is_target():
    rng, n = np.random.default_rng(1), 5000
    p = np.broadcast_to(P_POS[:3], (n, 3, V))
    draft = np.stack([rng.choice(V, size=n, p=P_POS[i]) for i in range(2)], axis=1)
    accepted, tokens = speculative_accept(p, p[:, :2], draft, generator=tl.Generator().manual_seed(0))
    assert (accepted == 2).all()
    np.testing.assert_array_equal(tokens[:, :2], draft)
    assert chi2_pvalue(np.bincount(tokens[:, 2], minlength=V), P_POS[2]) > 1e-4  # the bonus token


def test_speculative_rejects_a_token_the_target_never_makes():
    n = 4000
    p = np.broadcast_to(np.array([[0.5, 0.0, 0.3, 0.2]] * 2), (n, 2, V))
    q = np.zeros((n, 1, V))
    q[:, 0, 1] = 1.0
    accepted, tokens = speculative_accept(p, q, np.ones((n, 1), np.int64), generator=tl.Generator().manual_seed(2))
    assert (accepted == 0).all() and (tokens[:, 1] == -1).all()
    assert chi2_pvalue(np.bincount(tokens[:, 0], minlength=V), p[0, 0]) > 1e-4  # max(0, p − q) ∝ p here


def test_speculative_greedy_is_the_targets_greedy():
    """With temperature 0 both distributions are one-hot: a draft is kept iff it is the target's argmax."""
    rng = np.random.default_rng(3)
    target, drafted = rng.normal(size=(8, 4, 6)), rng.normal(size=(8, 3, 6))
    p, q = probs(target, temperature=0), probs(drafted, temperature=0)
    accepted, tokens = speculative_accept(p, q, drafted.argmax(-1))
    for b in range(8):
        want = target[b].argmax(-1)
        agree = np.cumprod(drafted[b].argmax(-1) == want[:3]).sum()
        assert accepted[b] == agree
        np.testing.assert_array_equal(tokens[b, :agree + 1], want[:agree + 1])


def test_speculative_shape_errors():
    with pytest.raises(ValueError, match=r"speculative_accept: expected p \(B, k\+1, V\)"):
        speculative_accept(np.ones((1, 2, 4)) / 4, np.ones((1, 2, 4)) / 4, np.zeros((1, 2), np.int64))
    with pytest.raises(ValueError, match=r"speculative_accept: draft_tokens must be integers in \[0, 4\)"):
        speculative_accept(np.ones((1, 2, 4)) / 4, np.ones((1, 1, 4)) / 4, np.full((1, 1), 4))


# ---- Generator ------------------------------------------------------------------------------------------------------
def test_generator_follows_torch_names_and_numpy_streams():
    g = tl.Generator()
    assert g.manual_seed(5) is g and g.initial_seed() == 5
    np.testing.assert_array_equal(g._np.random(4), np.random.default_rng(5).random(4))  # seeds keep their streams
    s = g.seed()
    assert g.initial_seed() == s
    a = tl.randn(3, generator=g).numpy()
    np.testing.assert_array_equal(tl.randn(3, generator=tl.Generator().manual_seed(s)).numpy(), a)
    assert tl.Generator().manual_seed(-1).initial_seed() == 2 ** 64 - 1  # as torch
    with pytest.raises(TypeError, match="manual_seed"):
        g.manual_seed(1.5)
    with pytest.raises(ValueError, match="set_state"):
        g.set_state({"nope": 1})


def test_default_generator_is_what_factory_exposes():
    g = tl.manual_seed(9)
    assert g is factory.default_generator and isinstance(g, tl.Generator) and g.initial_seed() == 9
    assert factory.generator() is g._np
    state = factory.generator().bit_generator.state  # what examples/gpt.py checkpoints and restores
    a = tl.rand(4).numpy()
    factory.generator().bit_generator.state = state
    np.testing.assert_array_equal(tl.rand(4).numpy(), a)


def test_generator_argument_leaves_the_default_stream_alone():
    tl.manual_seed(0)
    expected = tl.randn(5).numpy()
    tl.manual_seed(0)
    g = tl.Generator().manual_seed(1)
    drawn = [tl.randn(2, generator=g), tl.rand(2, generator=g), tl.randint(0, 9, (3,), generator=g),
             tl.multinomial(tl.tensor([[0.2, 0.8]]), 3, replacement=True, generator=g)]
    np.testing.assert_array_equal(tl.randn(5).numpy(), expected)
    g.manual_seed(1)
    again = [tl.randn(2, generator=g), tl.rand(2, generator=g), tl.randint(0, 9, (3,), generator=g),
             tl.multinomial(tl.tensor([[0.2, 0.8]]), 3, replacement=True, generator=g)]
    for a, b in zip(drawn, again):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


# ---- no_grad as a decorator -------------------------------------------------------------------------------------
def test_no_grad_decorator_keeps_name_doc_and_signature():
    def step(x, scale=2.0, *, bias=None):
        """Scale x."""
        assert not tl.is_grad_enabled()
        return x * scale

    wrapped = tl.no_grad()(step)
    assert wrapped.__name__ == "step" and wrapped.__doc__ == "Scale x." and wrapped.__wrapped__ is step
    assert inspect.signature(wrapped) == inspect.signature(step)
    y = wrapped(tl.tensor([1.0], requires_grad=True))
    assert not y.requires_grad and tl.is_grad_enabled()
