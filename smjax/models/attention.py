"""Attention math of the decoder (smjax.models.transformer): grouped-query softmax attention, and
attention over a packed token stream.

Packed rows (`Transformer(..., packed=PackedRows(...))`, no cache): the tokens come as one stream
[1, T]: first the prompts (B / r of them, P columns each, left-padded, each one's own causal
attention), then only the slots that matter of B rows of C completion columns, row b continuing
prompt b // r (smjax.batch packs a batch's completions without their padding, each prompt once for
its r rows). Every per-token op (projections, MLP, norms, LM head) runs on the T stream tokens as
one product; attention alone moves the completion's queries, keys and values to the [B, C] row layout
(zeros where a row has no stream token, masked out of the keys), where each row sees its prompt
and its own earlier columns, and moves the output back. The weight matmuls, which dominate, skip
the padding and run each prompt once; the attention scores keep the padded row layout. The last
layer computes no more than a score reads (`PackedRows.scored_rows`): its queries, attention
output, MLP and final norm run on each prompt's last column and the completion slots, while its
keys and values still cover every prompt token.

Letters (the project's legend, docs/design.md#shape-legend): B rows, T query time (a packed call's
stream), S key slots, N query heads, K kv heads, H head dim, P prompt columns, C completion columns;
in the einsums `r` is the query heads per kv head (N = K·r), a local letter.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

_NEG_INF = -1e30  # finite, so a row with no visible key (a left pad) gives a uniform, not NaN, softmax


def attend(q_BTNH, keys_BKSH, values_BKSH, visible_BTS, dt) -> jax.Array:
  """Grouped-query softmax attention of queries [B, T, N, H] over key slots [B, K, S, H] where
  `visible_BTS`; returns [B, T, N·H]."""
  B, T, N, H = q_BTNH.shape
  K = keys_BKSH.shape[1]
  q_BTKrH = q_BTNH.reshape(B, T, K, N // K, H)
  scores_BKrTS = jnp.einsum("BTKrH,BKSH->BKrTS", q_BTKrH, keys_BKSH.astype(dt),
                            preferred_element_type=jnp.float32) / math.sqrt(H)
  scores_BKrTS = jnp.where(visible_BTS[:, None, None], scores_BKrTS, _NEG_INF)
  probs_BKrTS = jax.nn.softmax(scores_BKrTS, axis=-1).astype(dt)
  out_BTKrH = jnp.einsum("BKrTS,BKSH->BTKrH", probs_BKrTS, values_BKSH.astype(dt))
  return out_BTKrH.reshape(B, T, N * H)


def decode_attend(q_B1NH, keys_BKHS, values_BKSH, visible_BS, dt) -> jax.Array:
  """`attend` for one query per row (a decode step over a KV cache): queries [B, 1, N, H] over the
  cache's keys, stored transposed [B, K, H, S], and values [B, K, S, H] where `visible_BS`;
  returns [B, 1, N·H].

  The same softmax attention as `attend` with the query axis dropped, as B·K plain products
  [r, H] @ [H, S] and [r, S] @ [S, H] whose outputs keep the cache's batch-major order. On
  XLA:CPU `attend`'s BTKrH output order made the value product run transposed ([H, S] @ [S, r])
  and keys stored [S, H] made the score product a transposed one; together about 3x slower at a
  GRPO-sized decode step (docs/performance.md, `benchmarks/decode_profile.py`)."""
  B, T, N, H = q_B1NH.shape
  K = keys_BKHS.shape[1]
  if T != 1:
    raise ValueError(f"decode_attend: queries {q_B1NH.shape} must have one time step")
  q_BKrH = q_B1NH.reshape(B, K, N // K, H)
  scores_BKrS = jnp.einsum("BKrH,BKHS->BKrS", q_BKrH, keys_BKHS.astype(dt),
                           preferred_element_type=jnp.float32)
  scores_BKrS = scores_BKrS / math.sqrt(H)
  scores_BKrS = jnp.where(visible_BS[:, None, None], scores_BKrS, _NEG_INF)
  probs_BKrS = jax.nn.softmax(scores_BKrS, axis=-1).astype(dt)
  out_BKrH = jnp.einsum("BKrS,BKSH->BKrH", probs_BKrS, values_BKSH.astype(dt))
  return out_BKrH.reshape(B, 1, N * H)


def packed_attention(packed: PackedRows, queries, k_1TKH, v_1TKH, mask_1T, dt) -> jax.Array:
  """Attention of a packed stream (module docstring): each prompt causally over itself, each
  completion row over its prompt and its own earlier columns. Returns [1, queries, N·H] for
  `queries` [1, queries, N, H]: either every stream token (T of them) or the scored rows alone
  (prompts + T - prompts·P, `PackedRows.scored_rows`: each prompt's last column, then the
  completion slots)."""
  prompts, P = packed.prompt_valid.shape
  B, C = packed.slot_BC.shape
  in_prompts = prompts * P   # stream tokens before the completion slots
  r = B // prompts
  T = k_1TKH.shape[1]
  # prompt queries: all of them, or each prompt's last column
  prompt_queries = {T: in_prompts, T - in_prompts + prompts: prompts}.get(queries.shape[1])
  if prompt_queries is None:
    raise ValueError(f"packed_attention: {queries.shape[1]} queries for a stream of {T} tokens; "
                     f"expected {T} (all) or {T - in_prompts + prompts} (the scored rows)")
  heads_first = lambda x: x.transpose(0, 2, 1, 3)  # [., S, K, H] -> [., K, S, H]
  # Prompts: one row each, causal, real tokens only.
  qp = queries[0, :prompt_queries].reshape((prompts, prompt_queries // prompts)
                                           + queries.shape[2:])
  kp, vp = (x[0, :in_prompts].reshape((prompts, P) + x.shape[2:]) for x in (k_1TKH, v_1TKH))
  causal_PP = jnp.arange(P)[None, :] <= jnp.arange(P)[:, None]
  prompt_out = attend(qp, heads_first(kp), heads_first(vp),
                      causal_PP[None, P - prompt_queries // prompts:]
                      & packed.prompt_valid[:, None, :], dt)
  # Completions: [B, C] rows; keys are the row's prompt (broadcast from its block) then its own
  # columns up to the query's.
  qc = packed.to_rows(queries[:, prompt_queries:])
  kc, vc = (packed.to_rows(x[:, in_prompts:]) for x in (k_1TKH, v_1TKH))
  valid_BC = packed.to_rows(mask_1T[:, in_prompts:, None])[..., 0].astype(bool)
  to_rows = lambda x: jnp.broadcast_to(x[:, None], (prompts, r) + x.shape[1:]).reshape(
      (B,) + x.shape[1:])
  keys = jnp.concatenate([to_rows(heads_first(kp)), heads_first(kc)], axis=2)
  values = jnp.concatenate([to_rows(heads_first(vp)), heads_first(vc)], axis=2)
  causal_CC = jnp.arange(C)[None, :] <= jnp.arange(C)[:, None]
  visible = jnp.concatenate([
      jnp.broadcast_to(to_rows(packed.prompt_valid)[:, None, :], (B, C, P)),
      causal_CC[None] & valid_BC[:, None, :]], axis=2)
  completion_out = attend(qc, keys, values, visible, dt)
  return jnp.concatenate([prompt_out.reshape(1, prompt_queries, -1),
                          packed.to_stream(completion_out)], axis=1)


@flax.struct.dataclass
class PackedRows:
  """How a packed stream [1, T] (the prompts' P columns each, then the completion slots) is laid
  out (module docstring).

  `prompt_valid` [prompts, P] marks the real tokens of the prompts that open the stream.
  `slot_BC[b, c]` is the stream slot, counted from the end of the prompts, of row b's completion
  column c, or -1 (not in the stream: padding or a token nothing needs); `slot_src[t]` is the flat
  index b * C + c of completion slot t, or -1 (a pad slot at the stream's end). The two are
  inverse maps of each other on their valid entries; B must be a multiple of the prompts."""
  prompt_valid: jax.Array   # bool [prompts, P]
  slot_BC: jax.Array        # int32
  slot_src: jax.Array       # int32 [completion slots]

  @property
  def prompt_tokens(self) -> int:
    return self.prompt_valid.size

  def scored_rows(self, x_1T):
    """The stream rows [1, T, ...] whose final hidden states a score reads: each prompt's last
    column (it predicts the first completion token), then the completion slots ->
    [1, prompts + T - prompts·P, ...]. The decoder's last layer runs on these rows alone."""
    prompts, P = self.prompt_valid.shape
    return jnp.concatenate([x_1T[:, P - 1:prompts * P:P], x_1T[:, prompts * P:]], axis=1)

  def to_rows(self, slots):
    """Completion slots [1, slots, ...] -> rows [B, C, ...], zeros where a row has no stream
    token."""
    return _to_rows(self.slot_BC, self.slot_src, slots)

  def to_stream(self, x_BC):
    """Rows [B, C, ...] -> completion slots [1, slots, ...], zeros in pad slots."""
    return _to_stream(self.slot_BC, self.slot_src, x_BC)


# The two moves are gathers whose transposes are each other (the maps are inverse on their valid
# entries; smjax.batch.check_layout checks that a plan round-trips, on the host), so their
# custom VJPs gather too, where autodiff would emit scatter-adds (a serial loop on XLA's CPU
# backend, and a collision-handling one elsewhere) for a map it cannot know is one-to-one.
def _gather_rows(x: jax.Array, idx: jax.Array) -> jax.Array:
  """x[idx] along the leading axis, zeros where idx < 0."""
  return jnp.take(x, jnp.where(idx >= 0, idx, x.shape[0]), axis=0, mode="fill", fill_value=0)


@jax.custom_vjp
def _to_rows(slot_BC, slot_src, slots):
  return _gather_rows(slots[0], slot_BC)


def _to_rows_fwd(slot_BC, slot_src, slots):
  return _to_rows(slot_BC, slot_src, slots), (slot_BC, slot_src)


def _to_rows_bwd(res, g_BC):
  slot_BC, slot_src = res
  return None, None, _to_stream(slot_BC, slot_src, g_BC)


@jax.custom_vjp
def _to_stream(slot_BC, slot_src, x_BC):
  B, C = x_BC.shape[:2]
  return _gather_rows(x_BC.reshape((B * C,) + x_BC.shape[2:]), slot_src)[None]


def _to_stream_fwd(slot_BC, slot_src, x_BC):
  return _to_stream(slot_BC, slot_src, x_BC), (slot_BC, slot_src)


def _to_stream_bwd(res, g_slots):
  slot_BC, slot_src = res
  return None, None, _to_rows(slot_BC, slot_src, g_slots)


_to_rows.defvjp(_to_rows_fwd, _to_rows_bwd)
_to_stream.defvjp(_to_stream_fwd, _to_stream_bwd)
