"""TransformerLens's hook points on tinyllm's GPT and Llama, held against transformer-lens itself: a HookedTransformer
with the same weights (tests/transformer_lens_reference.py) gives the same logits and the same cache, name by name,
and the same logits under zero-ablation and activation patching. Then what makes them graph edits: FlashAttention
still fires, nothing is left behind, and bad hooks are clear errors. Tolerance: 1e-5 (absolute and relative), float32
on both sides; bitwise equality across runtimes is tests/test_interp_hooks_runtimes.py's."""
import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig
from tinyllm.rewrite import tracing

from helpers import reference_runtime, spread_weights  # noqa: F401 (the fixture runs the module on numpy)
from transformer_lens_reference import hooked_gpt, hooked_llama

TOL = dict(rtol=1e-5, atol=1e-5)


def gpt(n_layer=2, seed=0):
    model = GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=16, block_size=16, vocab_size=13))
    spread_weights(model, seed)
    return model.eval()


def llama(seed=0):
    model = Llama(LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16))
    spread_weights(model, seed)
    return model.eval()


MODELS = {"gpt": (gpt, hooked_gpt), "llama": (llama, hooked_llama)}


def ids(b=2, t=7, seed=1, vocab=13):
    return np.random.default_rng(seed).integers(0, vocab, (b, t))


def reference(kind, model):
    return MODELS[kind][1](model)


@pytest.mark.parametrize("kind", MODELS)
def test_logits_and_every_cached_activation_equal_transformer_lens(kind):
    model = MODELS[kind][0]()
    x = ids()
    logits, cache = model.run_with_cache(tl.tensor(x))
    with torch.no_grad():
        ref_logits, ref_cache = reference(kind, model).run_with_cache(torch.tensor(x))
    np.testing.assert_allclose(logits.numpy(), ref_logits.numpy(), **TOL)
    # TransformerLens's unembed points are ours too; every name it caches, we cache, and the other way round
    assert set(cache) == set(ref_cache.keys()) == set(model.hook_names())
    for name in cache:
        ours, theirs = cache[name].numpy(), ref_cache[name].numpy()
        assert ours.shape == theirs.shape, name
        if name.endswith("hook_attn_scores"):  # masked entries: -inf in both
            np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(theirs), err_msg=name)
            ours, theirs = np.where(np.isneginf(ours), 0, ours), np.where(np.isneginf(theirs), 0, theirs)
        np.testing.assert_allclose(ours, theirs, err_msg=name, **TOL)


def zero_head(head):
    def ours(z, hook):
        keep = np.ones((1, 1, z.shape[2], 1), np.float32)
        keep[:, :, head] = 0
        return z * tl.tensor(keep)

    def theirs(z, hook):
        z[:, :, head] = 0
        return z
    return ours, theirs


@pytest.mark.parametrize("kind", MODELS)
def test_zero_ablating_one_head_equals_transformer_lens(kind):
    model = MODELS[kind][0]()
    x = ids()
    ours, theirs = zero_head(1)
    name = "blocks.1.attn.hook_z"
    plain = model.run_with_hooks(tl.tensor(x), []).numpy()
    ablated = model.run_with_hooks(tl.tensor(x), fwd_hooks=[(name, ours)]).numpy()
    with torch.no_grad():
        want = reference(kind, model).run_with_hooks(torch.tensor(x), fwd_hooks=[(name, theirs)]).numpy()
    np.testing.assert_allclose(ablated, want, **TOL)
    assert np.abs(ablated - plain).max() > 1e-3  # the ablation did change the logits


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("name", ["blocks.1.hook_resid_pre", "blocks.0.attn.hook_pattern", "blocks.0.ln2.hook_scale"])
def test_activation_patching_equals_transformer_lens(kind, name):
    """The clean run's activation at one position patched into the corrupted run, TransformerLens's recipe."""
    model, ref = MODELS[kind][0](), None
    clean, corrupt = ids(seed=1), ids(seed=2)
    pos = 3
    _, cache = model.run_with_cache(tl.tensor(clean), names_filter=[name])
    mask = np.zeros(cache[name].shape, bool)
    (mask[:, :, pos] if "pattern" in name else mask[:, pos]).fill(True)  # pattern: (B, H, query, key)

    def ours(act, hook):
        assert hook.name == name and hook.layer() == int(name.split(".")[1])
        return tl.where(tl.tensor(mask), cache[name], act)

    patched = model.run_with_hooks(tl.tensor(corrupt), fwd_hooks=[(name, ours)]).numpy()
    ref = reference(kind, model)
    with torch.no_grad():
        _, ref_cache = ref.run_with_cache(torch.tensor(clean), names_filter=[name])

        def theirs(act, hook):
            return torch.where(torch.tensor(mask), ref_cache[name], act)
        want = ref.run_with_hooks(torch.tensor(corrupt), fwd_hooks=[(name, theirs)]).numpy()
        corrupted = ref(torch.tensor(corrupt)).numpy()
    np.testing.assert_allclose(patched, want, **TOL)
    assert np.abs(want - corrupted).max() > 1e-4  # the patch mattered


