"""Host loops: `run_sft` (supervised warm-up) and `run_rl` (GRPO or on-policy distillation).

One RL iteration: sample a group per prompt with the policy (`rollout`) → verify → build the
step's batch (`grpo_batch`: rewards, and the reference's log-probs when the KL is on; `opd_batch`:
each row scored by its domain's teacher) → one jitted update. Those two batch builders are the
only algorithm-specific pieces; `run_rl` takes one of them as `make_batch`.

Every program that ran is added to the run's FLOP ledger; held-out evaluation runs every
`eval_every_steps` steps and whenever the cumulative training FLOPs cross a multiple of
`eval_every_flops`, giving the accuracy-vs-FLOPs curve. Metrics go to TensorBoard and
metrics.jsonl, with a progress bar on a terminal, or without one (progress=False, or stderr not a
terminal) as plain lines on stdout every `log_every` steps and after each evaluation
(smjax.train.metrics.MetricLines). Metrics are fetched one step late, so the host prepares step
t+1 while the device runs step t. A non-finite step stops the run with a FloatingPointError naming
the phase, the step and every guard that fired (`check_finite`).

Legend (docs/design.md#shape-legend): B rows, G samples per prompt, T target positions.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from smjax.batch import decode_completions, encode_prompt, rollout_batch, sft_batch
from smjax.flops import ProgramCall, shape_struct
from smjax.ledger import FlopLedger
from smjax.models.transformer import ModelConfig, Transformer
from smjax.rollout import RolloutResult, Sampler
from smjax.train import steps as steps_lib
from smjax.train.guards import Collapse, CollapseError, check_finite
from smjax.train.metrics import MetricLines, MetricsWriter, progress_bar_shown, sci
from smjax.train.score import target_logprobs
from smjax.train.teachers import TeacherRouter

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ host values

def to_host(metrics) -> dict[str, float]:
  return {k: float(np.asarray(v)) for k, v in jax.device_get(metrics).items()}


# ---------------------------------------------------------------------------- checkpoints

class SaveCadence:
  """When a running phase saves: every `every_steps` steps done (0: off) and whenever
  `every_seconds` of wall time have passed since its last save or its start (0: off). The clock
  bounds what a killed process loses where steps are slow (phases side by side on few cores: a
  step-count cadence alone lost 150-175 steps of two seeds' MOPD runs, about 40 minutes, when a
  session ended between two of its saves); saving changes nothing a resumed run computes."""

  def __init__(self, every_steps: int = 0, every_seconds: float = 0.0,
               clock: Callable[[], float] | None = None):
    self.every_steps, self.every_seconds = every_steps, every_seconds
    self.clock = clock or time.monotonic
    self.last = self.clock()

  def due(self, done: int) -> bool:
    """Whether a save is due after `done` steps; a True resets the clock (the caller saves)."""
    now = self.clock()
    if ((self.every_steps and done % self.every_steps == 0) or
        (self.every_seconds and now - self.last >= self.every_seconds)):
      self.last = now
      return True
    return False


# ------------------------------------------------------------------------------------- SFT

def run_sft(*, phase: str, state, step: steps_lib.JittedStep, examples_iter: Iterator[Sequence],
            tokenizer, seq_len: int, num_steps: int, ledger: FlopLedger,
            writer: MetricsWriter | None = None, log_every: int = 50, progress: bool = True,
            evaluate: Callable | None = None, eval_every: int = 0, start_step: int = 0,
            save: Callable[[int, Any], None] | None = None, checkpoint_every: int = 0,
            checkpoint_seconds: float = 0.0, should_stop: Callable[[], bool] | None = None):
  """Supervised warm-up on gold solutions. FLOPs go to `phase` (e.g. base/sft). Returns (state,
  curve of {"step", "accuracy"} when `evaluate` is given every `eval_every` steps).

  start_step: the step a resumed run continues from (its state, stream and ledger restored).
  save: `(steps done, state)`, every `checkpoint_every` steps, after every `checkpoint_seconds`
  of wall time (SaveCadence), at the end and on a stop.
  should_stop: polled after every step (e.g. a SIGTERM flag): a stop saves and returns early
  (the caller asks should_stop again to tell).
  progress: a progress bar where stderr is a terminal; else a MetricLines line on stdout every
  `log_every` steps (tokens/s: the batch's positions over the steps' wall time)."""
  pending, curve = None, []
  cadence = SaveCadence(checkpoint_every, checkpoint_seconds)
  bar_on = progress_bar_shown(progress)
  lines = MetricLines(phase, num_steps, log_every, on=not bar_on)
  flops = lambda: ledger.namespace_total(phase.partition("/")[0])  # noqa: E731

  def finish(i, metrics, tokens, seconds, done_flops, last=False):
    m = to_host(metrics)
    check_finite(phase, i, m)
    if writer is not None and i % log_every == 0:
      writer.write(i, m, flops=done_flops)
    bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m.get('token_accuracy', 0):.2f}")
    lines.step(i + 1, m, flops=done_flops, tokens=tokens, seconds=seconds, last=last)

  bar = tqdm(range(start_step, num_steps), desc=phase, disable=not bar_on, dynamic_ncols=True)
  for i in bar:
    t0 = time.perf_counter()
    examples = next(examples_iter)
    batch = sft_batch(tokenizer, examples, [e.solution for e in examples],
                      seq_len=seq_len)
    ledger.add(steps_lib.step_program_calls(step, state, batch, phase=phase), step=i)
    state, metrics = step(state, batch)
    if pending is not None:
      finish(*pending)   # waits for the previous step: this iteration's time is a step's
    pending = (i, metrics, batch.tokens_BS.size, time.perf_counter() - t0, flops())
    if evaluate is not None and eval_every and (i + 1) % eval_every == 0:
      fields, calls = evaluate(state.params)
      ledger.add(calls, step=i)
      curve.append({"step": i + 1, "accuracy": fields["accuracy"]})
      lines.evaluation(i + 1, fields, flops=flops())
    stopped = should_stop is not None and should_stop()
    if save is not None and (cadence.due(i + 1) or stopped or i + 1 == num_steps):
      save(i + 1, state)
    if stopped:
      break
  if pending is not None:
    finish(*pending, last=True)
  bar.close()
  return state, curve


# -------------------------------------------------------------------------- rollouts, batches

@dataclasses.dataclass
class Rollout:
  """One iteration's samples: G rows per prompt ([p0 x G, p1 x G, ...]), each row's example and
  reward (1.0 = verified correct)."""
  result: RolloutResult
  examples: list                 # the example of each row
  rewards_B: np.ndarray


def rollout(sampler: Sampler, params, examples: Sequence, *, tokenizer, verify, rng,
            samples_per_prompt: int, temperature: float = 1.0, top_k: int = 0,
            top_p: float = 1.0) -> tuple[Rollout, list[ProgramCall]]:
  """Samples `samples_per_prompt` completions of each example's prompt and verifies them."""
  prompts = [encode_prompt(tokenizer, e) for e in examples]
  res = sampler.generate(params, prompts, rng, num_samples=samples_per_prompt,
                         temperature=temperature, top_k=top_k, top_p=top_p)
  rows = [e for e in examples for _ in range(samples_per_prompt)]
  rewards = np.asarray(verify(rows, decode_completions(tokenizer, res)), np.float32)
  return Rollout(res, rows, rewards), res.program_calls


