"""Held-out evaluation: greedy pass@1 per domain on a fixed held-out set, FLOPs under `eval/*`.

Accuracy is the fraction of held-out examples whose greedy completion (temperature 0) the domain's
verifier scores as correct (reward >= `threshold`). The prompts are padded to one fixed batch of
`batch_size` rows per call, so evaluation compiles once per run whatever the set's size.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import jax
import numpy as np

from smjax.rollout import Sampler
from smjax.batch import decode_completions, encode_prompt


class Evaluator:
  """`evaluator(params) -> ({domain: accuracy}, {domain: mean completion length}, program_calls)`."""

  def __init__(self, sampler: Sampler, tokenizer, heldout: Mapping[str, Sequence],
               verify: Callable[[Sequence, Sequence[str]], Sequence[float]], *,
               batch_size: int = 64, threshold: float = 1.0, phase: str = "eval/heldout"):
    if not heldout:
      raise ValueError("Evaluator: no held-out domains given")
    self.sampler, self.tokenizer, self.verify = sampler, tokenizer, verify
    self.heldout = {d: list(ex) for d, ex in heldout.items()}
    for d, ex in self.heldout.items():
      if not ex:
        raise ValueError(f"Evaluator: held-out set of domain {d!r} is empty")
    self.batch_size, self.threshold, self.phase = batch_size, threshold, phase

  def __call__(self, params):
    acc, lengths, calls = {}, {}, []
    for domain, examples in self.heldout.items():
      correct, total_len = 0, 0
      for start in range(0, len(examples), self.batch_size):
        chunk = examples[start:start + self.batch_size]
        prompts = [encode_prompt(self.tokenizer, e.prompt) for e in chunk]
        # Pad with copies of the first prompt: one batch shape for the whole run.
        prompts += [prompts[0]] * (self.batch_size - len(prompts))
        res = self.sampler.generate(params, prompts, jax.random.key(0), greedy=True)
        for c in res.program_calls:
          c.phase = self.phase
        calls.extend(res.program_calls)
        texts = decode_completions(self.tokenizer, res)[:len(chunk)]
        rewards = self.verify(chunk, texts)
        correct += int(np.sum(np.asarray(rewards, np.float64) >= self.threshold))
        total_len += int(np.asarray(res.lengths_B)[:len(chunk)].sum())
      acc[domain] = correct / len(examples)
      lengths[domain] = total_len / len(examples)
    return acc, lengths, calls
