"""A run's guards, checked on the host: a non-finite step (`check_finite`, naming every in-graph
guard that fired and what produced the inputs) and a collapse without one (`Collapse`). Both stop
the run with an error that names the phase, the step and the likely cause."""

from __future__ import annotations

import math

import numpy as np


# Where each float input of a batch comes from: what to check when it is not finite.
_PRODUCERS = {"old_logp_BT": "the sampler", "ref_logp_BT": "the reference model",
              "rewards_B": "the verifier", "teacher_logp_BT": "the teacher's forward",
              "teacher_logits_BTV": "the teacher's forward"}


def check_finite(phase: str, step: int, m: dict[str, float]) -> None:
  """FloatingPointError naming every guard of a non-finite step (smjax.train.steps)."""
  if m.get("finite", 1.0) >= 1.0 and np.isfinite(m.get("loss", 0.0)):
    return
  fired = [k.partition("/")[2] for k, v in m.items() if k.startswith("finite/") and v < 1.0]
  inputs = [k.partition(".")[2] for k in fired if k.startswith("batch.")]
  msg = (f"{phase}: step {step} was not finite (loss={m.get('loss')}, grad_norm="
         f"{m.get('grad_norm')}; non-finite: {', '.join(fired) or 'loss'}); the update was "
         "skipped and the run stopped. ")
  if inputs:
    msg += "Non-finite inputs: " + "; ".join(f"batch.{k} (from {_PRODUCERS.get(k, 'the batch')})"
                                             for k in inputs) + "."
  else:
    msg += ("The batch's inputs were finite, so the update itself diverged: lower the learning "
            "rate (config.rl.learning_rate for GRPO phases, config.opd.learning_rate for OPD).")
  raise FloatingPointError(msg)


# ------------------------------------------------------------------------------ collapse

class CollapseError(RuntimeError):
  """The policy collapsed without a non-finite step (`Collapse`); `what`: the sign, in words."""

  def __init__(self, message: str, what: str = ""):
    super().__init__(message)
    self.what = what


class Collapse:
  """Signs that a run's policy has collapsed though every step is finite, each stopping it with
  a message naming the metric, the step and the likely cause: no sample scoring and a zero
  gradient for `window` steps in a row (nothing left to learn from), the policy's entropy at
  ln V (uniform output) for `window` steps, or the held-out accuracy at 0 after it was above
  0.05. `window` 0 turns the checks off."""

  def __init__(self, name: str, window: int, vocab_size: int | None, advice: str):
    self.name, self.window, self.advice = name, window, advice
    self.uniform = 0.99 * math.log(vocab_size) if vocab_size else math.inf  # unknown V: no check
    self.dead = self.flat = 0
    self.best = 0.0

  def _fail(self, step: int, what: str) -> None:
    raise CollapseError(f"{self.name}: the policy collapsed at step {step}: {what}. Likely "
                        f"cause: {self.advice}; or turn the check off to run on "
                        "(--config.collapse_window=0 in a study, RLLoopConfig.collapse_window=0)",
                        what)

  def step(self, i: int, m: dict) -> None:
    if not self.window:
      return
    dead = m.get("reward/mean", 1.0) == 0.0 and m.get("grad_norm", 1.0) < 1e-12
    self.dead = self.dead + 1 if dead else 0
    self.flat = self.flat + 1 if m.get("entropy", 0.0) >= self.uniform else 0
    if self.dead >= self.window:
      self._fail(i, f"no sample has scored and the gradient has been 0 for {self.dead} steps")
    if self.flat >= self.window:
      self._fail(i, f"the policy's entropy has been at ln V ({m['entropy']:.3f}) for "
                 f"{self.flat} steps: it samples uniformly")

  def evaluation(self, step: int, mean_accuracy: float) -> None:
    if self.window and self.best > 0.05 and mean_accuracy == 0.0:
      self._fail(step, f"held-out accuracy fell to 0 from {self.best:.1%}")
    self.best = max(self.best, mean_accuracy)