@dataclasses.dataclass(frozen=True)
class BatchLayout:
  """How `grpo_batch` / `opd_batch` lay out the step's batch (smjax.batch.Layout): each prompt
  once per group of rows, completions packed, and the step's micro-batches (a packed batch
  carries one plan row per micro-batch)."""
  share_prompt: bool = True
  packed: bool = False
  micro_batches: int = 1


@functools.lru_cache(maxsize=None)
def logprob_program(cfg: ModelConfig):
  """`(params, batch) -> logp_BT` of a model config, jitted once per config (every phase of a
  study that scores with the same model shares its compiled programs)."""
  return jax.jit(functools.partial(target_logprobs, Transformer(cfg)))


@dataclasses.dataclass(frozen=True, eq=False)
class Reference:
  """The frozen reference model of GRPO's KL term: its log-probs on the policy's samples."""
  cfg: ModelConfig
  params: Any


def grpo_batch(ro: Rollout, *, layout: BatchLayout = BatchLayout(),
               reference: Reference | None = None):
  """GRPO's step batch of a rollout: rewards, behaviour log-probs and, with `reference`, the
  reference's log-probs. Returns (batch, program calls, host metrics)."""
  batch = rollout_batch(ro.result, rewards_B=ro.rewards_B, share_prompt=layout.share_prompt,
                        packed=layout.packed, micro_batches=layout.micro_batches)
  calls = []
  if reference is not None:
    fn = logprob_program(reference.cfg)
    batch = batch.replace(ref_logp_BT=fn(reference.params, batch))
    calls.append(ProgramCall("train/reference", fn,
                             (jax.tree.map(shape_struct, reference.params),
                              jax.tree.map(shape_struct, batch))))
  return batch, calls, {}


