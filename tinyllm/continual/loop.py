"""The feedback loop: LoRA adapters tuned, round by round, on what users said about the model's answers.

    store = FeedbackStore("feedback.tlfb", tokenizer=tok)
    loop = Loop(model, tok, store, replay_text=corpus, heldout_prompts=prompts, heldout_text=val, judge=score,
                checkpoint_dir="out/adapters", max_heldout_increase=0.02)
    ... users rate answers: store.add(prompt, answer, +1), store.add_pair(prompt, better, worse), store.add_edit(...)
    metrics = loop.round()      # train on the records since the last round, evaluate, keep or roll back
    loop.rollback()             # the adapters from before the last round, bit for bit

A round trains the adapters only (the base weights never change) with the loss each kind of record calls for:
a pair (chosen, rejected) DPO's, a single rating (+1 desirable, -1 undesirable) KTO's, an edit (the user's
correction of an answer) the negative log-likelihood of the correction (SFT); `method` narrows that to one loss,
turning the other kinds into its data where that means something (an edit is a pair: the correction chosen over
the answer), and `loss_type` picks DPO's form (sigmoid, IPO, hinge). The reference those losses measure against
is the same model with its adapters switched off (lora.disabled), so no second copy of the weights exists. Next-token loss on windows of the original training
text (`replay_text`) is mixed into every step, as rehearsal against forgetting.

After training, a round evaluates: the held-out text's loss against the base model's (the relative change is
what forgetting costs), the implicit reward's margin and accuracy on the round's pairs (DPO: β·log π/π_ref of the
chosen minus the rejected), KTO's KL estimate, and the win rate against the base model on held-out prompts under
`judge` (a function scoring a completion: the adapted model's answer wins when it scores higher than the base
model's, a tie counts half). With `max_heldout_increase`, a round whose held-out loss rises more than that (a
fraction: 0.02 is 2 %) is rolled back by itself: the forgetting gate.

With a `checkpoint_dir`, each version of the adapters is a file (tinyllm.nn.lora.save, atomic) and `loop.json`
records which one is current and the store position it was trained to, so a new Loop on the same directory
resumes where the last one stopped.
"""
import contextlib
import json
import math
import os
import time

import numpy as np

from .. import optim
from ..models.generation import GenerationMixin
from ..nn import lora
from ..random import Generator
from ..tensor import Tensor, no_grad
from ..utils.files import atomic_write
from .losses import LOSS_TYPES, dpo_loss, kto_loss, sequence_logprobs
from .store import FeedbackStore, tokenizer_fingerprint

__all__ = ["Loop"]

METHODS = ("auto", "dpo", "kto", "sft")
STATE_FORMAT = "tinyllm.continual.loop/1"
TARGETS = {"GPT": ("c_attn", "c_proj"), "Llama": ("q_proj", "v_proj")}


