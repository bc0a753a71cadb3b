"""Log-probabilities of given tokens under logits, without a [B, T, V] log_softmax.

log p(y_t) = logits[y_t] - logsumexp(logits). The forward keeps only [B, T] temporaries (XLA
fuses the exp into the reduction); the custom backward writes g * (onehot(y) - softmax) in one
fused expression, so the only [B, T, V] array is the gradient itself (jax.nn.log_softmax +
take_along_axis would keep the [B, T, V] log-softmax and a scattered one-hot besides).

Legend: B batch, T time, V vocab.
"""

import jax
import jax.numpy as jnp


def _compute_dtype(x):
    return jnp.promote_types(x.dtype, jnp.float32)


def _lse_and_picked(logits_BTV, tokens_BT):
    x = logits_BTV.astype(_compute_dtype(logits_BTV))
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


def _bwd(res, g_BT):
    logits_BTV, tokens_BT, lse_BT = res
    x = logits_BTV.astype(lse_BT.dtype)
    vocab_V = jnp.arange(x.shape[-1], dtype=tokens_BT.dtype)
    onehot = (vocab_V == tokens_BT[..., None]).astype(x.dtype)
    d_logits = g_BT[..., None] * (onehot - jnp.exp(x - lse_BT[..., None]))
    return d_logits.astype(logits_BTV.dtype), None


_token_logprobs.defvjp(_fwd, _bwd)


def token_logprobs(logits_BTV: jax.Array, tokens_BT: jax.Array) -> jax.Array:
    """log softmax(logits)[token] for every position: [..., V], [...] int -> [...] float32.

    Differentiable w.r.t. the logits. Out-of-range tokens give NaN. Logits are usually those
    that predicted the token, i.e. the model's logits shifted by one position (the caller's job).
    """
    if logits_BTV.shape[:-1] != tokens_BT.shape:
        raise ValueError(f"token_logprobs: logits_BTV {logits_BTV.shape} must be tokens_BT "
                         f"{tokens_BT.shape} plus a vocab axis")
    if not jnp.issubdtype(tokens_BT.dtype, jnp.integer):
        raise ValueError(f"token_logprobs: tokens_BT dtype {tokens_BT.dtype} must be integer")
    return _token_logprobs(logits_BTV, tokens_BT)