def opd_batch(ro: Rollout, *, router: TeacherRouter, layout: BatchLayout = BatchLayout()):
  """OPD's step batch of a rollout: each row scored by its domain's teacher (log-probs of the
  sampled tokens, or logits for the full-vocab objectives). Returns (batch, program calls, host
  metrics: rows per teacher)."""
  batch = rollout_batch(ro.result, share_prompt=layout.share_prompt, packed=layout.packed,
                        micro_batches=layout.micro_batches)
  scores, calls, rows_per = router.score(batch, [e.domain for e in ro.examples])
  field = "teacher_logits_BTV" if router.want_logits else "teacher_logp_BT"
  batch = batch.replace(**{field: scores})
  return batch, calls, {f"teacher_rows/{k}": v for k, v in rows_per.items()}


def completions_text(shown: Sequence[dict]) -> str:
  """Sample completions ({"prompt", "completion", "reward"}, smjax.train.evaluate) as markdown
  for TensorBoard's text tab and metrics.jsonl."""
  return "\n\n".join(f"`{s['prompt']}` → `{s['completion']}` (reward {s['reward']:g})"
                     for s in shown)


def rollout_metrics(ro: Rollout) -> dict[str, float]:
  """Per-domain reward and completion length, the share of completions that ran to the token cap
  (`length/at_cap`: truncated, unless the cap's last token ended them), the reward's spread and the
  share of groups whose rewards are all equal (no GRPO signal: a solved or a hopeless prompt),
  overall and per domain (where joint GRPO spends samples on a domain it has solved); the
  completion tokens sampled."""
  out = {}
  lengths = np.asarray(ro.result.lengths_B)
  cap = getattr(getattr(ro.result, "completion_BC", None), "shape", (0, 0))[-1]
  domains = np.array([e.domain for e in ro.examples])
  groups = ro.rewards_B.reshape(-1, ro.result.num_samples)
  flat = groups.std(axis=1) == 0
  group_domains = domains.reshape(-1, ro.result.num_samples)[:, 0]
  for d in sorted(set(domains)):
    sel = domains == d
    out[f"reward/{d}"] = float(ro.rewards_B[sel].mean())
    out[f"length/{d}"] = float(lengths[sel].mean())
    out[f"zero_variance_groups/{d}"] = float(flat[group_domains == d].mean())
  out["tokens/sampled"] = float(lengths.sum())   # MetricLines' tokens/s
  out["reward/mean"] = float(ro.rewards_B.mean())
  out["reward/std"] = float(ro.rewards_B.std())
  out["reward/zero_variance_groups"] = float(np.mean(flat))
  if cap:
    out["length/at_cap"] = float(np.mean(lengths >= cap))
  return out


# -------------------------------------------------------------------------------------- RL

