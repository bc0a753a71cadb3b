"""KV-cache sampler for group rollouts: one jitted prefill, then a `lax.while_loop` decode.

`Sampler.generate(params, prompts, rng, num_samples=G)` left-pads the prompts (host, the only host
work) to a length bucket, runs the prompt batch through the model once, repeats the KV cache G times
on the batch axis and decodes all B·G rows in one compiled loop that stops early once every row is
done. Rows come out ordered [prompt0 x G, prompt1 x G, ...].

Per-row stop: a row is done after it emits an EOS id or completes a stop sequence (token ids,
matched within the completion); that token is part of the completion and masked in (the policy
chose it); later slots hold `pad_id`, mask 0, log-prob 0. The host reads back two small things per
call, the number of decode steps run and the lengths, for the FLOP ledger.

Log-probs. `logprobs_BC` is log π(y_c) under the policy at temperature 1: the unmodified
`log_softmax` of the raw logits at the sampled token, whatever temperature / top-k / top-p was used
to sample. That is the behaviour log-prob the GRPO ratio and OPD need.

Randomness: row r's token t is drawn by inverse cdf from u[r, t], where
u[r] = uniform(fold_in(rng, r), [C]) is drawn once at prefill. A row's draws do not depend on the
batch size, the sharding or the other rows: G copies of a prompt sampled from one shared prefill
give exactly the tokens G separate copies of the prompt would.

The device programs (the decode loop's state, sampling, prefill, the decode loop in stages and
why the step is laid out as it is) are in smjax.decode; this module is the host side that runs
them and accounts for them.

FLOPs (docs/design.md#flop-accounting): each result carries `program_calls`: the prefill program
once and, per decode stage, the separately jitted single decode step on that stage's cache (the
exact loop body) times the decode steps that ran in it.
The "useful" count is `smjax.flops.analytic_flops` of the real (unpadded) tokens.

Legend (docs/design.md#shape-legend): B rows (prompts x G), G samples per prompt, P prompt length
(bucketed), C new (completion) tokens, V vocab; stop sets are named in words
(`stop_tokens`: [stop sequences, window]).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from smjax import sharding as shd
from smjax.decode import (SamplingParams, decode_loop, decode_loop_growing, decode_params,
                          decode_stages, decode_step_jit, grow_cache, prefill)
from smjax.flops import ProgramCall, analytic_flops, shape_struct
from smjax.models.transformer import ModelConfig, positions_from_mask


@dataclasses.dataclass
class RolloutResult:
  """One `generate` call. Rows B = num_prompts x num_samples, ordered [p0 x G, p1 x G, ...].

  prompt_BP / prompt_mask_BP: each row's prompt, left-padded to the bucket length P.
  completion_BC / completion_mask_BC: sampled tokens (pad after a row's stop) and their mask.
  lengths_B: masked-in completion tokens, EOS / stop-sequence tokens included.
  logprobs_BC: log-softmax of the raw logits (temperature 1) at the sampled tokens, 0 where masked.
  program_calls: [prefill x 1, decode step x the steps run in each decode stage] for the FLOP
    ledger; each one's `useful` is the analytic FLOPs of the real (unpadded) tokens over all its
    calls.
  """
  prompt_BP: jax.Array
  prompt_mask_BP: jax.Array
  completion_BC: jax.Array
  completion_mask_BC: jax.Array
  lengths_B: jax.Array
  logprobs_BC: jax.Array
  program_calls: list[ProgramCall]
  steps_run: int
  num_prompts: int
  num_samples: int


@flax.struct.dataclass
class FullSequence:
  """prompt ++ completion, the view a train step consumes.

  Off by one: logits at position s predict token s+1. Score completion tokens with
  `log_softmax(logits_BSV[:, :-1])` gathered at `tokens_BS[:, 1:]`, masked by `loss_mask_BS[:, 1:]`.
  """
  tokens_BS: jax.Array
  positions_BS: jax.Array    # cumsum(mask) - 1: the positions the sampler used
  mask_BS: jax.Array         # attention mask: real prompt tokens and masked-in completion tokens
  loss_mask_BS: jax.Array    # 1 only on masked-in completion tokens


# ------------------------------------------------------------------------------------ FLOPs

def _useful_flops(cfg: ModelConfig, prompt_lens, lengths_B,
                  stage_ts: Sequence[tuple[int, int]]) -> tuple[float, list[float]]:
  """(prefill, [decode per stage]) analytic FLOPs of the real tokens. Prefill: every prompt token
  once, logits at the last one. Decode: a row of completion length L forwards its first L-1 tokens,
  token j (0-based) at loop iteration t = j + 1, attending to prompt_len + t keys; a stage [a, b)
  counts the iterations a <= t < b."""
  p = np.asarray(prompt_lens, np.float64)
  prefill = analytic_flops(cfg, tokens=p.sum(), context_len=(p * (p + 1) / 2).sum() / p.sum(),
                           backward=False, logit_tokens=len(p))
  p_B = np.repeat(p, len(lengths_B) // len(p))
  last_B = np.asarray(lengths_B, np.float64)  # iterations t = 1 .. L-1 feed a token
  decode = []
  for a, b in stage_ts:
    fed_B = np.maximum(np.minimum(last_B, b) - a, 0)
    ctx = (fed_B * p_B + fed_B * (2 * a + fed_B - 1) / 2).sum()
    decode.append(float(analytic_flops(cfg, tokens=fed_B.sum(),
                                       context_len=ctx / max(fed_B.sum(), 1), backward=False)))
  return float(prefill), decode


@jax.jit
def _full_sequence(prompt_BP, prompt_mask_BP, completion_BC, completion_mask_BC) -> FullSequence:
  mask_BS = jnp.concatenate([prompt_mask_BP, completion_mask_BC], axis=1)
  return FullSequence(
      tokens_BS=jnp.concatenate([prompt_BP, completion_BC], axis=1),
      positions_BS=positions_from_mask(mask_BS),
      mask_BS=mask_BS,
      loss_mask_BS=jnp.concatenate([jnp.zeros_like(prompt_mask_BP), completion_mask_BC], axis=1))


def full_sequence(result: RolloutResult) -> FullSequence:
  """tokens / positions / attention mask / loss mask over prompt ++ completion (see FullSequence)."""
  return _full_sequence(result.prompt_BP, result.prompt_mask_BP, result.completion_BC,
                        result.completion_mask_BC)


# ------------------------------------------------------------------------------------- host

def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def bucket_length(n: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= n."""
  for b in sorted(buckets):
    if b >= n:
      return b
  raise ValueError(f"prompt length {n} exceeds the largest prompt bucket {max(buckets)}")


def pad_prompts(prompts: Sequence[Sequence[int]], *, length: int, pad_id: int, rows: int | None = None):
  """Left-pads token lists into numpy (tokens [rows, length] int32, mask [rows, length] bool);
  rows beyond len(prompts) are all padding."""
  rows = len(prompts) if rows is None else rows
  tok = np.full((rows, length), pad_id, np.int32)
  mask = np.zeros((rows, length), bool)
  for i, p in enumerate(prompts):
    if p:
      tok[i, length - len(p):] = p
      mask[i, length - len(p):] = True
  return tok, mask


# The default decode stages (Sampler): one per STAGE_TOKENS new tokens, at most MAX_STAGES.
STAGE_TOKENS, MAX_STAGES = 32, 8


class Sampler:
  """Group rollouts from a model config. Programs compile once per (prompt bucket, number of
  prompts, num_samples); greedy, temperature, top-k/p, EOS ids and most stop sets are arguments.

  prompt_buckets: sorted prompt lengths to pad to (default: powers of two from 8 up to
  cfg.max_seq_len). eos_id: an id, several ids, or None (no EOS stop). mesh: None for one device,
  else rows are sharded over the mesh's ("data", "fsdp") axes (parameters may be sharded already).
  decode_stages: how many spans the completion is decoded in, each on a cache holding only the
  slots filled by its end (`decode_stages`); each stage is one more `while_loop` in the compiled
  program. None (default): one stage per `STAGE_TOKENS` (32) new tokens, at most `MAX_STAGES`
  (8), so completions up to 32 tokens run one loop over the whole cache (docs/performance.md: at
  64 rows x 64 tokens two stages beat one loop, at 512 tokens eight beat four; spans of 8 tokens
  cost more than they save).
  """

  def __init__(self, cfg: ModelConfig, *, max_new_tokens: int, eos_id: int | Sequence[int] | None,
               pad_id: int, prompt_buckets: Sequence[int] | None = None, mesh=None,
               decode_stages: int | None = None):
    if max_new_tokens < 1:
      raise ValueError(f"Sampler: {max_new_tokens=} must be >= 1")
    if decode_stages is not None and decode_stages < 1:
      raise ValueError(f"Sampler: {decode_stages=} must be >= 1 (or None for one per "
                       f"{STAGE_TOKENS} tokens)")
    # how many stages the completion is split into (decode_stages(); fewer if it is short)
    self.stages = decode_stages or min(MAX_STAGES, max(1, -(-max_new_tokens // STAGE_TOKENS)))
    self.cfg, self.max_new_tokens, self.pad_id, self.mesh = cfg, max_new_tokens, pad_id, mesh
    eos = () if eos_id is None else ((eos_id,) if isinstance(eos_id, (int, np.integer)) else eos_id)
    self.eos_ids = tuple(int(e) for e in eos)
    if prompt_buckets is None:
      prompt_buckets, b = [], 8
      while b < cfg.max_seq_len:
        prompt_buckets.append(b)
        b *= 2
      prompt_buckets.append(cfg.max_seq_len)
    self.prompt_buckets = tuple(sorted(int(b) for b in prompt_buckets))
    self._batch_shards = 1 if mesh is None else int(np.prod([mesh.shape[a] for a in shd.BATCH_AXES]))
    self._shapes: dict = {}   # `_eval_shape`'s answers, per argument shapes

  def _eval_shape(self, fn, tree, **kw):
    """jax.eval_shape of `fn(tree, **kw)`, traced once per argument shapes: the ledger's abstract
    decode arguments are the same for every call of one batch shape (an evaluation makes tens of
    calls, each of which traced them again)."""
    leaves, treedef = jax.tree.flatten(tree)
    key = (fn, treedef, tuple(sorted(kw.items())),
           tuple((getattr(x, "shape", None), getattr(x, "dtype", type(x)),
                  getattr(x, "sharding", None)) for x in leaves))
    if key not in self._shapes:
      self._shapes[key] = jax.eval_shape(functools.partial(fn, **kw), tree)
    return self._shapes[key]

  def _place(self, x, batched: bool):
    if self.mesh is None:
      return jnp.asarray(x)
    divisible = batched and x.shape[0] % self._batch_shards == 0
    return jax.device_put(x, shd.batch_sharding(self.mesh, x.ndim) if divisible
                          else shd.replicated(self.mesh))

  def _place_params(self, params):
    if self.mesh is None:
      return params
    def put(x):
      s = getattr(x, "sharding", None)
      on_mesh = isinstance(s, NamedSharding) and s.mesh == self.mesh
      return x if on_mesh else jax.device_put(x, shd.replicated(self.mesh))
    return jax.tree.map(put, params)

  def _check(self, prompts, num_samples, temperature, top_k, top_p, stop_sequences):
    if not prompts:
      raise ValueError("Sampler.generate: prompts is empty")
    V = self.cfg.vocab_size
    for i, p in enumerate(prompts):
      if not len(p):
        raise ValueError(f"Sampler.generate: prompts[{i}] is empty (at least one token is needed)")
      if min(p) < 0 or max(p) >= V:
        raise ValueError(f"Sampler.generate: prompts[{i}] has ids outside [0, {V})")
      if len(p) + self.max_new_tokens > self.cfg.max_seq_len:
        raise ValueError(f"Sampler.generate: prompts[{i}] length {len(p)} + max_new_tokens="
                         f"{self.max_new_tokens} exceeds cfg.max_seq_len={self.cfg.max_seq_len}")
    if num_samples < 1:
      raise ValueError(f"Sampler.generate: {num_samples=} must be >= 1")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
      raise ValueError(f"Sampler.generate: need temperature >= 0, top_k >= 0, 0 < top_p <= 1; got "
                       f"{temperature=}, {top_k=}, {top_p=}")
    if any(not len(s) for s in stop_sequences):
      raise ValueError("Sampler.generate: stop_sequences contains an empty sequence")

  def generate(self, params, prompts: Sequence[Sequence[int]], rng: jax.Array, *,
               num_samples: int = 1, temperature: float = 1.0, top_k: int = 0,
               top_p: float = 1.0, greedy: bool = False,
               stop_sequences: Sequence[Sequence[int]] = ()) -> RolloutResult:
    """Samples `num_samples` completions per prompt (rows [p0 x G, p1 x G, ...]).

    temperature 0 means greedy. Returned `logprobs_BC` are always the temperature-1 policy's
    (raw-logit log-softmax) at the sampled tokens; see the module docstring.
    """
    self._check(prompts, num_samples, temperature, top_k, top_p, stop_sequences)
    greedy = bool(greedy or temperature == 0)
    filtering = not greedy and (top_k > 0 or top_p < 1.0)
    n, G, C = len(prompts), num_samples, self.max_new_tokens
    b_pad = n  # fewest dummy prompts so that the B·G rows split evenly over the batch shards
    while (b_pad * G) % self._batch_shards:
      b_pad += 1
    length = bucket_length(max(len(p) for p in prompts), self.prompt_buckets)
    tok_np, mask_np = pad_prompts(prompts, length=length, pad_id=self.pad_id, rows=b_pad)
    # Stop-set shapes rounded up (the number of stops to a power of two >= 2, the window to a
    # multiple of 4) so that most stop sets, none included, share one program.
    window = _round_up(max([len(s) for s in stop_sequences] or [1]), 4)
    num_stops = max(2, 1 << (len(stop_sequences) - 1).bit_length())
    stops = np.full((num_stops, window), -1, np.int32)
    for i, s in enumerate(stop_sequences):
      stops[i, window - len(s):] = s
    eos = np.full(_round_up(max(len(self.eos_ids), 1), 4), -1, np.int32)
    eos[:len(self.eos_ids)] = self.eos_ids
    sp = SamplingParams(
        greedy=jnp.bool_(greedy), filtering=jnp.bool_(filtering),
        temperature=jnp.float32(temperature if not greedy else 1.0), top_k=jnp.int32(top_k),
        top_p=jnp.float32(top_p), pad_id=jnp.int32(self.pad_id), eos_ids=jnp.asarray(eos),
        stop_tokens=jnp.asarray(stops), stop_valid=jnp.asarray(np.arange(num_stops) < len(stop_sequences)))
    if self.mesh is not None:
      sp = jax.device_put(sp, shd.replicated(self.mesh))
    params = self._place_params(params)
    prompt_BP, mask_BP = self._place(tok_np, True), self._place(mask_np, True)
    real_B = self._place(np.arange(b_pad) < n, True)
    static = dict(cfg=self.cfg, mesh=self.mesh)
    prefill_args = (params, prompt_BP, mask_BP, real_B, rng, sp)
    stages = decode_stages(length, C, self.stages)
    prefill_kwargs = dict(static, max_new_tokens=C, num_samples=G, cache_len=stages[0][1])
    state = prefill(*prefill_args, **prefill_kwargs)
    step_params = self._eval_shape(decode_params, params, mesh=self.mesh)
    state_struct = jax.tree.map(shape_struct, state)
    loop = decode_loop if len(stages) == 1 else decode_loop_growing
    state = loop(params, state.replace(cache=None), state.cache, sp, stages=stages, **static)
    t_final = int(state.t)
    steps_run = t_final - 1

    cut = (lambda x: x) if b_pad == n else (lambda x: x[:n * G])
    starts = [1] + [end for end, _ in stages[:-1]]
    stage_ts = [(a, end) for a, (end, _) in zip(starts, stages)]
    useful_prefill, useful_decode = _useful_flops(self.cfg, [len(p) for p in prompts],
                                                  jax.device_get(cut(state.lengths_B)), stage_ts)
    calls = [ProgramCall("rollout/prefill", prefill, jax.tree.map(shape_struct, prefill_args),
                         prefill_kwargs, calls=1, useful=useful_prefill)]
    for (a, end), (_, cache_len), useful in zip(stage_ts, stages, useful_decode):
      ran = max(0, min(end, t_final) - a)
      if ran or a == 1:  # the first stage is recorded even when no step ran
        grown = self._eval_shape(grow_cache, state_struct, cache_len=cache_len)
        step_args = (step_params,) + jax.tree.map(shape_struct, (grown, sp))
        calls.append(ProgramCall("rollout/decode", decode_step_jit, step_args, dict(static),
                                 calls=ran, useful=useful, count_only=True))
    rep = lambda x: jnp.repeat(x, G, axis=0)
    return RolloutResult(
        prompt_BP=cut(rep(prompt_BP)), prompt_mask_BP=cut(rep(mask_BP)),
        completion_BC=cut(state.tokens_BC), completion_mask_BC=cut(state.mask_BC),
        lengths_B=cut(state.lengths_B), logprobs_BC=cut(state.logprobs_BC),
        program_calls=calls,
        steps_run=steps_run, num_prompts=n, num_samples=G)
