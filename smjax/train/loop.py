"""Host loops: supervised warm-up (SFT), GRPO and on-policy distillation (OPD) runs.

One RL loop serves both algorithms: sample with the policy → (GRPO) verify and reward, optional
reference forward / (OPD) route each row to its domain's teacher → one jitted update. Every program
that ran is added to the run's FLOP ledger; held-out evaluation runs every `eval_every_steps` steps
and whenever the cumulative training FLOPs cross a multiple of `eval_every_flops`, giving the
accuracy-vs-FLOPs curve. Metrics go to TensorBoard and metrics.jsonl, with a progress bar.

Metrics are fetched one step late, so the host prepares step t+1 while the device runs step t. A
non-finite loss stops the run with a FloatingPointError naming the phase and step.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from smjax.ledger import FlopLedger
from smjax.rollout import Sampler
from smjax.train import steps as steps_lib
from smjax.train.batching import decode_completions, encode_prompt, rollout_batch, sft_batch
from smjax.train.metrics import MetricsWriter


@dataclasses.dataclass(frozen=True)
class RLLoopConfig:
  steps: int
  prompts_per_step: int
  samples_per_prompt: int
  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eval_every_steps: int = 0
  eval_every_flops: float = 0.0
  log_every: int = 10
  seed: int = 0
  progress: bool = True


@dataclasses.dataclass
class RunResult:
  state: Any
  ledger: FlopLedger
  curve: list[dict]              # {"step", "flops", "accuracy": {domain: acc}, "mean", "length"}
  last_metrics: dict


def _to_host(metrics) -> dict[str, float]:
  return {k: float(np.asarray(v)) for k, v in jax.device_get(metrics).items()}


def _check_finite(phase: str, step: int, m: dict[str, float]) -> None:
  if m.get("finite", 1.0) < 1.0 or not np.isfinite(m.get("loss", 0.0)):
    raise FloatingPointError(
        f"{phase}: step {step} produced a non-finite loss or gradient (loss={m.get('loss')}, "
        f"grad_norm={m.get('grad_norm')}); the update was skipped and the run stopped. Lower the "
        "learning rate or check the rewards/teacher log-probs for inf/NaN.")


def run_sft(*, phase: str, state, step: steps_lib.JittedStep, examples_iter: Iterator[Sequence],
            tokenizer, seq_len: int, num_steps: int, ledger: FlopLedger,
            writer: MetricsWriter | None = None, log_every: int = 50, progress: bool = True,
            evaluate: Callable | None = None, eval_every: int = 0, start_step: int = 0):
  """Supervised warm-up on gold solutions. FLOPs go to `phase` (e.g. base/sft)."""
  pending, curve = None, []
  bar = tqdm(range(start_step, num_steps), desc=phase, disable=not progress, dynamic_ncols=True)
  for i in bar:
    examples = next(examples_iter)
    batch = sft_batch(tokenizer, [e.prompt for e in examples], [e.solution for e in examples],
                      seq_len=seq_len)
    for call in step.program_calls(state, batch):
      call.phase = phase
      ledger.add(call, step=i)
    state, metrics = step(state, batch)
    if pending is not None:
      m = _to_host(pending[1])
      _check_finite(phase, pending[0], m)
      if writer is not None and pending[0] % log_every == 0:
        writer.write(pending[0], m, flops=ledger.namespace_total(phase.partition("/")[0]))
      bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m.get('token_accuracy', 0):.2f}")
    pending = (i, metrics)
    if evaluate is not None and eval_every and (i + 1) % eval_every == 0:
      acc, _, calls = evaluate(state.params)
      ledger.add(calls, step=i)
      curve.append({"step": i + 1, "accuracy": acc})
  if pending is not None:
    _check_finite(phase, pending[0], _to_host(pending[1]))
  bar.close()
  return state, curve


class RLRun:
  """One GRPO or OPD run: `RLRun(...).run(state)`; see the module docstring."""

  def __init__(self, *, name: str, algo: str, loop: RLLoopConfig, step: steps_lib.JittedStep,
               sampler: Sampler, tokenizer, prompts_iter: Iterator[Sequence],
               verify: Callable[[Sequence, Sequence[str]], Sequence[float]],
               evaluator=None, writer: MetricsWriter | None = None,
               ledger: FlopLedger | None = None, ref_params=None, ref_fn=None, router=None,
               flops_offset: float = 0.0, checkpoint_fn: Callable | None = None,
               should_stop: Callable[[], bool] | None = None, pack: Callable | None = None):
    if algo not in ("grpo", "opd"):
      raise ValueError(f"RLRun: algo={algo!r}; expected 'grpo' or 'opd'")
    if algo == "opd" and router is None:
      raise ValueError("RLRun(algo='opd') needs a TeacherRouter")
    if (ref_params is None) != (ref_fn is None):
      raise ValueError("RLRun: pass both ref_params and ref_fn (GRPO with beta > 0) or neither")
    self.name, self.algo, self.loop, self.step = name, algo, loop, step
    self.sampler, self.tokenizer, self.prompts_iter, self.verify = (sampler, tokenizer,
                                                                    prompts_iter, verify)
    self.evaluator, self.writer = evaluator, writer
    self.ledger = ledger if ledger is not None else FlopLedger()
    self.ref_params, self.ref_fn, self.router = ref_params, ref_fn, router
    self.flops_offset = flops_offset
    self.checkpoint_fn, self.should_stop = checkpoint_fn, should_stop
    self.pack = pack  # batch -> batch with its packed stream (scoring.with_packing), or None
    self.curve: list[dict] = []
    self.next_eval_flops = loop.eval_every_flops or float("inf")

  # -------------------------------------------------------------------------------- pieces
  def set_eval_interval(self, every_flops: float) -> None:
    """Evaluate whenever cumulative training FLOPs cross a multiple of `every_flops` (0: off)."""
    self.loop = dataclasses.replace(self.loop, eval_every_flops=every_flops)
    self.next_eval_flops = every_flops or float("inf")
    while self.next_eval_flops <= self.training_flops():
      self.next_eval_flops += every_flops

  def training_flops(self) -> float:
    return self.flops_offset + self.ledger.total(training_only=True)

  def evaluate(self, state, step: int) -> dict:
    acc, lengths, calls = self.evaluator(state.params)
    self.ledger.add(calls, step=step)
    point = {"step": step, "flops": self.training_flops(), "accuracy": acc,
             "mean": float(np.mean(list(acc.values()))), "length": lengths}
    self.curve.append(point)
    if self.writer is not None:
      self.writer.write(step, {f"heldout/{d}": a for d, a in acc.items()} |
                        {"heldout/mean": point["mean"], "flops/cumulative": point["flops"]})
    return point

  def _rollout(self, params, examples, step: int):
    prompts = [encode_prompt(self.tokenizer, e.prompt) for e in examples]
    rng = jax.random.fold_in(jax.random.key(self.loop.seed), step)
    res = self.sampler.generate(params, prompts, rng, num_samples=self.loop.samples_per_prompt,
                                temperature=self.loop.temperature, top_k=self.loop.top_k,
                                top_p=self.loop.top_p)
    self.ledger.add(res.program_calls, step=step)
    G = self.loop.samples_per_prompt
    rows = [e for e in examples for _ in range(G)]
    texts = decode_completions(self.tokenizer, res)
    rewards = np.asarray(self.verify(rows, texts), np.float32)
    return res, rows, rewards

  def _batch(self, res, rows, rewards, step: int):
    batch = rollout_batch(res, rewards_B=rewards)
    if self.pack is not None:
      batch = self.pack(batch)
    extra = {}
    if self.algo == "grpo" and self.ref_fn is not None:
      batch = batch.replace(ref_logp_BT=self.ref_fn(self.ref_params, batch))
      call = self.ref_fn_call(batch)
      self.ledger.add(call, step=step)
    if self.algo == "opd":
      scores, calls, rows_per = self.router.score(batch, [e.domain for e in rows])
      self.ledger.add(calls, step=step)
      if self.router.want_logits:
        batch = batch.replace(teacher_logits_BTV=scores)
      else:
        batch = batch.replace(teacher_logp_BT=scores)
      extra = {f"teacher_rows/{k}": v for k, v in rows_per.items()}
    return batch, extra

  def ref_fn_call(self, batch):
    from smjax.flops import ProgramCall, shape_struct  # pylint: disable=import-outside-toplevel
    return ProgramCall("train/reference", self.ref_fn,
                       (jax.tree.map(shape_struct, self.ref_params),
                        jax.tree.map(shape_struct, batch)))

  def _domain_metrics(self, rows, rewards, res) -> dict[str, float]:
    out = {}
    lengths = np.asarray(res.lengths_B)
    domains = np.array([e.domain for e in rows])
    for d in sorted(set(domains)):
      sel = domains == d
      out[f"reward/{d}"] = float(rewards[sel].mean())
      out[f"length/{d}"] = float(lengths[sel].mean())
    G = self.loop.samples_per_prompt
    groups = rewards.reshape(-1, G)
    out["reward/mean"] = float(rewards.mean())
    out["reward/std"] = float(rewards.std())
    out["reward/zero_variance_groups"] = float(np.mean(groups.std(axis=1) == 0))
    return out

  # ---------------------------------------------------------------------------------- loop
  def run(self, state, *, start_step: int = 0) -> RunResult:
    if self.evaluator is not None and start_step == 0 and not self.curve:
      self.evaluate(state, 0)
    pending, last = None, {}
    bar = tqdm(range(start_step, self.loop.steps), desc=self.name,
               disable=not self.loop.progress, dynamic_ncols=True, initial=start_step,
               total=self.loop.steps)
    for i in bar:
      t0 = time.perf_counter()
      examples = next(self.prompts_iter)
      res, rows, rewards = self._rollout(state.params, examples, i)
      batch, extra = self._batch(res, rows, rewards, i)
      self.ledger.add(self.step.program_calls(state, batch), step=i)
      state, metrics = self.step(state, batch)
      host = self._domain_metrics(rows, rewards, res) | extra
      if pending is not None:
        last = self._finish(*pending, bar)
      pending = (i, metrics, host, time.perf_counter() - t0)
      done = i + 1
      every = self.loop.eval_every_steps
      due_steps = every and done % every == 0
      due_flops = self.training_flops() >= self.next_eval_flops
      if self.evaluator is not None and (due_steps or due_flops or done == self.loop.steps):
        self.set_eval_interval(self.loop.eval_every_flops)
        point = self.evaluate(state, done)
        bar.set_postfix_str(f"heldout={point['mean']:.3f}")
      if self.checkpoint_fn is not None:
        stop = self.should_stop is not None and self.should_stop()
        self.checkpoint_fn(self, state, done, force=stop or done == self.loop.steps)
        if stop:
          break
    if pending is not None:
      last = self._finish(*pending, bar)
    bar.close()
    return RunResult(state, self.ledger, self.curve, last)

  def _finish(self, step, metrics, host, seconds, bar) -> dict:
    m = _to_host(metrics)
    _check_finite(self.name, step, m)
    m |= host
    m["time/step_s"] = seconds
    m["flops/training"] = self.training_flops()
    if self.writer is not None and (step % self.loop.log_every == 0 or step == self.loop.steps - 1):
      self.writer.write(step, m)
    bar.set_postfix(reward=f"{m['reward/mean']:.2f}", loss=f"{m['loss']:.3f}",
                    step_s=f"{seconds:.2f}", refresh=False)
    return m
