"""Which positions the GRPO and OPD losses score, and how the model computes their logits.

Logits at position s predict token s + 1 (`forward_logits`: [B, T, V] for every target of a
`SequenceBatch`). The losses need fewer:

`logits_to_keep = k` (GRPO, OPD): the LM head, log-probs and loss run on the last k target
positions only, the completion (prompts are left-padded to one length, so completions fill the
last columns), like TRL's `logits_to_keep`; the prompt positions' logits never reach these losses.
A loss-mask token outside those k columns would be dropped from the loss, so the step makes the
loss NaN instead (the step is skipped and reported non-finite) and counts them in the
`tokens_outside_logits` metric.

`shared_prompt_rows = r` (GRPO, OPD; needs `logits_to_keep`, whose window fixes the prompt width
P = S - logits_to_keep): every block of r consecutive rows holds one prompt (the sampler's
[p0 x G, p1 x G, ...] order), so the prompt's forward runs once per block and its keys and values
serve all r completions (a KV cache of the prompt, broadcast to the block: `shared_prompt_hidden`).
The loss and its gradient are those of the unshared forward (the gradient of the shared prompt
sums over the block's completions, as the unshared one does); the step does (r - 1) / r fewer
FLOPs on prompt tokens. Rows of one block whose prompt columns differ make the loss NaN (the step
is skipped) and are counted in the `rows_not_sharing_prompt` metric.

Packed completions (a batch carrying `pack_src_MT`, made on the host by `with_packing`; needs
`logits_to_keep`): one model call runs a single stream: the prompts (each block's once with
`shared_prompt_rows`, else each row's), then the completion tokens of all rows without their
padding and without each row's tokens past its last scored target (a completion's last token
predicts nothing); each completion row attends to its prompt and its own earlier tokens through
the model's packed-rows call (smjax.models.attention.PackedRows). Projections, MLP and LM head
then skip the padding, which was a third of the completion positions in the peer benchmark's
batch and two thirds in the toy study's; the result is that of the padded forward. A plan that
does not cover every scored target of its batch, is not a prefix of each row or repeats a token
makes the loss NaN (the step is skipped) and is counted in `pack_plan_errors`.

`make_logprob_fn` / `make_logits_fn` compute the same window for the reference model and the OPD
teachers (smjax.rl.teachers), padded back to T columns.

Legend: B rows, Bp = B / r prompt blocks, S sequence length, P prompt columns, T = S - 1 target
positions, V vocab, D model dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp
import numpy as np

from smjax.models.attention import PackedRows
from smjax.models.transformer import KVCache, Transformer, init_cache, lm_head
from smjax.rl.logprobs import token_logprobs, token_logprobs_and_entropy

if TYPE_CHECKING:
  from smjax.train.steps import SequenceBatch


def forward_logits(model: Transformer, params, batch: SequenceBatch) -> jax.Array:
  """Logits [B, T, V] at the positions that predict tokens_BS[:, 1:]."""
  logits_BSV, _ = model.apply({"params": params}, batch.tokens_BS, batch.positions_BS,
                              batch.attn_mask_BS)
  return logits_BSV[:, :-1]


def _kept_logits(model: Transformer, params, batch: SequenceBatch, keep: int) -> jax.Array:
  """Logits [B, keep, V] at the last `keep` of the T positions that predict tokens_BS[:, 1:]."""
  hidden_BSD, _ = model.apply({"params": params}, batch.tokens_BS, batch.positions_BS,
                              batch.attn_mask_BS, return_hidden=True)
  S = hidden_BSD.shape[1]
  return lm_head(params, model.cfg, hidden_BSD[:, S - 1 - keep:S - 1])


def keep_width(logits_to_keep: int | None, batch: SequenceBatch, where: str) -> int:
  """How many of the T target columns are scored (all when `logits_to_keep` is None); `where`
  names the config field in the error."""
  T = batch.loss_mask_BT.shape[1]
  if logits_to_keep is None:
    return T
  if not 0 < logits_to_keep <= T:
    raise ValueError(f"{where}.logits_to_keep={logits_to_keep} must be in [1, T={T}] (the "
                     f"completion length; T = tokens_BS length - 1)")
  return logits_to_keep


def _prompt_blocks(batch: SequenceBatch, keep: int, rows: int):
  """(the prompt columns (tokens, positions, mask) [Bp, P] of each block's first row, the number
  of rows whose prompt columns differ from their block's first row, `to_rows`: [Bp, ...] ->
  [B, ...] broadcast). The first P = S - keep columns are the prompt."""
  B, S = batch.tokens_BS.shape
  P = S - keep
  if P < 1:
    raise ValueError(f"shared_prompt_rows: logits_to_keep={keep} leaves no prompt columns in "
                     f"sequences of S={S} tokens")
  if B % rows:
    raise ValueError(f"shared_prompt_rows={rows} must divide the {B} rows of a (micro-)batch: "
                     f"each block of {rows} consecutive rows holds one prompt")
  Bp = B // rows
  blocks = lambda x: x.reshape((Bp, rows) + x.shape[1:])
  to_rows = lambda x: jnp.broadcast_to(x[:, None], (Bp, rows) + x.shape[1:]).reshape(
      (B,) + x.shape[1:])
  prompt = [x[:, :P] for x in (batch.tokens_BS, batch.positions_BS, batch.attn_mask_BS)]
  first = [blocks(x)[:, 0] for x in prompt]
  differ = sum(jnp.any(blocks(x) != f[:, None], axis=-1) for x, f in zip(prompt, first))
  return first, jnp.sum((differ > 0).astype(jnp.float32)), to_rows


def shared_prompt_hidden(model: Transformer, params, batch: SequenceBatch, keep: int,
                         rows: int) -> tuple[jax.Array, jax.Array]:
  """Final hidden states [B, keep, D] at the last `keep` target positions, with the prompt's
  forward run once per block of `rows` consecutive rows (module docstring), and the number of
  rows whose prompt columns differ from their block's first row (0 when sharing is exact).

  A prefill of each block's first row fills a KV cache of the P prompt slots, which is widened to
  S slots and broadcast to the block's rows; the keep completion columns then run against it as
  one cached call (the sampler's prefill/decode path, here with gradients). The window's first
  position is the prompt's last (it predicts the first completion token), the rest are the
  completion's first keep - 1."""
  S = batch.tokens_BS.shape[1]
  P = S - keep
  first, differ, to_rows = _prompt_blocks(batch, keep, rows)
  apply = lambda *a: model.apply({"params": params}, *a, return_hidden=True)
  prompt_hidden_BpPD, cache = apply(*first, init_cache(model.cfg, first[0].shape[0], P))
  widen = lambda x: to_rows(jnp.pad(x, ((0, 0), (0, 0), (0, S - P), (0, 0))))
  cache = KVCache(k=tuple(map(widen, cache.k)), v=tuple(map(widen, cache.v)),
                  valid_BS=to_rows(jnp.pad(cache.valid_BS, ((0, 0), (0, S - P)))),
                  index=cache.index)
  completion_hidden_BCD, _ = apply(batch.tokens_BS[:, P:], batch.positions_BS[:, P:],
                                   batch.attn_mask_BS[:, P:], cache)
  hidden_BKD = jnp.concatenate([to_rows(prompt_hidden_BpPD[:, -1:]),
                                completion_hidden_BCD[:, :keep - 1]], axis=1)
  return hidden_BKD, differ


# ------------------------------------------------------------------------ packed completions

def pack_plan(loss_mask_BT, keep: int, *, micro_batches: int = 1,
              bucket: int | None = None) -> np.ndarray:
  """The packed stream of a batch (host side, numpy): int32 [micro_batches, Tp], row m listing,
  for micro-batch m's rows in order, the flat index b * keep + c (b the row within the
  micro-batch) of every completion column c that some scored target needs, -1 after the end.

  Row b of the window (the last `keep` target columns of `loss_mask_BT` [B, T]) scores targets up
  to its last loss-mask column J - 1; window column j >= 1 reads the hidden state of completion
  column j - 1, so the row contributes columns 0 .. J - 2 (its completion minus the last token, or
  nothing when no target is scored: column 0 is the prompt's). Tp, the longest micro-batch's
  count, is rounded up to a multiple of `bucket` (default: keep), so batches of similar lengths
  share one compiled step."""
  mask = np.asarray(loss_mask_BT).astype(bool)
  B, T = mask.shape
  if not 0 < keep <= T:
    raise ValueError(f"pack_plan: keep={keep} must be in [1, T={T}]")
  if micro_batches < 1 or B % micro_batches:
    raise ValueError(f"pack_plan: micro_batches={micro_batches} must divide the {B} rows")
  bucket = keep if bucket is None else bucket
  if bucket < 1:
    raise ValueError(f"pack_plan: bucket={bucket} must be >= 1")
  win = mask[:, T - keep:]
  last = np.where(win.any(1), keep - 1 - np.argmax(win[:, ::-1], axis=1), 0)  # J - 1 per row
  rows = B // micro_batches
  plans = []
  for m in range(micro_batches):
    plans.append(np.concatenate([b * keep + np.arange(last[m * rows + b], dtype=np.int64)
                                 for b in range(rows)]))
  longest = max(len(p) for p in plans)
  width = max(bucket, -(-longest // bucket) * bucket)
  out = np.full((micro_batches, width), -1, np.int32)
  for m, p in enumerate(plans):
    out[m, :len(p)] = p
  return out


def eighth_bucket(rows: int, keep: int) -> int:
  """A `pack_plan` bucket of an eighth of `rows` x `keep` completion columns (at least `keep`):
  a loop over batches of varying lengths compiles its step for at most 8 stream lengths."""
  return max(keep, rows * keep // 8)


def with_packing(batch: SequenceBatch, logits_to_keep: int, *, micro_batches: int = 1,
                 bucket: int | None = None) -> SequenceBatch:
  """`batch` carrying its packed stream (`pack_plan` of its loss mask), which the GRPO and OPD
  steps and `make_logprob_fn` / `make_logits_fn` then use (module docstring). `micro_batches` must
  be the step's; `logits_to_keep` must be the step's too (the plan is laid out on its window)."""
  if logits_to_keep is None:
    raise ValueError("with_packing: packing needs logits_to_keep (the completion width), which "
                     "tells the prompt columns from the completion's")
  plan = pack_plan(batch.loss_mask_BT, logits_to_keep, micro_batches=micro_batches,
                   bucket=bucket)
  return batch.replace(pack_src_MT=jnp.asarray(plan))


def _packed_scores(model: Transformer, params, batch: SequenceBatch, keep: int, rows: int, *,
                   entropy: bool, logits: bool):
  """`window_scores` of a packed batch: (logp [B, keep], entropy or None, logits or None, rows not
  sharing their prompt, plan errors: scored targets whose hidden state the plan leaves out, rows
  whose stream columns are not a prefix, or stream slots that do not round-trip)."""
  src_MT = batch.pack_src_MT
  if src_MT.ndim != 2 or src_MT.shape[0] != 1:
    raise ValueError(f"pack_src_MT has shape {src_MT.shape}; a step expects [micro_batches, Tp] "
                     "split to [1, Tp] per micro-batch: make the plan with the step's "
                     "micro_batches (scoring.with_packing)")
  B, S = batch.tokens_BS.shape
  P, Tp = S - keep, src_MT.shape[1]
  src_T = src_MT[0].astype(jnp.int32)
  in_rows = jnp.where(src_T >= 0, src_T, B * keep)
  flat = lambda x_BC: jnp.take(x_BC.reshape(-1), in_rows, mode="fill", fill_value=0)
  slot_BC = jnp.full((B * keep,), -1, jnp.int32).at[in_rows].set(
      jnp.arange(Tp, dtype=jnp.int32), mode="drop").reshape(B, keep)

  in_stream_BC = slot_BC >= 0
  win_mask = batch.loss_mask_BT[:, S - 1 - keep:]
  errors = (jnp.sum(win_mask[:, 1:] & ~in_stream_BC[:, :-1])          # uncovered targets
            + jnp.sum(in_stream_BC[:, 1:] & ~in_stream_BC[:, :-1])     # holes in a row's prefix
            + jnp.sum((src_T >= 0) & (jnp.take(slot_BC.reshape(-1), in_rows, mode="fill",
                                               fill_value=-1) != jnp.arange(Tp))))  # repeats
  # One stream: each block's prompt (P columns), then the completion slots.
  (p_tokens, p_positions, p_mask), differ, to_rows = _prompt_blocks(batch, keep, rows)
  packed = PackedRows(prompt_valid_BpP=p_mask.astype(bool), slot_BC=slot_BC, src_T=src_T)
  stream = lambda p, x: jnp.concatenate([p.reshape(-1), flat(x[:, P:])])[None]
  hidden_1LD, _ = model.apply(
      {"params": params}, stream(p_tokens, batch.tokens_BS),
      stream(p_positions, batch.positions_BS),
      stream(p_mask, batch.attn_mask_BS).astype(bool), packed=packed, return_hidden=True)
  Bp = p_mask.shape[0]  # the packed call returns each prompt's last column, then the slots
  rows_1RD = jnp.concatenate([to_rows(hidden_1LD[0, :Bp]), hidden_1LD[0, Bp:]])[None]  # B + Tp
  next_BC = jnp.pad(batch.tokens_BS[:, P + 1:], ((0, 0), (0, 1)))  # the token column c predicts
  targets_1R = jnp.concatenate([batch.tokens_BS[:, P], flat(next_BC)])[None]
  logits_1RV = lm_head(params, model.cfg, rows_1RD)
  if entropy:
    logp_1R, ent_1R = token_logprobs_and_entropy(logits_1RV, targets_1R)
  else:
    logp_1R, ent_1R = token_logprobs(logits_1RV, targets_1R), None
  # Window column 0 is row b's prompt (scored row b), column j >= 1 its stream slot of column j-1.
  idx_BK = jnp.concatenate([jnp.arange(B, dtype=jnp.int32)[:, None],
                            jnp.where(in_stream_BC[:, :-1], B + slot_BC[:, :-1], B + Tp)], axis=1)
  back = lambda x_1R: None if x_1R is None else jnp.take(x_1R[0], idx_BK, axis=0, mode="fill",
                                                         fill_value=0)
  return (back(logp_1R), back(ent_1R), back(logits_1RV) if logits else None, differ,
          errors.astype(jnp.float32))


def _check_shared(shared_rows: int, keep: int, T: int, packed: bool) -> None:
  if shared_rows < 1:
    raise ValueError(f"shared_prompt_rows={shared_rows} must be >= 1 (1: no sharing)")
  if keep == T and (shared_rows > 1 or packed):
    what = (f"shared_prompt_rows={shared_rows}" if shared_rows > 1
            else "a packed batch (pack_src_MT)")
    raise ValueError(f"{what} needs logits_to_keep (the completion width), which tells the "
                     "prompt columns from the completion's")


def window_scores(model, params, batch: SequenceBatch, keep: int, shared_rows: int = 1, *,
                  entropy: bool = True, logits: bool = False):
  """What the losses read at the last `keep` target columns: (log-probs of the targets
  [B, keep], their entropy [B, keep] (None unless `entropy`), the logits [B, keep, V] (None unless
  `logits`), the batch with its per-target arrays cut to the window, the targets [B, keep], and
  the guard counts {metric: count} that make the loss NaN when positive (`guard_window`)).

  Runs the plain, shared-prompt or packed forward as the arguments and the batch say (module
  docstring); all give the same values up to float rounding."""
  T = batch.loss_mask_BT.shape[1]
  packed = batch.pack_src_MT is not None
  _check_shared(shared_rows, keep, T, packed)
  cut = lambda x: None if x is None else x[:, T - keep:]
  win = batch.replace(loss_mask_BT=cut(batch.loss_mask_BT), old_logp_BT=cut(batch.old_logp_BT),
                      ref_logp_BT=cut(batch.ref_logp_BT),
                      teacher_logp_BT=cut(batch.teacher_logp_BT),
                      teacher_logits_BTV=cut(batch.teacher_logits_BTV), pack_src_MT=None)
  targets = batch.tokens_BS[:, 1:][:, T - keep:]
  guards = {}
  if packed:
    logp, ent, lg, differ, errors = _packed_scores(model, params, batch, keep, shared_rows,
                                                   entropy=entropy, logits=logits)
    guards["pack_plan_errors"] = errors
    if shared_rows > 1:
      guards["rows_not_sharing_prompt"] = differ
    return logp, ent, lg, win, targets, guards
  if keep == T:
    all_logits = forward_logits(model, params, batch)
  elif shared_rows == 1:
    all_logits = _kept_logits(model, params, batch, keep)
  else:
    hidden_BKD, guards["rows_not_sharing_prompt"] = shared_prompt_hidden(model, params, batch,
                                                                         keep, shared_rows)
    all_logits = lm_head(params, model.cfg, hidden_BKD)
  if entropy:
    logp, ent = token_logprobs_and_entropy(all_logits, targets)
  else:
    logp, ent = token_logprobs(all_logits, targets), None
  return logp, ent, all_logits if logits else None, win, targets, guards


def guard_window(loss, aux, batch: SequenceBatch, keep: int, guards=None):
  """NaN loss (a skipped, reported step) if loss-mask tokens fall outside the kept columns, or
  any guard count of `window_scores` is positive; every count becomes a metric."""
  T = batch.loss_mask_BT.shape[1]
  for name, count in (guards or {}).items():
    loss = jnp.where(count > 0, jnp.nan, loss)
    aux = dict(aux, **{name: count})
  if keep == T:
    return loss, aux
  outside = jnp.sum(batch.loss_mask_BT[:, :T - keep].astype(jnp.float32))
  return jnp.where(outside > 0, jnp.nan, loss), dict(aux, tokens_outside_logits=outside)


def _scored_window(model, params, batch: SequenceBatch, logits_to_keep, shared_rows, where, *,
                   logits: bool):
  """(log-probs [B, keep] (0 off the loss mask), logits or None, whether the window is unusable
  (loss-mask tokens outside it, or a positive guard count), the T - keep columns cut)."""
  T = batch.loss_mask_BT.shape[1]
  keep = keep_width(logits_to_keep, batch, where)
  logp, _, lg, win, _, guards = window_scores(model, params, batch, keep, shared_rows,
                                              entropy=False, logits=logits)
  bad = jnp.sum(batch.loss_mask_BT[:, :T - keep]) > 0
  for count in guards.values():
    bad = bad | (count > 0)
  return jnp.where(win.loss_mask_BT, logp, 0.0), lg, bad, T - keep


def make_logprob_fn(model: Transformer, *, logits_to_keep: int | None = None,
                    shared_prompt_rows: int = 1) -> Callable:
  """`fn(params, batch) -> logp_BT`: log-probs of the targets (reference / teacher forwards), 0
  off the loss mask. With `logits_to_keep` (and `shared_prompt_rows`, as the steps' configs) only
  the last k columns are computed and the others are 0; a packed batch runs packed. A loss-mask
  token outside the window, a block of rows not sharing its prompt, or a plan error makes the
  whole result NaN (the step then skips)."""
  def fn(params, batch: SequenceBatch):
    logp, _, bad, cut = _scored_window(model, params, batch, logits_to_keep, shared_prompt_rows,
                                       "make_logprob_fn", logits=False)
    return jnp.pad(jnp.where(bad, jnp.nan, logp), ((0, 0), (cut, 0)))
  return fn


def make_logits_fn(model: Transformer, *, logits_to_keep: int | None = None,
                   shared_prompt_rows: int = 1) -> Callable:
  """`fn(params, batch) -> logits_BTV` (teacher logits for the full-vocab objectives), computed
  and padded as `make_logprob_fn`'s log-probs (0 outside the kept columns and, in a packed batch,
  at columns no target needs; NaN if unusable)."""
  def fn(params, batch: SequenceBatch):
    _, logits, bad, cut = _scored_window(model, params, batch, logits_to_keep,
                                         shared_prompt_rows, "make_logits_fn", logits=True)
    return jnp.pad(jnp.where(bad, jnp.nan, logits), ((0, 0), (cut, 0), (0, 0)))
  return fn
