"""Log-probabilities of given tokens under logits, without a [B, T, V] log_softmax.

log p(y_t) = logits[y_t] - logsumexp(logits). The forward keeps only [B, T] temporaries (XLA
fuses the exp into the reduction); the custom backward writes g * (onehot(y) - softmax) in one
fused expression, so the only [B, T, V] array is the gradient itself (jax.nn.log_softmax +
take_along_axis would keep the [B, T, V] log-softmax and a scattered one-hot besides).

`token_logprobs_and_entropy` also returns the entropy of every position (a training metric) from
the same max and exponentials: H = lse - sum(softmax * logits). A separate log_softmax-based
entropy reads the [B, T, V] logits again with its own exp passes (~4% of a small GRPO step).

Legend (docs/design.md#shape-legend): B rows, T target positions, V vocab.
"""

import jax
import jax.numpy as jnp


def compute_dtype(x):
  return jnp.promote_types(x.dtype, jnp.float32)


def _lse_and_picked(logits_BTV, tokens_BT):
  x = logits_BTV.astype(compute_dtype(logits_BTV))
  lse_BT = jax.nn.logsumexp(x, axis=-1)
  # mode="fill": an out-of-range token gives NaN (loud), not a silently clamped index.
  picked_BT = jnp.take_along_axis(x, tokens_BT[..., None], axis=-1, mode="fill",
                                  fill_value=jnp.nan)[..., 0]
  return lse_BT, picked_BT


@jax.custom_vjp
def _token_logprobs(logits_BTV, tokens_BT):
  lse_BT, picked_BT = _lse_and_picked(logits_BTV, tokens_BT)
  return picked_BT - lse_BT


def _fwd(logits_BTV, tokens_BT):
  lse_BT, picked_BT = _lse_and_picked(logits_BTV, tokens_BT)
  return picked_BT - lse_BT, (logits_BTV, tokens_BT, lse_BT)


@jax.named_scope("token_logprobs")
def _bwd(res, g_BT):
  logits_BTV, tokens_BT, lse_BT = res
  x = logits_BTV.astype(lse_BT.dtype)
  vocab_V = jnp.arange(x.shape[-1], dtype=tokens_BT.dtype)
  onehot = (vocab_V == tokens_BT[..., None]).astype(x.dtype)
  d_logits = g_BT[..., None] * (onehot - jnp.exp(x - lse_BT[..., None]))
  return d_logits.astype(logits_BTV.dtype), None


_token_logprobs.defvjp(_fwd, _bwd)


def _lse_picked_entropy(logits_BTV, tokens_BT):
  x = logits_BTV.astype(compute_dtype(logits_BTV))
  max_BT = jnp.max(x, axis=-1)
  e_BTV = jnp.exp(x - max_BT[..., None])
  sum_BT = jnp.sum(e_BTV, axis=-1)
  # 0 * -inf (a banned token) is NaN; its probability is exactly 0, so it adds nothing.
  ex_BT = jnp.sum(jnp.where(e_BTV > 0, e_BTV * x, 0.0), axis=-1)
  lse_BT = max_BT + jnp.log(sum_BT)
  picked_BT = jnp.take_along_axis(x, tokens_BT[..., None], axis=-1, mode="fill",
                                  fill_value=jnp.nan)[..., 0]
  return lse_BT, picked_BT, lse_BT - ex_BT / sum_BT


@jax.custom_vjp
def _token_logprobs_and_entropy(logits_BTV, tokens_BT):
  lse_BT, picked_BT, entropy_BT = _lse_picked_entropy(logits_BTV, tokens_BT)
  return picked_BT - lse_BT, entropy_BT


def _fwd_ent(logits_BTV, tokens_BT):
  lse_BT, picked_BT, entropy_BT = _lse_picked_entropy(logits_BTV, tokens_BT)
  return (picked_BT - lse_BT, entropy_BT), (logits_BTV, tokens_BT, lse_BT)


def _bwd_ent(res, g):
  g_BT, _ = g  # the entropy is a metric: no gradient flows through it
  return _bwd(res, g_BT)


_token_logprobs_and_entropy.defvjp(_fwd_ent, _bwd_ent)


def _check(logits_BTV, tokens_BT, name):
  if logits_BTV.shape[:-1] != tokens_BT.shape:
    raise ValueError(f"{name}: logits_BTV {logits_BTV.shape} must be tokens_BT "
                     f"{tokens_BT.shape} plus a vocab axis")
  if not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
    raise ValueError(f"{name}: tokens_BT dtype {tokens_BT.dtype} must be integer")


def token_logprobs(logits_BTV: jax.Array, tokens_BT: jax.Array) -> jax.Array:
  """log softmax(logits)[token] for every position: [..., V], [...] int -> [...] float32.

  Differentiable w.r.t. the logits. Out-of-range tokens give NaN. Logits are usually those
  that predicted the token, i.e. the model's logits shifted by one position (the caller's job).
  """
  _check(logits_BTV, tokens_BT, "token_logprobs")
  with jax.named_scope("token_logprobs"):   # a profile's name for the vocabulary-wide work
    return _token_logprobs(logits_BTV, tokens_BT)


def token_logprobs_and_entropy(logits_BTV: jax.Array,
                               tokens_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(`token_logprobs(logits, tokens)`, entropy of softmax(logits) over V), both [...] float32,
  sharing one max and one exp pass over the logits.

  Differentiable w.r.t. the logits through the log-probs only: the entropy is a metric and
  passes no gradient (as if under stop_gradient). -inf logits (banned tokens) are fine.
  """
  _check(logits_BTV, tokens_BT, "token_logprobs_and_entropy")
  with jax.named_scope("token_logprobs"):
    return _token_logprobs_and_entropy(logits_BTV, tokens_BT)
