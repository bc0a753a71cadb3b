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

`make_logprob_fn` / `make_logits_fn` compute the same window for the reference model and the OPD
teachers (smjax.rl.teachers), padded back to T columns.

Legend: B rows, Bp = B / r prompt blocks, S sequence length, P prompt columns, T = S - 1 target
positions, V vocab, D model dim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp

from smjax.models.transformer import KVCache, Transformer, init_cache, lm_head
from smjax.rl.logprobs import token_logprobs

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


def shared_prompt_hidden(model: Transformer, params, batch: SequenceBatch, keep: int,
                         rows: int) -> tuple[jax.Array, jax.Array]:
  """Final hidden states [B, keep, D] at the last `keep` target positions, with the prompt's
  forward run once per block of `rows` consecutive rows (module docstring), and the number of
  rows whose prompt columns differ from their block's first row (0 when sharing is exact).

  The first P = S - keep columns are the prompt: a prefill of each block's first row fills a KV
  cache of P slots, which is widened to S slots and broadcast to the block's rows; the keep
  completion columns then run against it as one cached call (the sampler's prefill/decode path,
  here with gradients). The window's first position is the prompt's last (it predicts the first
  completion token), the rest are the completion's first keep - 1."""
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
  apply = lambda *a: model.apply({"params": params}, *a, return_hidden=True)
  prompt_hidden_BpPD, cache = apply(*first, init_cache(model.cfg, Bp, P))
  widen = lambda x: to_rows(jnp.pad(x, ((0, 0), (0, 0), (0, S - P), (0, 0))))
  cache = KVCache(k=tuple(map(widen, cache.k)), v=tuple(map(widen, cache.v)),
                  valid_BS=to_rows(jnp.pad(cache.valid_BS, ((0, 0), (0, S - P)))),
                  index=cache.index)
  completion_hidden_BCD, _ = apply(batch.tokens_BS[:, P:], batch.positions_BS[:, P:],
                                   batch.attn_mask_BS[:, P:], cache)
  hidden_BKD = jnp.concatenate([to_rows(prompt_hidden_BpPD[:, -1:]),
                                completion_hidden_BCD[:, :keep - 1]], axis=1)
  return hidden_BKD, jnp.sum((differ > 0).astype(jnp.float32))


def policy_logits(model, params, batch: SequenceBatch, keep: int, shared_rows: int = 1):
  """(logits [B, keep, V], the batch with its per-target arrays cut to the same last `keep`
  columns, the targets [B, keep], rows not sharing their block's prompt (None: no sharing))."""
  T = batch.loss_mask_BT.shape[1]
  if shared_rows < 1:
    raise ValueError(f"shared_prompt_rows={shared_rows} must be >= 1 (1: no sharing)")
  if shared_rows > 1 and keep == T:
    raise ValueError(f"shared_prompt_rows={shared_rows} needs logits_to_keep (the completion "
                     "width), which tells the prompt columns from the completion's")
  if keep == T:
    return forward_logits(model, params, batch), batch, batch.tokens_BS[:, 1:], None
  cut = lambda x: None if x is None else x[:, T - keep:]
  window = batch.replace(loss_mask_BT=cut(batch.loss_mask_BT), old_logp_BT=cut(batch.old_logp_BT),
                         ref_logp_BT=cut(batch.ref_logp_BT),
                         teacher_logp_BT=cut(batch.teacher_logp_BT),
                         teacher_logits_BTV=cut(batch.teacher_logits_BTV))
  targets = batch.tokens_BS[:, 1:][:, T - keep:]
  if shared_rows == 1:
    return _kept_logits(model, params, batch, keep), window, targets, None
  hidden_BKD, differ = shared_prompt_hidden(model, params, batch, keep, shared_rows)
  return lm_head(params, model.cfg, hidden_BKD), window, targets, differ


def guard_window(loss, aux, batch: SequenceBatch, keep: int, differ=None):
  """NaN loss (a skipped, reported step) if loss-mask tokens fall outside the kept columns, or
  if rows of a shared-prompt block have different prompts."""
  T = batch.loss_mask_BT.shape[1]
  if differ is not None:
    loss = jnp.where(differ > 0, jnp.nan, loss)
    aux = dict(aux, rows_not_sharing_prompt=differ)
  if keep == T:
    return loss, aux
  outside = jnp.sum(batch.loss_mask_BT[:, :T - keep].astype(jnp.float32))
  return jnp.where(outside > 0, jnp.nan, loss), dict(aux, tokens_outside_logits=outside)


def _scored_window(model, params, batch: SequenceBatch, logits_to_keep, shared_rows, where):
  """(logits [B, keep, V], window batch, targets, whether the window is unusable (loss-mask
  tokens outside it, or a block of rows not sharing its prompt), the T - keep columns cut)."""
  T = batch.loss_mask_BT.shape[1]
  keep = keep_width(logits_to_keep, batch, where)
  logits, win, targets, differ = policy_logits(model, params, batch, keep, shared_rows)
  bad = jnp.sum(batch.loss_mask_BT[:, :T - keep]) > 0
  if differ is not None:
    bad = bad | (differ > 0)
  return logits, win, targets, bad, T - keep


def make_logprob_fn(model: Transformer, *, logits_to_keep: int | None = None,
                    shared_prompt_rows: int = 1) -> Callable:
  """`fn(params, batch) -> logp_BT`: log-probs of the targets (reference / teacher forwards), 0
  off the loss mask. With `logits_to_keep` (and `shared_prompt_rows`, as the steps' configs) only
  the last k columns are computed and the others are 0; a loss-mask token outside them, or a
  block of rows not sharing its prompt, makes the whole result NaN (the step then skips)."""
  def fn(params, batch: SequenceBatch):
    logits, win, targets, bad, cut = _scored_window(model, params, batch, logits_to_keep,
                                                     shared_prompt_rows, "make_logprob_fn")
    logp = jnp.where(win.loss_mask_BT, token_logprobs(logits, targets), 0.0)
    return jnp.pad(jnp.where(bad, jnp.nan, logp), ((0, 0), (cut, 0)))
  return fn


def make_logits_fn(model: Transformer, *, logits_to_keep: int | None = None,
                   shared_prompt_rows: int = 1) -> Callable:
  """`fn(params, batch) -> logits_BTV` (teacher logits for the full-vocab objectives), computed
  and padded as `make_logprob_fn`'s log-probs (0 outside the kept columns, NaN if unusable)."""
  def fn(params, batch: SequenceBatch):
    logits, _, _, bad, cut = _scored_window(model, params, batch, logits_to_keep,
                                            shared_prompt_rows, "make_logits_fn")
    return jnp.pad(jnp.where(bad, jnp.nan, logits), ((0, 0), (cut, 0), (0, 0)))
  return fn
