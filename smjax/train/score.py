"""`score(model, params, batch)`: the log-probs (and entropy, logits) of a batch's scored targets.

Logits at position s predict token s + 1. A batch's `Layout` (smjax.batch) says which targets are
scored and how the forward may run; `score` reads it and nothing else decides:

- `Layout()` (SFT rows): an ordinary causal forward, every target column scored.
- `completion_len` C: the LM head, log-probs and entropy run on the last C target columns only,
  the completion (prompts are left-padded to one length, so completions fill the last columns).
- `rows_per_prompt` r > 1: every block of r consecutive rows holds one prompt, so the prompt's
  forward runs once per block and its keys and values serve all r completions (a KV cache of the
  prompt, broadcast to the block); the completion columns then run against it as one cached call.
  The values and gradients are those of the unshared forward (the gradient of the shared prompt
  sums over the block's completions, as the unshared one does), with (r - 1) / r fewer FLOPs on
  prompt tokens.
- `packed`: one model call runs a single stream: the prompts (each block's once), then the
  completion tokens of all rows without their padding and without each row's tokens past its last
  scored target (a completion's last token predicts nothing); each completion row attends to its
  prompt and its own earlier tokens through the model's packed-rows call
  (smjax.models.attention.PackedRows). Projections, MLP and LM head skip the padding.

All layouts give the same values up to float rounding (tests/test_layouts.py). The batch builders
have checked the layout on the host (smjax.batch.check_layout), so nothing here guards against a
bad plan in the graph.

`target_logprobs` / `target_logits` are the same window for the reference model and the OPD
teachers, padded back to T columns.

Legend (docs/design.md#shape-legend): B rows, P prompt length, C completion length (the scored
window; every target column when the layout has none), S = P + C, T = S - 1 targets, D model dim,
V vocab.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from smjax.batch import SequenceBatch
from smjax.models.attention import PackedRows
from smjax.models.cache import KVCache, init_cache
from smjax.models.transformer import Transformer, lm_head
from smjax.rl.logprobs import token_logprobs, token_logprobs_and_entropy


@flax.struct.dataclass
class Scores:
  """What a loss reads at the scored target columns (the last `batch.window` of T)."""
  logp_BC: jax.Array                   # log-probs of the targets
  targets_BC: jax.Array                # the target tokens
  entropy_BC: jax.Array | None = None  # their entropy (when asked for)
  logits_BCV: jax.Array | None = None  # the logits (when asked for)


def score(model: Transformer, params, batch: SequenceBatch, *, entropy: bool = True,
          logits: bool = False) -> Scores:
  """The scored targets' log-probs (and entropy, logits) under `model`, by the batch's layout
  (module docstring). `logits`/`entropy`: whether to return them (static)."""
  lay = batch.layout
  T = batch.loss_mask_BT.shape[1]
  C = batch.window
  targets_BC = batch.tokens_BS[:, 1:][:, T - C:]
  if lay.packed:
    logp, ent, lg = _packed_scores(model, params, batch, entropy=entropy, logits=logits)
    return Scores(logp, targets_BC, ent, lg)
  if not lay.completion_len:
    logits_BCV, _ = model.apply({"params": params}, batch.tokens_BS, batch.positions_BS,
                                batch.attn_mask_BS)
    logits_BCV = logits_BCV[:, :-1]
  else:
    if lay.rows_per_prompt == 1:
      hidden_BSD, _ = model.apply({"params": params}, batch.tokens_BS, batch.positions_BS,
                                  batch.attn_mask_BS, return_hidden=True)
      S = hidden_BSD.shape[1]
      hidden_BCD = hidden_BSD[:, S - 1 - C:S - 1]
    else:
      hidden_BCD = _shared_prompt_hidden(model, params, batch)
    logits_BCV = lm_head(params, model.cfg, hidden_BCD)
  if entropy:
    logp, ent = token_logprobs_and_entropy(logits_BCV, targets_BC)
  else:
    logp, ent = token_logprobs(logits_BCV, targets_BC), None
  return Scores(logp, targets_BC, ent, logits_BCV if logits else None)


def _prompt_blocks(batch: SequenceBatch):
  """(the prompt columns (tokens, positions, mask) [B / r, P] of each block's first row,
  `to_rows`: [B / r, ...] -> [B, ...] broadcast), r = rows_per_prompt (1: every row its own)."""
  B, S = batch.tokens_BS.shape
  r = batch.layout.rows_per_prompt
  P = S - batch.layout.completion_len
  blocks = lambda x: x.reshape((B // r, r) + x.shape[1:])
  to_rows = lambda x: jnp.broadcast_to(x[:, None], (B // r, r) + x.shape[1:]).reshape(
      (B,) + x.shape[1:])
  first = [blocks(x[:, :P])[:, 0] for x in (batch.tokens_BS, batch.positions_BS,
                                            batch.attn_mask_BS)]
  return first, to_rows


def _shared_prompt_hidden(model: Transformer, params, batch: SequenceBatch) -> jax.Array:
  """Final hidden states [B, C, D] at the scored positions, each prompt's forward run once per
  block of rows (module docstring).

  A prefill of each block's first row fills a KV cache of the P prompt slots, which is widened to
  S slots and broadcast to the block's rows; the C completion columns then run against it as one
  cached call (the sampler's prefill/decode path, here with gradients). The window's first
  position is the prompt's last (it predicts the first completion token), the rest are the
  completion's first C - 1."""
  S = batch.tokens_BS.shape[1]
  C = batch.layout.completion_len
  P = S - C
  first, to_rows = _prompt_blocks(batch)
  apply = lambda *a: model.apply({"params": params}, *a, return_hidden=True)
  prompt_hidden, cache = apply(*first, init_cache(model.cfg, first[0].shape[0], P))
  widen = lambda x: to_rows(jnp.pad(x, ((0, 0), (0, 0), (0, S - P), (0, 0))))
  cache = KVCache(k=tuple(map(widen, cache.k)), v=tuple(map(widen, cache.v)),
                  valid_BS=to_rows(jnp.pad(cache.valid_BS, ((0, 0), (0, S - P)))),
                  index=cache.index)
  completion_hidden_BCD, _ = apply(batch.tokens_BS[:, P:], batch.positions_BS[:, P:],
                                   batch.attn_mask_BS[:, P:], cache)
  return jnp.concatenate([to_rows(prompt_hidden[:, -1:]), completion_hidden_BCD[:, :C - 1]],
                         axis=1)


def _packed_scores(model: Transformer, params, batch: SequenceBatch, *, entropy: bool,
                   logits: bool):
  """`score` of a packed batch: (logp [B, C], entropy or None, logits or None)."""
  plan = batch.pack_plan
  if plan.ndim != 2 or plan.shape[0] != 1:
    raise ValueError(f"pack_plan has shape {plan.shape}; a forward takes one micro-batch's "
                     "plan [1, stream slots] (a step splits a [micro_batches, slots] plan; "
                     "target_logprobs / target_logits run each micro-batch in turn)")
  B, S = batch.tokens_BS.shape
  C = batch.layout.completion_len
  P, slots = S - C, plan.shape[1]
  src = plan[0].astype(jnp.int32)              # [slots]: flat b * C + c, or -1
  in_rows = jnp.where(src >= 0, src, B * C)
  flat = lambda x_BC: jnp.take(x_BC.reshape(-1), in_rows, mode="fill", fill_value=0)
  slot_BC = jnp.full((B * C,), -1, jnp.int32).at[in_rows].set(
      jnp.arange(slots, dtype=jnp.int32), mode="drop").reshape(B, C)
  in_stream_BC = slot_BC >= 0
  # One stream: each block's prompt (P columns), then the completion slots.
  (p_tokens, p_positions, p_mask), to_rows = _prompt_blocks(batch)
  rows = PackedRows(prompt_valid=p_mask.astype(bool), slot_BC=slot_BC, slot_src=src)
  stream = lambda p, x: jnp.concatenate([p.reshape(-1), flat(x[:, P:])])[None]
  hidden, _ = model.apply(
      {"params": params}, stream(p_tokens, batch.tokens_BS),
      stream(p_positions, batch.positions_BS),
      stream(p_mask, batch.attn_mask_BS).astype(bool), packed=rows, return_hidden=True)
  blocks = p_mask.shape[0]  # the packed call returns each prompt's last column, then the slots
  scored = jnp.concatenate([to_rows(hidden[0, :blocks]), hidden[0, blocks:]])[None]  # B + slots
  next_BC = jnp.pad(batch.tokens_BS[:, P + 1:], ((0, 0), (0, 1)))  # the token column c predicts
  targets = jnp.concatenate([batch.tokens_BS[:, P], flat(next_BC)])[None]
  logits_stream = lm_head(params, model.cfg, scored)
  if entropy:
    logp, ent = token_logprobs_and_entropy(logits_stream, targets)
  else:
    logp, ent = token_logprobs(logits_stream, targets), None
  # Window column 0 is row b's prompt (scored row b), column j >= 1 its stream slot of column j-1.
  idx_BC = jnp.concatenate([jnp.arange(B, dtype=jnp.int32)[:, None],
                            jnp.where(in_stream_BC[:, :-1], B + slot_BC[:, :-1], B + slots)],
                           axis=1)
  back = lambda x: None if x is None else jnp.take(x[0], idx_BC, axis=0, mode="fill",
                                                   fill_value=0)
  return back(logp), back(ent), back(logits_stream) if logits else None


def _per_micro_batch(fn, batch: SequenceBatch):
  """`fn(batch)` of a packed batch whose plan has several micro-batch rows: each micro-batch in
  turn (unrolled, so the FLOP count is every forward's), the results concatenated by row."""
  if not batch.layout.packed or batch.pack_plan.shape[0] == 1:
    return fn(batch)
  micro_batches = batch.pack_plan.shape[0]
  rows = batch.tokens_BS.shape[0] // micro_batches
  outs = []
  for m in range(micro_batches):
    part = jax.tree.map(lambda x: x[m * rows:(m + 1) * rows], batch.replace(pack_plan=None))
    outs.append(fn(part.replace(pack_plan=batch.pack_plan[m:m + 1])))
  return jnp.concatenate(outs, axis=0)


def target_logprobs(model: Transformer, params, batch: SequenceBatch) -> jax.Array:
  """Log-probs [B, T] of the targets (reference / teacher forwards): the scored window by the
  batch's layout, 0 off the loss mask and outside the window."""
  def fn(b):
    logp = score(model, params, b, entropy=False).logp_BC
    mask = b.scored(b.loss_mask_BT)
    T = b.loss_mask_BT.shape[1]
    return jnp.pad(jnp.where(mask, logp, 0.0), ((0, 0), (T - b.window, 0)))
  return _per_micro_batch(fn, batch)


def target_logits(model: Transformer, params, batch: SequenceBatch) -> jax.Array:
  """Logits [B, T, V] at the targets (teacher logits for the full-vocab objectives): the scored
  window by the batch's layout, 0 outside it (and, in a packed batch, at columns no target
  needs)."""
  def fn(b):
    lg = score(model, params, b, entropy=False, logits=True).logits_BCV
    T = b.loss_mask_BT.shape[1]
    return jnp.pad(lg, ((0, 0), (T - b.window, 0), (0, 0)))
  return _per_micro_batch(fn, batch)