class Loop:
    def __init__(self, model, tokenizer, store, *, method="auto", r=8, alpha=16, beta=0.1, loss_type="sigmoid",
                 lr=5e-3, steps=20,
                 batch_size=8, targets=None, replay_text=None, replay_weight=1.0, heldout_prompts=(),
                 heldout_text=None, judge=None, max_new_tokens=48, temperature=1.0, top_k=None,
                 max_heldout_increase=None, checkpoint_dir=None, seed=0):
        name = "Loop"
        if not isinstance(model, GenerationMixin):
            raise TypeError(f"{name}: model must be a tinyllm language model (GPT, Llama), got {type(model).__name__}")
        if not isinstance(store, FeedbackStore):
            raise TypeError(f"{name}: store must be a tinyllm.continual.FeedbackStore, got {type(store).__name__}")
        if method not in METHODS:
            raise ValueError(f"{name}: method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"{name}: loss_type (DPO's) must be one of {', '.join(map(repr, LOSS_TYPES))}, got "
                             f"{loss_type!r}")
        if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
            raise ValueError(f"{name}: beta must be a finite number > 0 (0.1 is usual), got {beta!r}")
        for what, v in (("steps", steps), ("batch_size", batch_size), ("max_new_tokens", max_new_tokens)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: {what} must be a whole number >= 1, got {v!r}")
        if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
            raise ValueError(f"{name}: lr must be a finite number > 0, got {lr!r}")
        if max_heldout_increase is not None and not (heldout_text and max_heldout_increase >= 0):
            raise ValueError(f"{name}: max_heldout_increase (the forgetting gate, a fraction >= 0) needs heldout_text "
                             f"to measure it on; got {max_heldout_increase!r} with "
                             f"{'no' if not heldout_text else 'some'} heldout_text")
        want = store.tokenizer_fingerprint
        if want is not None and tokenizer_fingerprint(tokenizer) != want:
            raise ValueError(f"{name}: {store.path} was written for another tokenizer (fingerprint {want[:12]}, this "
                             f"one's {tokenizer_fingerprint(tokenizer)[:12]}): its token ids mean other text; use "
                             "the tokenizer the store was written with, or a new store")
        self.model, self.tokenizer, self.store, self.method = model, tokenizer, store, method
        self.beta, self.lr, self.steps, self.batch_size = float(beta), float(lr), steps, batch_size
        self.loss_type = loss_type
        self.replay_weight, self.judge = float(replay_weight), judge
        self.heldout_prompts = list(heldout_prompts)
        self.sampling = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k)
        self.max_heldout_increase, self.seed = max_heldout_increase, seed
        self.block = model.max_positions
        self.replay = self._ids(replay_text, "replay_text") if replay_text else None
        self.heldout = self._ids(heldout_text, "heldout_text") if heldout_text else None
        self._rng = np.random.default_rng(seed)
        self._base_heldout = None
        self._undo = None                               # (adapter arrays, position, version) before the last round
        self.dir = checkpoint_dir
        self.position, self.version, self.history = 0, 0, []
        state = self._read_state()
        if state is not None:                           # resume: the current version's adapters and position
            lora.load(model, self._adapter_path(state["version"]))
            self.position, self.version, self.history = state["position"], state["version"], state["history"]
        else:
            if not lora.layers(model):
                lora.apply(model, r=r, alpha=alpha, targets=targets or TARGETS.get(type(model).__name__,
                                                                                   TARGETS["GPT"]))
            self._save()                                # version 0: the fresh adapters, so round 1 can be undone
        self.adapters = lora.parameters(model)

    # ---- feedback as token ids
    def _ids(self, text, what):
        enc = getattr(self.tokenizer, "encode_ordinary", None) or self.tokenizer.encode
        try:
            return np.asarray(enc(text), np.int64)
        except (ValueError, KeyError) as e:
            raise ValueError(f"Loop: {what} cannot be tokenized by the model's tokenizer: {e}") from None

    def _pair_ids(self, prompt, completion, what):
        """(prompt ids, completion ids) within the model's context: the completion first (up to block - 1), then
        as much of the prompt's end as fits; a prompt with no token lends the completion's first one."""
        p, c = self._ids(prompt, what), self._ids(completion, what)
        c = c[:self.block - 1]
        p = p[max(0, len(p) - (self.block - len(c))):]
        if not len(p):
            p, c = c[:1], c[1:]
        if not len(c):
            raise ValueError(f"Loop: {what} {completion!r} is too short to learn from (one token, and no prompt)")
        return list(p), list(c)

    def _examples(self, records):
        """{"pairs": [(p, chosen, rejected)], "good": [(p, c)], "bad": [(p, c)], "sft": [(p, c)]} of token ids:
        each kind of record where `method` puts it (see the module docstring)."""
        out = {"pairs": [], "good": [], "bad": [], "sft": []}
        m = self.method
        for rec in records:
            what = f"record {rec.index}"
            if rec.kind == "pair":
                (p, ch), (_, rj) = self._pair_ids(rec.prompt, rec.chosen, what), self._pair_ids(rec.prompt,
                                                                                                rec.rejected, what)
                chosen, rejected = (p, ch), (p, rj)
            elif rec.kind == "edit":
                chosen, rejected = self._pair_ids(rec.prompt, rec.edited, what), self._pair_ids(
                    rec.prompt, rec.completion, what)
            else:
                one = self._pair_ids(rec.prompt, rec.completion, what)
                if m in ("auto", "kto"):
                    out["good" if rec.signal > 0 else "bad"].append(one)
                elif m == "sft" and rec.signal > 0:
                    out["sft"].append(one)
                continue                                # (dpo: a rating alone compares nothing)
            if m == "kto":
                out["good"].append(chosen)
                out["bad"].append(rejected)
            elif m == "sft" or (m == "auto" and rec.kind == "edit"):
                out["sft"].append(chosen)
            else:
                out["pairs"].append((chosen[0], chosen[1], rejected[1]))
        return out

    # ---- one round
    def round(self):
        """Train the adapters on the records added since the last round, evaluate, and return the metrics (a
        dict); the forgetting gate may roll the round back (metrics["rolled_back"])."""
        t0 = time.perf_counter()
        records = self.store.records(self.position)
        if not records:
            raise ValueError(f"Loop.round: no new feedback in {self.store.path} since record {self.position} "
                             f"({len(self.store)} in all): add ratings, pairs or edits first")
        data = self._examples(records)
        if not any(data.values()):
            raise ValueError(f"Loop.round: method={self.method!r} finds nothing to learn in the {len(records)} new "
                             "records (e.g. dpo needs pairs or edits): add such feedback or use method='auto'")
        self._undo = ({k: p.numpy().copy() for k, p in lora.state_dict(self.model).items()}, self.position,
                      self.version)
        ref = self._reference(data)
        opt = optim.AdamW(self.adapters, lr=self.lr, weight_decay=0.0)
        self.model.train()
        losses = []
        for _ in range(self.steps):
            opt.zero_grad()
            loss = self._loss(data, ref)
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        self.model.eval()
        metrics = {"records": len(records), "pairs": len(data["pairs"]), "desirable": len(data["good"]),
                   "undesirable": len(data["bad"]), "sft": len(data["sft"]),
                   "loss": float(np.mean(losses[-max(1, self.steps // 5):]))}
        metrics.update(self._evaluate(data, ref))
        self.position, self.version = records[-1].index + 1, self.version + 1
        metrics.update(version=self.version, position=self.position, rolled_back=False)
        change = metrics.get("heldout_change")
        if self.max_heldout_increase is not None and change is not None and change > self.max_heldout_increase:
            self.rollback()
            metrics.update(rolled_back=True, version=self.version, position=self.position,
                           reason=f"held-out loss rose {change:.1%} > {self.max_heldout_increase:.1%}")
        metrics["seconds"] = time.perf_counter() - t0
        self.history.append(metrics)
        if not metrics["rolled_back"]:
            self._save()
        return metrics

    def rollback(self):
        """Restore the adapters (bit for bit) and the store position from before the last round."""
        if self._undo is None:
            if self.version == 0:
                raise RuntimeError("Loop.rollback: no round to roll back (the adapters are the fresh ones)")
            self._undo = (None, *self._version_before())
        arrays, self.position, self.version = self._undo
        if arrays is None:
            lora.load(self.model, self._adapter_path(self.version))
        else:
            with no_grad():
                for k, p in lora.state_dict(self.model).items():
                    p.copy_(arrays[k])
        self._undo = None
        self._write_state()

    # ---- the loss of one step
    def _pick(self, n):
        """Indices of a batch drawn from n items without replacement (none from none)."""
        return self._rng.choice(n, min(self.batch_size, n), replace=False) if n else np.zeros(0, np.int64)

    def _mismatched(self, both):
        """TRL's KL pairs: each prompt with the next item's completion, cut to the context."""
        return [(p, both[(i + 1) % len(both)][1][:self.block - len(p)]) for i, (p, _) in enumerate(both)]

    def _reference(self, data):
        """The base model's log-probabilities of every completion in `data`, once per round (the adapters off)."""
        ref = {}
        with no_grad(), lora.disabled(self.model):
            for key in ("pairs", "good", "bad"):
                items = data[key]
                seqs = _sides(items) if key == "pairs" else items
                if seqs:
                    ref[key] = _logps(self.model, seqs).numpy()
        return ref

    def _loss(self, data, ref):
        terms = []
        if data["pairs"]:
            idx = self._pick(len(data["pairs"]))
            items = [data["pairs"][i] for i in idx]
            n, r = len(items), ref["pairs"]
            logps = _logps(self.model, _sides(items))
            losses, _, _ = dpo_loss(logps[:n], logps[n:], r[idx], r[len(data["pairs"]) + idx], beta=self.beta,
                                    loss_type=self.loss_type)
            terms.append(losses.mean())
        if data["good"] or data["bad"]:
            terms.append(self._kto(data, ref))
        if data["sft"]:
            items = [data["sft"][i] for i in self._pick(len(data["sft"]))]
            tokens = sum(len(c) for _, c in items)
            terms.append(-_logps(self.model, items).sum() / tokens)
        if self.replay is not None and self.replay_weight > 0:
            terms.append(self._replay_loss() * self.replay_weight)
        return sum(terms[1:], terms[0])

    def _kto(self, data, ref):
        """KTO's loss on a batch of desirable and undesirable completions; its KL term (TRL's estimate) from the
        batch's prompts each paired with another's completion."""
        pick = {key: self._pick(len(data[key])) for key in ("good", "bad")}
        good = [data["good"][i] for i in pick["good"]]
        bad = [data["bad"][i] for i in pick["bad"]]
        both = good + bad
        mismatched = self._mismatched(both)
        logps = _logps(self.model, both + mismatched)
        with no_grad(), lora.disabled(self.model):
            ref_kl = _logps(self.model, mismatched)
        n, g = len(both), len(good)
        losses, _, _, _ = kto_loss(logps[:g], logps[g:n], logps[n:], ref.get("good", np.zeros(0))[pick["good"]],
                                   ref.get("bad", np.zeros(0))[pick["bad"]], ref_kl, beta=self.beta)
        return losses.mean()

    def _replay_loss(self):
        T = min(self.block, len(self.replay) - 1)
        return self._windows_loss(self.replay, T, self._rng.integers(0, len(self.replay) - T, self.batch_size))

    def _windows_loss(self, ids, T, starts):
        """The model's mean next-token loss over the windows of T tokens of `ids` at `starts`."""
        x = np.stack([ids[s:s + T] for s in starts])
        y = np.stack([ids[s + 1:s + T + 1] for s in starts])
        _, loss = self.model(Tensor(x, device=self._device()), Tensor(y, device=self._device()))
        return loss

    def _device(self):
        return self.model.get_input_embeddings().weight.device

    # ---- evaluation
    def heldout_loss(self, adapters=True):
        """Mean next-token loss over the held-out text, in windows of the model's context (None without it)."""
        if self.heldout is None:
            return None
        ids, T = self.heldout, min(self.block, len(self.heldout) - 1)
        with no_grad(), (contextlib.nullcontext() if adapters else lora.disabled(self.model)):
            loss = self._windows_loss(ids, T, np.arange(0, len(ids) - T, T)[:64])
        return float(loss.item())

    def _evaluate(self, data, ref):
        out = {}
        with no_grad():
            if data["pairs"]:
                items, n, r = data["pairs"], len(data["pairs"]), ref["pairs"]
                logps = _logps(self.model, _sides(items)).numpy()
                margin = self.beta * ((logps[:n] - r[:n]) - (logps[n:] - r[n:]))
                out.update(reward_margin=float(margin.mean()), reward_accuracy=float((margin > 0).mean()))
            if data["good"] or data["bad"]:               # KTO: the implicit reward's sign, and TRL's KL estimate
                signs, rewards = [], []
                for key, sign in (("good", 1), ("bad", -1)):
                    if data[key]:
                        rewards.append(self.beta * (_logps(self.model, data[key]).numpy() - ref[key]))
                        signs.append(np.full(len(data[key]), sign))
                rewards, signs = np.concatenate(rewards), np.concatenate(signs)
                out["reward_accuracy"] = float((np.sign(rewards) == signs).mean())
                both = data["good"] + data["bad"]
                mismatched = self._mismatched(both)
                policy = _logps(self.model, mismatched).numpy()
                with lora.disabled(self.model):
                    base = _logps(self.model, mismatched).numpy()
                out["kl"] = max(0.0, float(np.mean(policy - base)))
        if self.heldout is not None:
            if self._base_heldout is None:
                self._base_heldout = self.heldout_loss(adapters=False)
            now = self.heldout_loss()
            out.update(heldout_loss=now, heldout_loss_base=self._base_heldout,
                       heldout_change=now / self._base_heldout - 1)
        if self.judge is not None and self.heldout_prompts:
            out["win_rate"] = self.win_rate()
        return out

    def completions(self, prompts, adapters=True, seed=None):
        """One sampled completion (text) per prompt, from the adapted model or (adapters=False) the base model;
        prompts of one length are sampled as one batch."""
        seed = self.seed if seed is None else seed
        enc = [self._ids(p, "prompt")[-(self.block - 1):] for p in prompts]
        out = [None] * len(prompts)
        by_len = {}
        for i, e in enumerate(enc):
            by_len.setdefault(len(e), []).append(i)
        n = self.sampling["max_new_tokens"]
        for length, rows in sorted(by_len.items()):
            idx = Tensor(np.stack([enc[i] for i in rows]), device=self._device())
            gen = Generator().manual_seed(seed + length)
            with no_grad():
                if adapters:
                    ids = self.model.generate(idx, n, temperature=self.sampling["temperature"],
                                              top_k=self.sampling["top_k"], generator=gen)
                else:
                    with lora.disabled(self.model):
                        ids = self.model.generate(idx, n, temperature=self.sampling["temperature"],
                                                  top_k=self.sampling["top_k"], generator=gen)
            for row, i in zip(ids.numpy()[:, length:], rows):
                out[i] = self.tokenizer.decode([int(t) for t in row])
        return out

    def win_rate(self, prompts=None, seed=None):
        """The share of prompts (default: the held-out ones) where judge scores the adapted model's completion
        above the base model's (a tie counts half), both sampled with the same seed."""
        prompts = self.heldout_prompts if prompts is None else list(prompts)
        ours, base = self.completions(prompts, True, seed), self.completions(prompts, False, seed)
        wins = [np.sign(self.judge(p, a) - self.judge(p, b)) for p, a, b in zip(prompts, ours, base)]
        return float(np.mean([(w + 1) / 2 for w in wins]))

    # ---- versions on disk
    def _adapter_path(self, version):
        return os.path.join(self.dir, f"adapter-{version:04d}.safetensors")

    def _state_path(self):
        return os.path.join(self.dir, "loop.json")

    def _read_state(self):
        if self.dir is None or not os.path.exists(self._state_path()):
            return None
        try:
            with open(self._state_path(), encoding="utf-8") as f:
                state = json.load(f)
            ok = state.get("format") == STATE_FORMAT and all(isinstance(state.get(k), int)
                                                              for k in ("version", "position"))
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            raise ValueError(f"Loop: {self._state_path()} is not a feedback loop's state (corrupt, or another "
                             "file): move it away to start afresh in that directory")
        if state["position"] > len(self.store):
            raise ValueError(f"Loop: {self._state_path()} was trained to record {state['position']} but "
                             f"{self.store.path} has {len(self.store)}: that is another store")
        return state

    def _version_before(self):
        """(position, version) of the version before the current one, from the history on disk."""
        done = [h for h in self.history if not h.get("rolled_back") and h["version"] < self.version]
        return (done[-1]["position"], done[-1]["version"]) if done else (0, 0)

    def _save(self):
        if self.dir is None:
            return
        lora.save(self.model, self._adapter_path(self.version))
        self._write_state()

    def _write_state(self):
        if self.dir is None:
            return
        state = {"format": STATE_FORMAT, "version": self.version, "position": self.position,
                 "store": os.path.abspath(self.store.path), "history": self.history}
        atomic_write(self._state_path(), json.dumps(state, indent=1))


def _sides(pairs):
    """[(prompt, chosen)] then [(prompt, rejected)] of [(prompt, chosen, rejected)]."""
    return [(p, c) for p, c, _ in pairs] + [(p, r) for p, _, r in pairs]


def _logps(model, seqs):
    """sequence_logprobs over [(prompt ids, completion ids)]."""
    return sequence_logprobs(model, [p for p, _ in seqs], [c for _, c in seqs])