@dataclasses.dataclass(frozen=True)
class RLLoopConfig:
  steps: int
  samples_per_prompt: int
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  eval_every_steps: int = 0
  eval_every_flops: float = 0.0
  # Also evaluate once the run's own training FLOPs have grown by this fraction since the last
  # evaluation (0: off): evaluations dense where a curve rises fast (its start), so that a first
  # passage there is bracketed to about this share of its FLOPs, and the grid's later on.
  eval_growth: float = 0.0
  log_every: int = 10
  checkpoint_every: int = 0     # steps between `save` calls (the last step and a stop always save)
  checkpoint_seconds: float = 0.0   # also save once this much wall time has passed (0: off)
  seed: int = 0
  progress: bool = True
  collapse_window: int = 25     # steps a collapse sign must last to stop the run (0: no check)
  # A collapse ends the run as an outcome (RunResult.collapsed, saved) instead of raising a
  # CollapseError: for a study, where a route whose policy collapsed is a result to report.
  collapse_ends: bool = False

  def __post_init__(self):
    for name in ("steps", "samples_per_prompt", "log_every"):
      if getattr(self, name) < 1:
        raise ValueError(f"RLLoopConfig.{name}={getattr(self, name)} must be >= 1")
    for name in ("eval_every_steps", "eval_every_flops", "checkpoint_every", "checkpoint_seconds",
                 "collapse_window", "eval_growth"):
      if getattr(self, name) < 0:
        raise ValueError(f"RLLoopConfig.{name}={getattr(self, name)} must be >= 0 (0: off)")


@dataclasses.dataclass
class RLProgress:
  """Where an RL run stands besides its train state: what a checkpoint saves and a resume
  restores. `next_eval_flops`: the training FLOPs at which the next evaluation is due."""
  step: int = 0
  ledger: FlopLedger = dataclasses.field(default_factory=FlopLedger)
  curve: list = dataclasses.field(default_factory=list)
  next_eval_flops: float = math.inf
  collapsed: dict | None = None   # {"step", "what"}: the collapse that ended the run


@dataclasses.dataclass
class RunResult:
  state: Any
  ledger: FlopLedger
  curve: list[dict]              # {"step", "flops", "mean", and the evaluator's fields}
  last_metrics: dict
  stopped: bool = False          # `should_stop` ended the run early (after a save)
  reached: bool = False          # a curve point met `stop_at` (the run then ran on, `run_on`)
  stop_point: int | None = None  # the index in `curve` of the first point that met it
  collapsed: dict | None = None  # {"step", "what"} when a collapse ended it (loop.collapse_ends)


def _next_eval(every: float, done_flops: float, growth: float = 0.0,
               offset: float = 0.0) -> float:
  """The first multiple of `every` past `done_flops` (inf when `every` is 0), or earlier, once
  the run's own FLOPs (`done_flops - offset`) have grown by `growth` (0: off)."""
  nxt = math.inf
  if every:
    nxt = every
    while nxt <= done_flops:
      nxt += every
  if growth:
    nxt = min(nxt, offset + (done_flops - offset) * (1 + growth))
  return nxt


def first_hold(curve: Sequence[dict], rule: Callable[[dict], bool] | None) -> int | None:
  """The index of the first point of `curve` at which the stop rule `rule` holds, asking it about
  each point in order until then (as run_rl does after each evaluation, and again over the whole
  curve when a run resumes); None when it never holds (or `rule` is None). A report replays
  another rule on a recorded curve with it (smjax.study.report.replay_distillation)."""
  if rule is None:
    return None
  return next((i for i, p in enumerate(curve) if rule(p)), None)


def run_on_end(curve: Sequence[dict], at: int, evals: int, fraction: float,
               offset: float = 0.0) -> int | None:
  """The index of the point at which a run that met its stop rule at point `at` has run on far
  enough and ends (run_rl's `run_on`: at least `evals` more evaluations and `fraction` more of
  its own FLOPs, a point's "flops" less `offset`); None when the curve ends before that."""
  own = lambda i: float(curve[i]["flops"]) - offset  # noqa: E731
  return next((j for j in range(at + evals, len(curve))
               if own(j) >= (1 + fraction) * own(at)), None)


