"""Text generation for the decoder-only models (GPT, Llama): `generate` with a key/value cache, Hugging Face's samplers
and speculative decoding, shared through GenerationMixin (docs/architecture.md, "Generating").

What a model supplies, and nothing else:
    config.vocab_size                 the tokens
    max_positions_field               the config's field of the longest context, max_positions (GPT's block_size,
                                      Llama's max_position_embeddings)
    get_input_embeddings()            the token embedding (the caches are made in its dtype, then hold the keys
                                      and values in the dtype the model computes them in)
    lm_head                           hidden states to logits
    _features(idx, cache=None)        the final norm's output at every position of idx (B, T); with `cache` (a
                                      list) each layer's keys and values (B, H_kv, T, hs) are appended to it
    _decode_features(toks, pos, caches)   the same for toks (B, T) at positions pos…pos+T-1 against the caches
                                      (through attend_cached), and each layer's new cache rows [k, v, k, v, …]
    _cache_shapes(batch)              each layer's keys (B, H_kv, max_positions, hs + 1) and values
                                      (B, H_kv, max_positions, hs), [k, v, k, v, …]
"""
import math

import numpy as np

from .. import factory
from ..nn import lora
from ..sampling import check_options, sample
from ..tensor import Tensor, no_grad
from ..utils.checks import whole_number

from .kv_cache import MIN_SLOTS, Decoder  # noqa: F401 (MIN_SLOTS: the caches' first size, named here too)