def flash_firings(run):
    with tracing() as log:
        run()
    return sum(1 for f in log if f.pass_name == "flash")


def test_a_pattern_hook_keeps_flash_attention_in_the_other_layers():
    """Reading one layer's pattern adds it as an output beside the fused attention: FlashAttention fires in
    every layer. Replacing it leaves that layer's attention plain (the product with the new pattern) and every
    other layer fused."""
    model = gpt(n_layer=3)
    x = tl.tensor(ids())
    n = model.config.n_layer
    assert flash_firings(lambda: model.run_with_hooks(x, []).realize()) == n
    assert flash_firings(lambda: model.run_with_cache(x, names_filter=["blocks.1.attn.hook_pattern"])) == n
    uniform = lambda p, hook: p * 0 + (p > 0).float() / (p > 0).float().sum(-1, keepdim=True)  # noqa: E731
    assert flash_firings(lambda: model.run_with_hooks(x, [("blocks.1.attn.hook_pattern", uniform)]).realize()) == n - 1


def test_a_replaced_pattern_is_what_the_layer_attends_with():
    model = gpt()
    x = ids()
    name = "blocks.0.attn.hook_pattern"

    def ours(p, hook):
        return (p > 0).float() / (p > 0).float().sum(-1, keepdim=True)

    def theirs(p, hook):
        return (p > 0).float() / (p > 0).float().sum(-1, keepdim=True)
    got = model.run_with_hooks(tl.tensor(x), [(name, ours)]).numpy()
    with torch.no_grad():
        want = hooked_gpt(model).run_with_hooks(torch.tensor(x), fwd_hooks=[(name, theirs)]).numpy()
    np.testing.assert_allclose(got, want, **TOL)