def run_rl(state, *, name: str, loop: RLLoopConfig, step: steps_lib.JittedStep,
           make_batch: Callable, sampler: Sampler, tokenizer, prompts: Iterator[Sequence],
           verify: Callable[[Sequence, Sequence[str]], Sequence[float]], evaluator=None,
           writer: MetricsWriter | None = None, progress: RLProgress | None = None,
           flops_offset: float = 0.0, fix_eval_every: Callable[[float], float] | None = None,
           save: Callable[[int, Any, RLProgress], None] | None = None,
           should_stop: Callable[[], bool] | None = None,
           stop_at: Callable[[dict], bool] | None = None,
           run_on: tuple[int, float] = (0, 0.0), stop_ends: bool = True,
           on_eval: Callable[[dict, Any, RLProgress], None] | None = None,
           collapse_advice: str = "a learning rate too high for this model") -> RunResult:
  """A GRPO or OPD run of at most `loop.steps` iterations from `state` (module docstring).

  make_batch: `(Rollout) -> (batch, program calls, host metrics)`, e.g.
    `functools.partial(grpo_batch, layout=...)` or `functools.partial(opd_batch, router=...)`.
  evaluator: `params -> (fields, program calls)`, fields with "accuracy": {domain: acc}
    (smjax.train.evaluate.Evaluator); each evaluation is a curve point of them.
  progress: a resumed run's ledger, curve and step (default: a fresh run from step 0).
  flops_offset: training FLOPs spent before this run (an arm's earlier phases), for the grid.
  fix_eval_every: when `loop.eval_every_flops` is 0, called once after the first step with its
    training FLOPs; returns the FLOP interval of the evaluation grid from then on.
  save: `(step, state, progress)`, every `loop.checkpoint_every` steps, after every
    `loop.checkpoint_seconds` of wall time (SaveCadence), at the end and on a stop.
  should_stop: polled after every step (e.g. a SIGTERM flag); a stop saves and returns early.
  stop_at: `(curve point) -> bool`, asked after every evaluation: the first point that meets it
    (`reached`, `stop_point`), e.g. a distillation that has reached its target, ends the run once
    it has run on past it by `run_on` = (at least this many more evaluations, and at least this
    fraction more of the run's own training FLOPs), so that its curve does not end at the
    crossing; (0, 0.0) ends it there. A resumed run that had finished running on returns at once.
    `stop_ends=False`: the rule's point is recorded all the same and the run goes on to its cap
    (`loop.steps`), so that what follows the rule's end is measured too.
  on_eval: `(curve point, state, progress)` after every evaluation (e.g. to keep a checkpoint,
    and the ledger's totals then, the first time the policy crosses a mark).
  collapse_advice: what the collapse check (`Collapse`, `loop.collapse_window`) names as the
    likely cause when it stops the run with a CollapseError. With `loop.collapse_ends` a collapse
    ends the run instead: a warning, a save, and RunResult.collapsed ({"step", "what"}); a run
    resumed from that save returns at once.
  Without a progress bar (`loop.progress` off, or stderr not a terminal) it prints a MetricLines
  line every `loop.log_every` steps (tokens/s: completion tokens sampled over the steps' wall
  time, rollout and update) and one per evaluation.
  """
  prog = progress if progress is not None else RLProgress()
  cadence = SaveCadence(loop.checkpoint_every, loop.checkpoint_seconds)
  every = loop.eval_every_flops
  if progress is None:
    prog.next_eval_flops = (_next_eval(every, flops_offset, loop.eval_growth, flops_offset)
                            if loop.eval_growth else every or math.inf)
  training = lambda: flops_offset + prog.ledger.total(training_only=True)
  vocab = getattr(getattr(sampler, "cfg", None), "vocab_size", None)
  collapse = Collapse(name, loop.collapse_window, vocab, collapse_advice)
  for p in prog.curve:
    collapse.best = max(collapse.best, p["mean"])
  bar_on = progress_bar_shown(loop.progress)
  lines = MetricLines(name, loop.steps, loop.log_every, on=not bar_on,
                      last_point=prog.curve[-1] if prog.curve else None)

  def evaluate(state, done: int) -> dict:
    fields, calls = evaluator(state.params)
    prog.ledger.add(calls, step=done)
    acc = fields["accuracy"]
    point = {"step": done, "flops": training(), "mean": float(np.mean(list(acc.values())))}
    point |= fields
    prog.curve.append(point)
    collapse.evaluation(done, point["mean"])
    if writer is not None:
      writer.write(done, {f"heldout/{d}": a for d, a in acc.items()} |
                   {f"heldout_greedy/{d}": a for d, a in fields.get("greedy", {}).items()} |
                   {f"heldout_at_cap/{d}": a for d, a in fields.get("at_cap", {}).items()} |
                   {"heldout/mean": point["mean"], "flops/cumulative": point["flops"]},
                   texts={f"completions/{d}": completions_text(shown)
                          for d, shown in fields.get("completions", {}).items()})
    lines.evaluation(done, point, flops=point["flops"])
    return point

  def finish(i, metrics, host, seconds, last=False) -> dict:
    m = to_host(metrics)
    check_finite(name, i, m)
    m |= host
    m["time/step_s"] = seconds
    collapse.step(i + 1, m)   # steps done, as the metric lines count them
    if writer is not None and (i % loop.log_every == 0 or i == loop.steps - 1):
      writer.write(i, m)
    bar.set_postfix(reward=f"{m['reward/mean']:.2f}", loss=f"{m['loss']:.3f}",
                    step_s=f"{seconds:.2f}", flops=sci(m["flops/training"]), refresh=False)
    lines.step(i + 1, m, flops=m["flops/training"], tokens=m.get("tokens/sampled", 0.0),
               seconds=seconds, last=last)
    return m

  def stop_index():
    return first_hold(prog.curve, stop_at)

  def ran_on(at) -> bool:   # the run has run on far enough past `at` by its last point
    return at is not None and run_on_end(prog.curve, at, *run_on, offset=flops_offset) is not None

  if evaluator is not None and prog.step == 0 and not prog.curve:
    evaluate(state, 0)
    if on_eval is not None:
      on_eval(prog.curve[-1], state, prog)
  at = stop_index()
  if (stop_ends and ran_on(at)) or (prog.collapsed and loop.collapse_ends):   # had ended
    return RunResult(state, prog.ledger, prog.curve, {}, False, at is not None, at,
                     prog.collapsed)
  pending, last, stopped, finished = None, {}, False, False
  bar = tqdm(range(prog.step, loop.steps), desc=name, disable=not bar_on,
             dynamic_ncols=True, initial=prog.step, total=loop.steps)

  def collapsed(e: CollapseError, step_: int) -> None:   # loop.collapse_ends: the run ends here
    if not loop.collapse_ends:
      raise e
    prog.collapsed = {"step": step_, "what": e.what}
    collapse.window = 0   # checked no more: the steps still pending are logged as they were
    log.warning("%s: the policy collapsed at step %d (%s); the run ends there, its collapse "
                "reported (collapse_window=0 runs on)", name, step_, e.what)

  for i in bar:
    t0 = time.perf_counter()
    rng = jax.random.fold_in(jax.random.key(loop.seed), i)
    ro, calls = rollout(sampler, state.params, next(prompts), tokenizer=tokenizer, verify=verify,
                        rng=rng, samples_per_prompt=loop.samples_per_prompt,
                        temperature=loop.temperature, top_k=loop.top_k, top_p=loop.top_p)
    prog.ledger.add(calls, step=i)
    batch, calls, host = make_batch(ro)
    prog.ledger.add(calls, step=i)
    prog.ledger.add(steps_lib.step_program_calls(step, state, batch), step=i)
    state, metrics = step(state, batch)
    host = rollout_metrics(ro) | host
    host["flops/training"] = training()   # up to this step's update
    done = prog.step = i + 1
    if pending is not None:
      try:
        last = finish(*pending)
      except CollapseError as e:
        collapsed(e, pending[0] + 1)
    pending = (i, metrics, host, time.perf_counter() - t0)
    due_steps = loop.eval_every_steps and done % loop.eval_every_steps == 0
    if not prog.collapsed and evaluator is not None and (
        due_steps or training() >= prog.next_eval_flops or done == loop.steps):
      prog.next_eval_flops = _next_eval(every, training(), loop.eval_growth, flops_offset)
      try:
        point = evaluate(state, done)
      except CollapseError as e:
        collapsed(e, done)
        point = prog.curve[-1]
      bar.set_postfix_str(f"heldout={point['mean']:.3f}")
      if on_eval is not None:
        on_eval(point, state, prog)
      if at is None and stop_at is not None and stop_at(point):
        at = len(prog.curve) - 1
      finished = stop_ends and ran_on(at)
    if done == 1 and not every and fix_eval_every is not None:
      every = fix_eval_every(prog.ledger.total(training_only=True))
      prog.next_eval_flops = min(prog.next_eval_flops, _next_eval(every, training()))
    stopped = should_stop is not None and should_stop()
    ended = finished or prog.collapsed is not None
    if save is not None and (cadence.due(done) or stopped or ended or done == loop.steps):
      save(done, state, prog)
    if stopped or ended:
      break
  if pending is not None:
    try:   # a collapse seen only now, on the cap's step, is recorded (the run ended anyway)
      last = finish(*pending, last=True)
    except CollapseError as e:
      collapsed(e, pending[0] + 1)
  bar.close()
  return RunResult(state, prog.ledger, prog.curve, last, stopped, at is not None, at,
                   prog.collapsed)