class GenerationMixin:
    """generate() for a model that has the hooks listed in this module's docstring."""

    @no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, *, top_p=None, min_p=None, generator=None,
                 use_cache=True, draft_model=None, num_speculative_tokens=4, stream=False, stats=None, grammar=None):
        """Extend idx (B, T) by max_new_tokens tokens, each sampled from the model's next-token distribution given
        the last max_positions tokens (nanoGPT's crop) and fed back in. Returns the (B, T + max_new_tokens) int64
        tensor; with stream=True, an iterator that yields each step's new tokens as a (B, 1) int64 tensor as soon
        as they are sampled (the same tokens, under the same seed, as stream=False).

        Sampling: tinyllm.sampling.sample with these arguments: temperature=0 is argmax (greedy); top_k, top_p and
        min_p filter as Hugging Face does; `generator` (tinyllm.Generator) makes the draws reproducible.

        use_cache=True (the default): one batched forward over the prompt fills a per-layer key/value cache of
        max_positions slots, then each token is one position's forward against it, replayed by tinyllm.jit from the
        fourth token on. Past max_positions each step recomputes the whole window exactly, as nanoGPT does;
        use_cache=False does that on every step. Batched prompts are of equal length, as idx is one tensor.

        draft_model (a smaller model on the same tokens): speculative decoding, one sequence (B = 1; any B with a
        grammar, row by row). The draft proposes num_speculative_tokens tokens per round and this model verifies
        them in one forward; the tokens follow this model's own distribution exactly, faster when the draft is much
        cheaper than this model and guesses well (a high acceptance rate).

        grammar (tinyllm.grammar.compile's, for this model's tokenizer): every row's continuation is a string of the
        grammar's language followed by end of text, rows that end early padded with end of text; the mask is applied
        to the logits before temperature, top-k and top-p, so each token is drawn from the model's distribution
        renormalised over the tokens the grammar allows. With a draft model the draft proposes from its own masked
        distribution and the target verifies against its masked one, position by position under the same masks, so
        the output follows the target's constrained distribution exactly; rows (B >= 1 with a grammar) are decoded
        one after another, each with its own matcher, and a row stops running the models once it has ended.
        A choice grammar (compile(..., choice=[...])) is sampled whole instead (_choice_steps): each option is
        scored as p(its tokens, then end of text | prompt) in one batched forward, and one option is drawn per row
        from those scores (temperature, top_k, top_p and min_p apply to the options' distribution); token-by-token
        masking would favour options whose first tokens are likely. Every option's tokens and end of text must fit
        in max_new_tokens. A draft model is not used for it.

        stats (a dict, optional) is cleared and filled in place as the tokens are generated: "emitted", the new
        tokens so far, and with a draft model its acceptance counts, named as vLLM's speculative-decoding metrics
        name them: "rounds" (verifications), "proposed" (draft tokens proposed), "accepted" (of them, accepted) and
        "draft_acceptance_rate" = accepted / proposed (nan until a draft is proposed). With a draft model the same
        dict is also self.speculative_stats (a new one per call when stats is not given)."""
        name = f"{type(self).__name__}.generate"
        self._check_ids(idx, name)
        whole_number(name, "max_new_tokens", max_new_tokens)
        check_options(name, temperature, top_k, top_p, min_p)
        factory.numpy_generator(generator)  # (its TypeError now, not at the first token)
        if draft_model is not None:
            self._check_draft(draft_model, idx, num_speculative_tokens, name, grammar)
        if grammar is not None and grammar.n_vocab > self.config.vocab_size:
            raise ValueError(f"{name}: the grammar's tokenizer has {grammar.n_vocab} tokens, more than the model's "
                             f"vocab_size {self.config.vocab_size}: compile it for this model's tokenizer")
        ids = idx.numpy()
        vocab = self.config.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = ids.min() if ids.min() < 0 else ids.max()
            raise IndexError(f"{name}: token id {int(bad)} is out of range for the vocabulary of "
                             f"{vocab} tokens (ids are 0..{vocab - 1})")
        if stats is None:
            stats = {}
        elif not isinstance(stats, dict):
            raise TypeError(f"{name}: stats must be a dict to fill in (or None), got "
                            f"{type(stats).__name__}")
        stats.clear()
        stats["emitted"] = 0
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        if draft_model is not None:
            stats.update(rounds=0, proposed=0, accepted=0, draft_acceptance_rate=math.nan)
            self.speculative_stats = stats
        if grammar is not None and grammar.choices is not None and max_new_tokens > 0:
            options = self._choice_tokens(grammar, max_new_tokens, name)  # (its errors now, not when streamed)
            steps = self._choice_steps(idx, options, max_new_tokens, grammar.eot, sampling, generator, stats)
        elif draft_model is None:
            steps = self._generate_steps(idx, max_new_tokens, sampling, generator, use_cache, stats, grammar)
        elif grammar is not None:
            steps = self._grammar_speculative_steps(draft_model, idx, max_new_tokens, num_speculative_tokens,
                                                    sampling, generator, stats, grammar)
        else:
            steps = self._speculative_steps(draft_model, idx, max_new_tokens, num_speculative_tokens, sampling,
                                            generator, stats)
        if stream:
            return steps
        ids = idx.numpy()
        new = [t.numpy() for t in steps]
        return Tensor(np.concatenate([ids] + new, axis=1).astype(np.int64), device=idx.device)

    def _check_ids(self, idx, fn):
        """idx as the model takes it: a (B, T) tensor of integer token ids, T >= 1. O(1): the ids' values are
        checked where they are read (by generate, and by the embedding where they sit in host memory)."""
        if not isinstance(idx, Tensor):
            raise TypeError(f"{fn}: idx must be a tinyllm Tensor of token ids (B, T), got {type(idx).__name__}: "
                            "make it with tinyllm.tensor(ids)")
        if idx.ndim != 2:
            raise ValueError(f"{fn}: idx must be (B, T) token ids, got shape {idx.shape}"
                             + (": add the batch axis, idx[None]" if idx.ndim == 1 else ""))
        if idx.shape[1] == 0:
            raise ValueError(f"{fn}: idx {idx.shape} has no tokens: give at least one token per row")
        if idx.dtype.is_float or idx.dtype.name == "bool":
            raise TypeError(f"{fn}: idx must hold integer token ids, got {idx.dtype.name}: make it with "
                            "dtype=tinyllm.int64 (or .long()); float ids would be truncated silently")

    def _check_forward(self, idx, targets):
        """forward's idx (at most max_positions tokens: generate crops, forward does not) and targets (idx's shape:
        the next token at each position)."""
        fn = f"{type(self).__name__}.forward"
        self._check_ids(idx, fn)
        if idx.shape[1] > self.max_positions:
            raise ValueError(f"{fn}: idx has {idx.shape[1]} tokens, more than {self.max_positions_field} "
                             f"{self.max_positions}: crop it to the last {self.max_positions} (idx[:, "
                             f"-{self.max_positions}:]), as generate does")
        if targets is not None and (not isinstance(targets, Tensor) or targets.shape != idx.shape):
            got = targets.shape if isinstance(targets, Tensor) else type(targets).__name__
            raise ValueError(f"{fn}: targets must be a tensor of idx's shape {idx.shape} (the next token at each "
                             f"position), got {got}")

    @property
    def max_positions(self):
        return getattr(self.config, self.max_positions_field)

    def _check_draft(self, draft, idx, k, fn, grammar=None):
        """generate's speculative arguments, checked when it is called (its steps run later, when streamed). With
        a grammar the rows are decoded one by one (_grammar_speculative_steps), so any B."""
        if not isinstance(draft, GenerationMixin):
            raise TypeError(f"{fn}: draft_model must be a model with generate (a GPT or Llama), got "
                            f"{type(draft).__name__}")
        if idx.shape[0] != 1 and grammar is None:
            raise ValueError(f"{fn}: speculative decoding takes one sequence (B = 1), got B = {idx.shape[0]}: "
                             "generate each row on its own")
        if draft.config.vocab_size != self.config.vocab_size:
            raise ValueError(f"{fn}: the draft model's vocab_size {draft.config.vocab_size} is not the target's "
                             f"{self.config.vocab_size}: a draft must share the target's tokens")
        whole_number(fn, "num_speculative_tokens", k, 1)

    def _generate_steps(self, idx, max_new_tokens, sampling, generator, use_cache, stats, grammar=None):
        """The generator behind generate(): no_grad around each step's work (a generator's body runs while its
        caller's code runs, so a no_grad spanning a yield would leak into the caller)."""
        with no_grad():
            ids = idx.numpy().astype(np.int64)
            decoder = self._decoder(ids.shape[0], idx.device, use_cache)
        matchers = None if grammar is None else [grammar.matcher() for _ in range(ids.shape[0])]
        try:
            for _ in range(max_new_tokens):
                with no_grad():
                    logits = decoder.logits(ids)
                    if matchers is not None:                # (in NumPy, where the sampler reads the logits)
                        logits = logits.numpy()
                        logits = np.where(self._grammar_mask(grammar, matchers, logits.shape[-1]), logits, -np.inf)
                    nxt = sample(logits, **sampling, generator=generator).numpy().astype(np.int64)
                    for m, token in zip(matchers or (), nxt[:, 0]):
                        if not m.is_terminated():
                            m.accept(token)
                    ids = np.concatenate([ids, nxt], axis=1)
                stats["emitted"] += 1
                yield Tensor(nxt, device=idx.device)
        finally:
            decoder.busy = False

    def _grammar_mask(self, grammar, matchers, vocab):
        """(B, vocab) bool NumPy array of the tokens each row's matcher allows (_grammar_row)."""
        return np.stack([self._grammar_row(grammar, m, vocab) for m in matchers])

    def _grammar_row(self, grammar, m, vocab):
        """(vocab,) bool NumPy array of the tokens matcher m allows; a finished row allows end of text alone (its
        padding), and the model's ids past the tokenizer's are never allowed."""
        row = np.zeros(vocab, bool)
        if m.is_terminated():
            row[grammar.eot] = True
        else:
            row[:grammar.n_vocab] = m.allowed()
            if not row.any():
                raise ValueError(f"{type(self).__name__}.generate: no token of the vocabulary continues the "
                                 f"output in {grammar.description}: the grammar needs bytes this tokenizer's "
                                 "tokens cannot spell")
        return row

    def _choice_tokens(self, grammar, max_new_tokens, fn):
        """[(option, its token ids)] for each distinct option of a choice grammar, by its tokenizer's encode (the one
        tokenization scored: another spelling of the same text in other tokens is not counted). Checked: the ids
        spell the option, hold no end of text, and with end of text fit in max_new_tokens."""
        tok = grammar.tokenizer
        encode = getattr(tok, "encode", None)
        if not callable(encode):
            raise TypeError(f"{fn}: a choice grammar is sampled as whole options, which needs the tokenizer's "
                            f"encode(text) -> token ids, and {type(tok).__name__} has no encode: use a tokenizer "
                            "with one (tiktoken's Encoding, tinyllm's Tokenizer), or compile the options as a regex "
                            "(regex='a|b|c') to sample them token by token")
        options = []
        for option in dict.fromkeys(grammar.choices):  # a repeated option is one string of the language, not two
            try:
                ids = [int(t) for t in encode(option)]
            except (ValueError, TypeError, KeyError) as e:  # (tiktoken refuses special tokens' texts)
                raise ValueError(f"{fn}: the grammar's tokenizer cannot encode the choice {option!r}: {e}") from e
            if any(not 0 <= t < grammar.n_vocab or t == grammar.eot for t in ids) \
                    or b"".join(tok.decode_single_token_bytes(t) for t in ids) != option.encode("utf-8"):
                raise ValueError(f"{fn}: {type(tok).__name__}.encode({option!r}) gave {ids}, which do not spell the "
                                 f"option in ordinary tokens of ids 0..{grammar.n_vocab - 1} (end of text "
                                 f"{grammar.eot} excluded): the grammar's tokenizer must encode each option as its "
                                 "own bytes")
            options.append((option, ids))
        option, ids = max(options, key=lambda o: len(o[1]))
        if len(ids) + 1 > max_new_tokens:
            raise ValueError(f"{fn}: the choice {option!r} needs {len(ids) + 1} new tokens ({len(ids)} tokens, then "
                             f"end of text), more than max_new_tokens {max_new_tokens}: give max_new_tokens >= "
                             f"{len(ids) + 1}")
        return options

    def _choice_steps(self, idx, options, max_new_tokens, eot, sampling, generator, stats):
        """generate() for a choice grammar: one whole option per row, drawn with probability ∝ the model's
        p(option's tokens, then end of text | the row's prompt) (^(1/temperature), then top_k, top_p and min_p, as
        sampling.probs treats logits, over the options: the scores are the options' log-probabilities). Masking
        token by token is biased: it renormalises at every step, so after a first token that only "yes" and
        "yesterday" share, the mass the model puts outside the grammar there is given back to them, and their sum
        is p(that token) / p(allowed tokens), not p("yes") + p("yesterday") (it also counts other tokenizations).
        Rows with the same prompt are scored once. The output is the option's tokens, then end of text to
        max_new_tokens."""
        from ..sampling import draw, probs
        with no_grad():
            ids = idx.numpy().astype(np.int64)
            prompts, which = np.unique(ids, axis=0, return_inverse=True)
            scores = self._option_logprobs(prompts, [t + [eot] for _, t in options], idx.device)
            picks = draw(probs(scores[which.reshape(-1)], **sampling), generator)
            out = np.full((ids.shape[0], max_new_tokens), eot, np.int64)
            for row, j in zip(out, picks):
                row[:len(options[j][1])] = options[j][1]
        for t in range(max_new_tokens):
            stats["emitted"] += 1
            yield Tensor(out[:, t:t + 1], device=idx.device)

    def _option_logprobs(self, prompts, seqs, device):
        """(P, J) log p(seqs[j] | prompts[p]) under the model: prompts (P, T) token ids, seqs J lists of ids. All
        P·J rows [prompt + seq] go through one forward, padded on the right to the longest (causal attention keeps
        the padding out of the positions scored). Past max_positions each position sees the last max_positions
        tokens before it, as generate's cropped window does (one more forward per such position)."""
        P, T = prompts.shape
        n = max(len(s) for s in seqs)
        rows = np.zeros((P, len(seqs), T + n), np.int64)
        rows[:, :, :T] = prompts[:, None]
        for j, s in enumerate(seqs):
            rows[:, j, T:T + len(s)] = s
        rows = rows.reshape(-1, T + n)
        L, block = T + n, self.max_positions
        logp = np.zeros((rows.shape[0], n))  # logp[:, i]: log p(rows[:, T + i] | rows[:, :T + i])

        def score(logits, i):  # logits (N, V) at position T + i - 1
            x = logits.astype(np.float64)
            x -= x.max(-1, keepdims=True)
            logp[:, i] = x[np.arange(len(x)), rows[:, T + i]] - np.log(np.exp(x).sum(-1))

        head = min(L, block)  # positions T - 1 … head - 1 come from one forward over the first head tokens
        if T - 1 < head - (head == L):
            x = self._features(Tensor(rows[:, :head], device=device))[:, T - 1:head - (head == L)]
            logits = self.lm_head(x).numpy()
            for i in range(logits.shape[1]):
                score(logits[:, i], i)
        for t in range(max(head, T - 1), L - 1):
            window = Tensor(rows[:, t + 1 - block:t + 1], device=device)
            score(self.lm_head(self._features(window)[:, -1:]).numpy()[:, -1], t + 1 - T)
        valid = np.arange(n) < np.array([len(s) for s in seqs])[:, None]  # (J, n)
        return np.where(valid, logp.reshape(P, len(seqs), n), 0.0).sum(-1)

    def _speculative_steps(self, draft, idx, max_new_tokens, k, sampling, generator, stats):
        """generate() with a draft model (Leviathan et al. 2023; Chen et al. 2023). Each round the draft proposes
        up to k tokens, one cached step each; the target scores them all in one forward of k + 1 positions against
        its cache (Decoder.extend) and speculative_accept keeps a prefix of them and adds one token of its own
        (its docstring has the proof that the target's distribution is kept). Both caches then forget the rejected
        positions (Decoder.sync). Near max_positions, where no draft fits, the target goes on alone. `stats`
        counts the rounds and the proposed and accepted drafts (generate's docstring)."""
        from ..sampling import draw, probs, speculative_accept
        block = min(self.max_positions, draft.max_positions)
        with no_grad():
            ids = idx.numpy().astype(np.int64)
            target, drafter = self._decoder(1, idx.device, True), draft._decoder(1, idx.device, True)
        try:
            produced = 0
            while produced < max_new_tokens:
                with no_grad():
                    L = ids.shape[1]
                    n = min(k, max_new_tokens - produced - 1, block - L)
                    if n < 1:  # the last token, or no room for a draft in the block: the target alone
                        new = sample(target.logits(ids), **sampling, generator=generator).numpy()[0]
                    else:
                        target.sync(ids, L - 1)
                        drafter.sync(ids, L - 1)
                        seq, q = ids, []
                        for _ in range(n):
                            q.append(probs(drafter.extend(seq)[:, -1], **sampling))
                            seq = np.concatenate([seq, draw(q[-1], generator)[:, None]], axis=1)
                        p = probs(target.extend(seq), **sampling)  # (1, n + 1, V)
                        accepted, tokens = speculative_accept(p, np.stack(q, 1), seq[:, L:], generator)
                        new = tokens[0, :accepted[0] + 1]
                        stats["rounds"] += 1
                        stats["proposed"] += n
                        stats["accepted"] += int(accepted[0])
                        stats["draft_acceptance_rate"] = stats["accepted"] / stats["proposed"]
                    ids = np.concatenate([ids, new[None].astype(np.int64)], axis=1)
                    produced += len(new)
                for token in new:
                    stats["emitted"] += 1
                    yield Tensor(np.array([[token]], dtype=np.int64), device=idx.device)
        finally:
            target.busy = drafter.busy = False

    def _grammar_speculative_steps(self, draft, idx, max_new_tokens, k, sampling, generator, stats, grammar):
        """generate() with a draft model and a grammar: each row decoded on its own (_grammar_speculative_row),
        one after another, reusing the models' one-sequence caches; with B = 1 each token is yielded as soon as it
        is known, with B > 1 once every row is done."""
        ids = idx.numpy().astype(np.int64)
        rows = [self._grammar_speculative_row(draft, ids[b:b + 1], max_new_tokens, k, sampling, generator, stats,
                                              grammar, idx.device) for b in range(ids.shape[0])]
        if len(rows) == 1:
            for token in rows[0]:
                stats["emitted"] += 1
                yield Tensor(np.array([[token]], dtype=np.int64), device=idx.device)
            return
        out = np.array([list(row) for row in rows], dtype=np.int64).reshape(len(rows), max_new_tokens)
        for t in range(max_new_tokens):
            stats["emitted"] += 1
            yield Tensor(out[:, t:t + 1], device=idx.device)

    def _grammar_speculative_row(self, draft, ids, max_new_tokens, k, sampling, generator, stats, grammar, device):
        """One row's new tokens (ints) by speculative decoding under a grammar, as _speculative_steps, with a
        matcher advanced along the draft. At each drafted position the draft samples from its distribution masked
        by the matcher's allowed tokens there; the target's distributions are masked by the same per-position
        masks (and the one after the drafts), and speculative_accept runs on these masked, renormalised
        distributions: its proof holds for any pair of distributions per position, and the mask at a position
        depends only on the tokens before it, so the output follows the target's constrained distribution. The
        matcher then takes back the rejected drafts and takes the correction (or bonus) token. Drafting stops at
        end of text; once the row has ended, the rest is end-of-text padding without running either model."""
        from ..sampling import draw, probs, speculative_accept
        block = min(self.max_positions, draft.max_positions)
        vocab = self.config.vocab_size
        m = grammar.matcher()

        def masked(logits, mask):
            return probs(np.where(mask, logits, -np.inf), **sampling)

        with no_grad():
            target, drafter = self._decoder(1, device, True), draft._decoder(1, device, True)
        try:
            produced = 0
            while produced < max_new_tokens:
                with no_grad():
                    L = ids.shape[1]
                    n = min(k, max_new_tokens - produced - 1, block - L)
                    if m.is_terminated():  # end of text is all a finished row allows
                        new = np.full(max_new_tokens - produced, grammar.eot, np.int64)
                    elif n < 1:  # the last token, or no room for a draft in the block: the target alone
                        new = draw(masked(target.logits(ids).numpy(), self._grammar_row(grammar, m, vocab)),
                                   generator)
                        m.accept(new[0])
                    else:
                        target.sync(ids, L - 1)
                        drafter.sync(ids, L - 1)
                        seq, q, masks = ids, [], []
                        while len(q) < n and not m.is_terminated():
                            masks.append(self._grammar_row(grammar, m, vocab))
                            q.append(masked(drafter.extend(seq)[:, -1], masks[-1]))
                            token = draw(q[-1], generator)
                            m.accept(token[0])
                            seq = np.concatenate([seq, token[:, None]], axis=1)
                        masks.append(self._grammar_row(grammar, m, vocab))  # the bonus token's
                        p = masked(target.extend(seq), np.stack(masks)[None])  # (1, d + 1, V)
                        accepted, tokens = speculative_accept(p, np.stack(q, 1), seq[:, L:], generator)
                        a, d = int(accepted[0]), len(q)
                        new = tokens[0, :a + 1]
                        m.rollback(d - a)
                        if not m.is_terminated():  # (terminated: the drafts ended with end of text, all accepted,
                            m.accept(new[-1])  # and the bonus token is end-of-text padding)
                        stats["rounds"] += 1
                        stats["proposed"] += d
                        stats["accepted"] += a
                        stats["draft_acceptance_rate"] = stats["accepted"] / stats["proposed"]
                    ids = np.concatenate([ids, new[None].astype(np.int64)], axis=1)
                    produced += len(new)
                yield from (int(t) for t in new)
        finally:
            target.busy = drafter.busy = False

    def _decoder(self, batch, device, use_cache):
        """The model's Decoder for this batch size, device and mode, kept between generate() calls so that a new
        call replays the steps recorded by an earlier one (a weight changed since makes its recording stale, and
        tinyllm.jit records it again). Its caches grow with the longest sequence yet, up to max_positions slots
        per layer, and are reused by every call."""
        dropout = getattr(self.config, "dropout", 0) or getattr(self.config, "attention_dropout", 0)
        replayable = not self.training or not dropout  # dropout's masks come from the host
        # lora.disabled is a Python switch a recorded step cannot see: each setting keeps its own recordings
        adapters_off = tuple(m.disable_adapters for m in lora.layers(self).values())
        key = (batch, device, use_cache, replayable, adapters_off)
        decoders = self.__dict__.setdefault("_decoders", {})
        if key not in decoders:
            while len(decoders) >= 4:  # a few shapes at a time: each holds a cache
                del decoders[next(iter(decoders))]
            decoders[key] = Decoder(self, batch, device, use_cache, replayable)
        decoder = decoders[key]
        if decoder.busy:  # another generation (a stream not yet finished) is using its cache: one of its own
            decoder = Decoder(self, batch, device, use_cache, replayable)
        decoder.length, decoder.busy = None, True  # a new sequence: the first step is a prefill
        return decoder
