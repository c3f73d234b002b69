"""A read-only hook is a graph edit that leaves the logits' graph alone: on every runtime (numpy, c, wgsl) the logits
of a forward that caches every activation, or runs hook functions that return None, are bitwise those of the
unhooked forward, for GPT and Llama."""
import numpy as np
import pytest

import tinyllm as tl
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig

from helpers import spread_weights

pytestmark = pytest.mark.usefixtures("each_runtime")  # on numpy, c and wgsl (conftest.py)

MODELS = {
    "gpt": lambda: GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=13)),
    "llama": lambda: Llama(LlamaConfig(vocab_size=13, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)),
}


@pytest.mark.parametrize("kind", MODELS)
def test_read_only_hooks_leave_the_logits_bitwise_equal(kind, each_runtime):
    model = MODELS[kind]()
    spread_weights(model, 0)
    model.eval()
    x = tl.tensor(np.random.default_rng(1).integers(0, 13, (2, 9)))
    plain = model.run_with_hooks(x, []).numpy()
    own, _ = model(x, x)  # the model's own forward, at every position (GPT's without targets reads the last one)
    np.testing.assert_array_equal(own.numpy(), plain)
    logits, cache = model.run_with_cache(x)
    assert len(cache) == len(model.hook_names())
    np.testing.assert_array_equal(logits.numpy(), plain)
    seen = []
    watched = model.run_with_hooks(x, [(lambda n: True, lambda a, hook: seen.append(hook.name))])
    np.testing.assert_array_equal(watched.numpy(), plain)
    assert seen == list(cache)
