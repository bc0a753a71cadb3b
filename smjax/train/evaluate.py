"""Held-out evaluation: k samples per prompt at the training temperature, and greedy pass@1.

The headline accuracy of a domain is the mean over its held-out prompts of the fraction of the
prompt's `samples` completions (temperature `temperature`) that the verifier scores as correct
(reward >= `threshold`); greedy pass@1 and pass@k are reported beside it. Per-prompt counts are
kept (`correct`, `greedy_correct`), so that the study's report can bootstrap its intervals over
prompts (smjax.study.stats). Every call samples with the same keys, so two models are compared on
the same random numbers as well as the same prompts. Prompts are padded to one fixed batch of
`batch_size` prompts per call, so evaluation compiles once per run whatever the set's size.
FLOPs go under `phase` (eval/*), which no training total includes.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from smjax.batch import decode_completions, encode_prompt
from smjax.rollout import Sampler


class Evaluator:
  """`evaluator(params) -> (fields, program_calls)`; fields: {"accuracy", "greedy", "pass_at_k",
  "length" (mean completion tokens of the samples), "at_cap" (the share of samples that ran to
  the sampler's token cap: truncated, unless its last token ended them): {domain: float},
  "correct": {domain: [int per prompt, 0..samples]}, "greedy_correct": {domain: [0/1 per
  prompt]}, "lengths": {domain: [mean sample length per prompt]}, "completions": {domain: the
  first `show` prompts' first samples as [{"prompt", "completion", "reward"}]}, "samples": k}."""

  def __init__(self, sampler: Sampler, tokenizer, heldout: Mapping[str, Sequence],
               verify: Callable[[Sequence, Sequence[str]], Sequence[float]], *,
               batch_size: int = 64, samples: int = 4, temperature: float = 1.0,
               greedy: bool = True, threshold: float = 1.0, phase: str = "eval/heldout",
               show: int = 2):
    if not heldout:
      raise ValueError("Evaluator: no held-out domains given")
    if samples < 1 or batch_size < 1:
      raise ValueError(f"Evaluator: samples={samples} and batch_size={batch_size} must be >= 1")
    self.sampler, self.tokenizer, self.verify = sampler, tokenizer, verify
    self.heldout = {d: list(ex) for d, ex in heldout.items()}
    for d, ex in self.heldout.items():
      if not ex:
        raise ValueError(f"Evaluator: held-out set of domain {d!r} is empty")
    self.batch_size, self.samples, self.temperature = batch_size, samples, temperature
    self.greedy, self.threshold, self.phase, self.show = greedy, threshold, phase, show

  def _run(self, params, examples, *, k: int, greedy: bool, key, calls, seen=None):
    """Correct samples per example ([n] ints in 0..k) and its mean completion length ([n]);
    `seen` (a dict), when given, gets "at_cap" (samples at the token cap) and "completions"
    (the first `show` examples' first samples)."""
    correct, lengths, at_cap = [], [], 0
    for start in range(0, len(examples), self.batch_size):
      chunk = examples[start:start + self.batch_size]
      prompts = [encode_prompt(self.tokenizer, e) for e in chunk]
      # Pad with copies of the first prompt: one batch shape for the whole run.
      prompts += [prompts[0]] * (self.batch_size - len(prompts))
      res = self.sampler.generate(params, prompts, jax.random.fold_in(key, start),
                                  num_samples=k, temperature=self.temperature, greedy=greedy)
      for c in res.program_calls:
        c.phase = self.phase
      calls.extend(res.program_calls)
      n = len(chunk) * k
      texts = decode_completions(self.tokenizer, res)[:n]
      rewards = np.asarray(self.verify([e for e in chunk for _ in range(k)], texts), np.float64)
      correct.extend((rewards >= self.threshold).reshape(len(chunk), k).sum(1).tolist())
      lens = np.asarray(res.lengths_B)[:n]
      lengths.extend(lens.reshape(len(chunk), k).mean(1).tolist())
      at_cap += int(np.sum(lens >= self.sampler.max_new_tokens))
      if seen is not None and start == 0:
        seen["completions"] = [{"prompt": e.prompt, "completion": texts[i * k],
                                "reward": float(rewards[i * k])}
                               for i, e in enumerate(chunk[:self.show])]
    if seen is not None:
      seen["at_cap"] = at_cap / (len(examples) * k)
    return [int(c) for c in correct], [round(float(x), 2) for x in lengths]

  def __call__(self, params):
    fields = {"accuracy": {}, "greedy": {}, "pass_at_k": {}, "length": {}, "at_cap": {},
              "correct": {}, "greedy_correct": {}, "lengths": {}, "completions": {},
              "samples": self.samples}
    calls = []
    for i, (domain, examples) in enumerate(self.heldout.items()):
      key = jax.random.fold_in(jax.random.key(0), i)
      seen: dict = {}
      correct, lengths = self._run(params, examples, k=self.samples, greedy=False, key=key,
                                   calls=calls, seen=seen)
      fields["at_cap"][domain] = seen["at_cap"]
      fields["completions"][domain] = seen["completions"]
      fields["accuracy"][domain] = float(np.mean(correct)) / self.samples
      fields["pass_at_k"][domain] = float(np.mean(np.asarray(correct) > 0))
      fields["length"][domain] = float(np.mean(lengths))
      fields["correct"][domain] = correct
      fields["lengths"][domain] = lengths
      if self.greedy:
        g, _ = self._run(params, examples, k=1, greedy=True, key=key, calls=calls)
        fields["greedy"][domain] = float(np.mean(g))
        fields["greedy_correct"][domain] = g
    return fields, calls