def run_rl_checkpointed(state, *, checkpointer, prompts, open_writer: Callable[[], Any],
                        kept: dict[str, dict] | None = None, **run_rl_kwargs) -> RunResult:
  """`run_rl` resumable from `checkpointer` (smjax.checkpoint.Checkpointer): the wiring a study
  phase (smjax.study.phases.rl_phase) and the short API (smjax.api) share, so both checkpoint and
  resume alike. The newest intact checkpoint, when there is one, gives back the state, the
  prompt stream's position (`prompts`: a PromptStream), the ledger, the curve and the next
  evaluation's FLOPs; every save stores them with `kept` ({key: dict the caller fills, e.g. in
  on_eval}; restored in place). SIGTERM saves and stops (`RunResult.stopped`; the caller says so).
  `open_writer() -> MetricsWriter` is opened once the checkpoint is read; a resumed run's
  metrics rows past its checkpoint are dropped. `run_rl_kwargs`: run_rl's (not progress, save,
  should_stop, writer)."""
  from smjax.preemption import PreemptionGuard  # pylint: disable=import-outside-toplevel
  kept = {} if kept is None else kept
  name = run_rl_kwargs["name"]
  progress = None
  restored = checkpointer.restore_latest(state)
  if restored is not None:
    for key, into in kept.items():
      into.update(restored.extra.get(key) or {})
    state = restored.state
    prompts.set_state(restored.data_state)
    progress = RLProgress(step=restored.step, ledger=FlopLedger.from_dict(restored.ledger),
                          curve=restored.extra["curve"],
                          next_eval_flops=restored.extra["next_eval_flops"],
                          collapsed=restored.extra.get("collapsed"))
    log.warning("phase %s: resumed from its checkpoint at step %d", name, restored.step)

  def save(step_, state_, prog):
    checkpointer.save(step_, state_, data_state=prompts.get_state(), ledger=prog.ledger,
                      extra={"curve": prog.curve, "next_eval_flops": prog.next_eval_flops,
                             "collapsed": prog.collapsed} | kept)

  # The checkpointer is a context manager: an error inside the run (a collapse, a non-finite
  # step) waits for its pending async save before it propagates, so no save is left running.
  with checkpointer, PreemptionGuard() as guard, open_writer() as writer:
    if restored is not None:   # training rows are logged by step index, evaluations by steps done
      at = restored.step
      writer.keep_only(lambda r: r["step"] < at or (r["step"] == at and "loss" not in r))
    return run_rl(state, prompts=prompts, writer=writer, progress=progress, save=save,
                  should_stop=guard.should_stop, **run_rl_kwargs)
