"""Attention math of the decoder (smjax.models.transformer): grouped-query softmax attention, and
attention over a packed token stream.

Packed rows (`Transformer(..., packed=PackedRows(...))`, no cache): the tokens come as one stream
[1, L]: first Bp prompts of P columns (left-padded, each one's own causal attention), then only
the slots that matter of B = Bp x r rows of C completion columns, row b continuing prompt b // r
(smjax.train.scoring packs a batch's completions without their padding, each prompt once for its r
rows). Every per-token op (projections, MLP, norms, LM head) runs on the L stream tokens as one
product; attention alone moves the completion's queries, keys and values to the [B, C] row layout
(zeros where a row has no stream token, masked out of the keys), where each row sees its prompt
and its own earlier columns, and moves the output back. The weight matmuls, which dominate, skip
the padding and run each prompt once; the attention scores keep the padded row layout. The last
layer computes no more than a score reads (`PackedRows.scored_rows`): its queries, attention
output, MLP and final norm run on each prompt's last column and the completion slots, while its
keys and values still cover every prompt token.

Einsum letters: B batch, T query time, S key slots, N query heads, K kv heads, G query heads per kv
head (N = K·G), H head dim, L stream length, Bp prompts, P prompt columns, C completion columns.
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
  q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
  scores_BKGTS = jnp.einsum("BTKGH,BKSH->BKGTS", q_BTKGH, keys_BKSH.astype(dt),
                            preferred_element_type=jnp.float32) / math.sqrt(H)
  scores_BKGTS = jnp.where(visible_BTS[:, None, None], scores_BKGTS, _NEG_INF)
  probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(dt)
  out_BTKGH = jnp.einsum("BKGTS,BKSH->BTKGH", probs_BKGTS, values_BKSH.astype(dt))
  return out_BTKGH.reshape(B, T, N * H)


def packed_attention(packed: PackedRows, q_1QNH, k_1LKH, v_1LKH, mask_1L, dt) -> jax.Array:
  """Attention of a packed stream (module docstring): each prompt causally over itself, each
  completion row over its prompt and its own earlier columns. Returns [1, Q, N·H] for queries
  [1, Q, N, H]: either every stream token (Q = L) or the scored rows alone (Q = Bp + L - Bp·P,
  `PackedRows.scored_rows`: each prompt's last column, then the completion slots)."""
  Bp, P = packed.prompt_valid_BpP.shape
  B, C = packed.slot_BC.shape
  Lp = Bp * P
  r = B // Bp
  L = k_1LKH.shape[1]
  Qp = {L: Lp, L - Lp + Bp: Bp}.get(q_1QNH.shape[1])  # prompt queries: all, or each last column
  if Qp is None:
    raise ValueError(f"packed_attention: {q_1QNH.shape[1]} queries for a stream of {L} tokens; "
                     f"expected {L} (all) or {L - Lp + Bp} (the scored rows)")
  heads_first = lambda x: x.transpose(0, 2, 1, 3)  # [., S, K, H] -> [., K, S, H]
  # Prompts: [Bp, P] rows, causal, real tokens only.
  qp = q_1QNH[0, :Qp].reshape((Bp, Qp // Bp) + q_1QNH.shape[2:])
  kp, vp = (x[0, :Lp].reshape((Bp, P) + x.shape[2:]) for x in (k_1LKH, v_1LKH))
  causal_PP = jnp.arange(P)[None, :] <= jnp.arange(P)[:, None]
  prompt_out = attend(qp, heads_first(kp), heads_first(vp),
                      causal_PP[None, P - Qp // Bp:] & packed.prompt_valid_BpP[:, None, :], dt)
  # Completions: [B, C] rows; keys are the row's prompt (broadcast from its block) then its own
  # columns up to the query's.
  qc = packed.to_rows(q_1QNH[:, Qp:])
  kc, vc = (packed.to_rows(x[:, Lp:]) for x in (k_1LKH, v_1LKH))
  valid_BC = packed.to_rows(mask_1L[:, Lp:, None])[..., 0].astype(bool)
  to_rows = lambda x: jnp.broadcast_to(x[:, None], (Bp, r) + x.shape[1:]).reshape(
      (B,) + x.shape[1:])
  keys = jnp.concatenate([to_rows(heads_first(kp)), heads_first(kc)], axis=2)
  values = jnp.concatenate([to_rows(heads_first(vp)), heads_first(vc)], axis=2)
  causal_CC = jnp.arange(C)[None, :] <= jnp.arange(C)[:, None]
  visible = jnp.concatenate([
      jnp.broadcast_to(to_rows(packed.prompt_valid_BpP)[:, None, :], (B, C, P)),
      causal_CC[None] & valid_BC[:, None, :]], axis=2)
  completion_out = attend(qc, keys, values, visible, dt)
  return jnp.concatenate([prompt_out.reshape(1, Qp, -1), packed.to_stream(completion_out)],
                         axis=1)


@flax.struct.dataclass
class PackedRows:
  """How a packed stream [1, L = Bp * P + T] is laid out (module docstring).

  `prompt_valid_BpP` marks the real tokens of the Bp prompts that open the stream (P columns
  each). `slot_BC[b, c]` is the stream slot, counted from the end of the prompts, of row b's
  completion column c, or -1 (not in the stream: padding or a token nothing needs); `src_T[t]` is
  the flat index b * C + c of completion slot t, or -1 (a pad slot at the stream's end). The two
  are inverse maps of each other on their valid entries; B must be a multiple of Bp."""
  prompt_valid_BpP: jax.Array  # bool
  slot_BC: jax.Array           # int32
  src_T: jax.Array             # int32

  @property
  def prompt_tokens(self) -> int:
    return self.prompt_valid_BpP.size

  def scored_rows(self, x_1LX: jax.Array) -> jax.Array:
    """The stream rows [1, L, ...] whose final hidden states a score reads: each prompt's last
    column (it predicts the first completion token), then the completion slots ->
    [1, Bp + L - Bp·P, ...]. The decoder's last layer runs on these rows alone."""
    Bp, P = self.prompt_valid_BpP.shape
    return jnp.concatenate([x_1LX[:, P - 1:Bp * P:P], x_1LX[:, Bp * P:]], axis=1)

  def to_rows(self, x_1TX: jax.Array) -> jax.Array:
    """Completion stream [1, T, ...] -> rows [B, C, ...], zeros where a row has no stream token."""
    return _to_rows(self.slot_BC, self.src_T, x_1TX)

  def to_stream(self, x_BCX: jax.Array) -> jax.Array:
    """Rows [B, C, ...] -> completion stream [1, T, ...], zeros in pad slots."""
    return _to_stream(self.slot_BC, self.src_T, x_BCX)


# The two moves are gathers whose transposes are each other (the maps are inverse on their valid
# entries; smjax.train.scoring checks that a plan round-trips and skips the step if not), so their
# custom VJPs gather too, where autodiff would emit scatter-adds (a serial loop on XLA's CPU
# backend, and a collision-handling one elsewhere) for a map it cannot know is one-to-one.
def _gather_rows(x_NX: jax.Array, idx: jax.Array) -> jax.Array:
  """x[idx] along the leading axis, zeros where idx < 0."""
  return jnp.take(x_NX, jnp.where(idx >= 0, idx, x_NX.shape[0]), axis=0, mode="fill",
                  fill_value=0)


@jax.custom_vjp
def _to_rows(slot_BC, src_T, x_1TX):
  return _gather_rows(x_1TX[0], slot_BC)


def _to_rows_fwd(slot_BC, src_T, x_1TX):
  return _to_rows(slot_BC, src_T, x_1TX), (slot_BC, src_T)


def _to_rows_bwd(res, g_BCX):
  slot_BC, src_T = res
  return None, None, _to_stream(slot_BC, src_T, g_BCX)


@jax.custom_vjp
def _to_stream(slot_BC, src_T, x_BCX):
  B, C = x_BCX.shape[:2]
  return _gather_rows(x_BCX.reshape((B * C,) + x_BCX.shape[2:]), src_T)[None]


def _to_stream_fwd(slot_BC, src_T, x_BCX):
  return _to_stream(slot_BC, src_T, x_BCX), (slot_BC, src_T)


def _to_stream_bwd(res, g_1TX):
  slot_BC, src_T = res
  return None, None, _to_rows(slot_BC, src_T, g_1TX)


_to_rows.defvjp(_to_rows_fwd, _to_rows_bwd)
_to_stream.defvjp(_to_stream_fwd, _to_stream_bwd)