def test_hooks_leave_no_trace_on_the_next_forward_backward_and_jit_replay():
    model = gpt()
    x, y = tl.tensor(ids(seed=3)), tl.tensor(ids(seed=4))
    step = tl.jit(lambda a: model.run_with_hooks(a, []) * 1.0)

    def loss_and_grads():
        for p in model.parameters():
            p.grad = None
        logits, loss = model(x, y)
        loss.backward()
        return logits.numpy(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

    logits0, grads0 = loss_and_grads()
    replay0 = [step(x).numpy() for _ in range(3)][-1]
    ablate, _ = zero_head(0)
    model.run_with_hooks(x, [("blocks.0.attn.hook_z", ablate), ("blocks.1.hook_resid_pre", lambda a, h: a * 0)])
    model.run_with_cache(x)
    logits1, grads1 = loss_and_grads()
    np.testing.assert_array_equal(logits1, logits0)
    for n in grads0:
        np.testing.assert_array_equal(grads1[n], grads0[n], err_msg=n)
    np.testing.assert_array_equal(step(x).numpy(), replay0)


def test_each_hook_runs_once_per_forward_in_order_and_sees_the_names():
    model = gpt()
    seen = []
    names = ["blocks.1.hook_resid_post", "hook_embed", "blocks.0.mlp.hook_post"]
    model.run_with_hooks(tl.tensor(ids()), [(n, lambda a, hook: seen.append(hook.name)) for n in names])
    assert seen == ["hook_embed", "blocks.0.mlp.hook_post", "blocks.1.hook_resid_post"]  # forward order, once each
    seen.clear()
    model.run_with_hooks(tl.tensor(ids()), [(lambda n: n.endswith("hook_scale"), lambda a, h: seen.append(h.name))])
    assert seen == ["blocks.0.ln1.hook_scale", "blocks.0.ln2.hook_scale", "blocks.1.ln1.hook_scale",
                    "blocks.1.ln2.hook_scale", "ln_final.hook_scale"]


def test_names_filter_forms_and_short_cache_keys():
    model = gpt()
    x = tl.tensor(ids())
    _, by_list = model.run_with_cache(x, names_filter=["blocks.0.attn.hook_pattern", "hook_embed"])
    _, by_fn = model.run_with_cache(x, names_filter=lambda n: n.endswith("hook_pattern"))
    _, by_str = model.run_with_cache(x, names_filter="blocks.1.hook_resid_mid")
    assert list(by_list) == ["hook_embed", "blocks.0.attn.hook_pattern"]  # the order the points fire
    assert list(by_fn) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    assert list(by_str) == ["blocks.1.hook_resid_mid"]
    np.testing.assert_array_equal(by_fn["pattern", 1].numpy(), by_fn["blocks.1.attn.hook_pattern"].numpy())
    _, every = model.run_with_cache(x)
    assert every["scale", 0, "ln2"] is every["blocks.0.ln2.hook_scale"]
    assert every["resid_pre", 1] is every["blocks.1.hook_resid_pre"]
    with pytest.raises(KeyError, match="names nothing"):
        every["resid_pre", 5]


def test_the_hooks_context_acts_on_plain_forwards_and_ends_with_it():
    model = gpt()
    x, y = tl.tensor(ids(seed=3)), tl.tensor(ids(seed=4))
    _, before = model(x, y)
    with model.hooks([("blocks.0.hook_resid_post", lambda a, h: a * 0)]):
        _, inside = model(x, y)
    _, after = model(x, y)
    assert inside.item() != before.item() and after.item() == before.item()


# ---- bad input ----
def test_an_unknown_name_lists_the_close_ones():
    model = gpt()
    x = tl.tensor(ids())
    with pytest.raises(ValueError, match=r"no hook point 'blocks\.0\.hook_resd_pre'.*close: blocks\.0\.hook_resid_pre"):
        model.run_with_hooks(x, [("blocks.0.hook_resd_pre", lambda a, h: None)])
    with pytest.raises(ValueError, match=r"run_with_cache: GPT has no hook point 'blocks\.0\.attn\.hook_rot_q'"):
        model.run_with_cache(x, names_filter=["blocks.0.attn.hook_rot_q"])  # a Llama's point, not a GPT's


def test_a_layer_out_of_range_is_named():
    with pytest.raises(ValueError, match=r"layer 7 is out of range: GPT has 2 layers \(blocks\.0 to blocks\.1\)"):
        gpt().run_with_cache(tl.tensor(ids()), names_filter=["blocks.7.hook_resid_pre"])


@pytest.mark.parametrize("bad, error, message", [
    (lambda a, h: a[:, :-1], ValueError, r"hook function at blocks\.0\.hook_resid_mid returned shape \(2, 6, 16\), "
                                         r"but the activation has shape \(2, 7, 16\)"),
    (lambda a, h: a.double(), TypeError, r"returned float64, but the activation is float32"),
    (lambda a, h: a.numpy(), TypeError, r"returned a ndarray: return a tinyllm Tensor"),
])
def test_a_hook_returning_the_wrong_thing_is_named(bad, error, message):
    with pytest.raises(error, match=message):
        gpt().run_with_hooks(tl.tensor(ids()), [("blocks.0.hook_resid_mid", bad)])


def test_a_hook_that_is_not_callable_or_not_a_pair_is_named():
    with pytest.raises(TypeError, match=r"the hook for 'hook_embed' must be a function"):
        gpt().run_with_hooks(tl.tensor(ids()), [("hook_embed", 3)])
    with pytest.raises(TypeError, match=r"fwd_hooks must be a list of \(name, fn\) pairs"):
        gpt().run_with_hooks(tl.tensor(ids()), ["hook_embed"])
