"""On-policy distillation (OPD) losses: the student's reverse KL to a teacher on its own samples.

docs/design.md#on-policy-distillation. The student pi_s sampled the tokens; the teacher pi_T
(temperature 1, same vocabulary) scored them. Three objectives, each a per-token loss aggregated
over valid tokens:

- `sampled`: A_t = -(log pi_s(y_t) - log pi_T(y_t)) (stop-gradient; current student log-probs),
  trained with GRPO's clipped importance-ratio objective against the behaviour log-probs
  (smjax.rl.grpo.token_terms). The single-sample estimator of the reverse-KL gradient: with
  rho = 1, grad = -E[A_t grad log pi_s(y_t)] = grad KL up to a zero-mean term.
- `full_vocab`: KL_t = sum_v pi_s(v) (log pi_s(v) - log pi_T(v)) from both logits, differentiated
  exactly w.r.t. the student logits. The per-token KL comes from the `reverse_kl` argument: the
  train step passes smjax.kernels.dispatch.reverse_kl (the fused Pallas kernel, or a token-chunked
  XLA path, never materialising [B, T, V] probabilities); the default, `full_vocab_kl`, is plain
  jnp (this module imports no kernel).
- `top_k`: the student's k largest logits at t (a discrete choice: no gradient through it).
  BOTH distributions are renormalised over them: q_s = softmax(s[top k]), q_T = softmax(t[top k]),
  and KL_t = sum_{v in top k} q_s(v) (log q_s(v) - log q_T(v)), a true KL on the k-simplex (>= 0,
  0 iff the teacher's conditional on the top k equals the student's). The gradient flows,
  exactly, to the student logits at the top k only; other logits and the teacher get none.

Aggregation and micro-batching follow smjax.rl.grpo: `token_mean` (DAPO), `seq_mean_token_mean`,
`seq_mean_token_sum_norm`; pass the whole batch's `num_valid_tokens` / `num_sequences` so that
micro-batch losses add up to the full-batch loss. Metrics in aux are micro-batch means over valid
tokens and carry no gradient.

Legend (docs/design.md#shape-legend): B rows, T target positions, V vocab; the top-k axis is
`_BT_topk`.
"""

import numbers

import jax
import jax.numpy as jnp

from smjax.rl import grpo
from smjax.rl.logprobs import token_logprobs

OBJECTIVES = ("sampled", "full_vocab", "top_k")
AGGREGATIONS = grpo.AGGREGATIONS
_F32 = jnp.float32


def aggregate(loss_BT, mask_BT, *, aggregation="token_mean", num_valid_tokens=None,
              num_sequences=None, max_len=None):
  """Scalar loss from per-token losses over valid tokens (masked entries may be NaN/inf).

  token_mean: sum / num_valid_tokens (default: this batch's count). seq_mean_token_mean: mean
  over non-empty rows of each row's token mean. seq_mean_token_sum_norm: mean over non-empty
  rows of token sum / max_len (default T). Normalisers are clamped to >= 1 (empty batch -> 0).
  The row weights are smjax.rl.grpo.row_weights, the GRPO loss's own.
  """
  grpo.check_aggregation(aggregation, max_len)
  valid = mask_BT > 0
  dtype = jnp.promote_types(loss_BT.dtype, _F32)
  row_sum_B = jnp.sum(jnp.where(valid, loss_BT.astype(dtype), 0.0), axis=1)
  n_B = jnp.sum(valid, axis=1).astype(dtype)
  w_B = grpo.row_weights(n_B, aggregation=aggregation, max_len=max_len or loss_BT.shape[1],
                         num_valid_tokens=num_valid_tokens, num_sequences=num_sequences)
  return jnp.sum(w_B.astype(dtype) * row_sum_B)


def sampled_advantages(student_logp_BT, teacher_logp_BT):
  """A_t = -(log pi_s(y_t) - log pi_T(y_t)), stop-gradient, float32."""
  return jax.lax.stop_gradient(teacher_logp_BT.astype(_F32) - student_logp_BT.astype(_F32))


def sampled_token_terms(student_logp_BT, old_logp_BT, teacher_logp_BT, mask_BT, *, eps_low,
                        eps_high):
  """GRPO's per-token clipped terms (grpo.TokenTerms) with the OPD advantage."""
  adv_BT = sampled_advantages(student_logp_BT, teacher_logp_BT)
  return grpo.token_terms(student_logp_BT.astype(_F32), old_logp_BT.astype(_F32), None,
                          adv_BT, mask_BT, eps_low=eps_low, eps_high=eps_high, beta=0.0,
                          kl_estimator="k1")


def full_vocab_kl(student_logits_BTV, teacher_logits_BTV):
  """Exact per-token reverse KL [B, T] (float32) in plain jnp, differentiable w.r.t. both logits.
  It holds [B, T, V] probabilities; smjax.kernels.dispatch.reverse_kl computes the same without
  them (the train step passes it to `opd_loss`). Tokens the student bans (logit -inf) add 0, not
  0 * -inf."""
  log_p = jax.nn.log_softmax(student_logits_BTV.astype(_F32), axis=-1)
  log_q = jax.nn.log_softmax(teacher_logits_BTV.astype(_F32), axis=-1)
  p = jnp.exp(log_p)
  return jnp.sum(p * jnp.where(p > 0, log_p - log_q, 0.0), axis=-1)


def top_k_kl(student_logits_BTV, teacher_logits_BTV, *, k):
  """Per-token KL [B, T] between student and teacher renormalised over the student's top k."""
  s_BTV = student_logits_BTV.astype(_F32)
  s_BT_topk, idx_BT_topk = jax.lax.top_k(s_BTV, k)
  t_BT_topk = jnp.take_along_axis(teacher_logits_BTV, idx_BT_topk, axis=-1).astype(_F32)
  t_BT_topk = jax.lax.stop_gradient(t_BT_topk)  # the teacher is a fixed target here
  log_qs_BT_topk = jax.nn.log_softmax(s_BT_topk, axis=-1)
  log_qt_BT_topk = jax.nn.log_softmax(t_BT_topk, axis=-1)
  return jnp.sum(jnp.exp(log_qs_BT_topk) * (log_qs_BT_topk - log_qt_BT_topk), axis=-1)


def _check_2d(name, x, mask_BT):
  if x is not None and x.shape != mask_BT.shape:
    raise ValueError(f"opd_loss: {name} shape {x.shape} must equal mask_BT shape "
                     f"{mask_BT.shape}")


def _check_args(objective, s_BTV, t_BTV, s_BT, old_BT, t_BT, tokens_BT, mask_BT, *, top_k,
                eps_low, eps_high, reverse_kl):
  if objective not in OBJECTIVES:
    raise ValueError(f"opd_loss: {objective=} must be one of {OBJECTIVES}")
  if reverse_kl is not None and not callable(reverse_kl):
    raise ValueError(f"opd_loss: reverse_kl={reverse_kl!r} must be None or a callable "
                     "(student_logits_BTV, teacher_logits_BTV) -> per-token KL [B, T]")
  if mask_BT.ndim != 2:
    raise ValueError(f"opd_loss: mask_BT must be 2-D [B, T], got shape {mask_BT.shape}")
  for name, x in (("student_logp_BT", s_BT), ("old_logp_BT", old_BT),
                  ("teacher_logp_BT", t_BT), ("tokens_BT", tokens_BT)):
    _check_2d(name, x, mask_BT)
  for name, x in (("student_logits_BTV", s_BTV), ("teacher_logits_BTV", t_BTV)):
    if x is not None and (x.ndim != 3 or x.shape[:2] != mask_BT.shape):
      raise ValueError(f"opd_loss: {name} shape {x.shape} must be [B, T, V] with [B, T] = "
                       f"mask_BT shape {mask_BT.shape}")
  if s_BTV is not None and t_BTV is not None and s_BTV.shape[-1] != t_BTV.shape[-1]:
    raise ValueError(
        f"opd_loss: student vocab {s_BTV.shape[-1]} != teacher vocab {t_BTV.shape[-1]}: "
        "the teacher must share the student's vocabulary")
  if objective == "sampled":
    for who, logp, logits in (("student", s_BT, s_BTV), ("teacher", t_BT, t_BTV)):
      if logp is None and (logits is None or tokens_BT is None):
        raise ValueError(f"opd_loss('sampled') needs {who}_logp_BT, or "
                         f"{who}_logits_BTV together with tokens_BT")
    for name, v in (("eps_low", eps_low), ("eps_high", eps_high)):
      if not isinstance(v, numbers.Real) or v < 0:
        raise ValueError(f"opd_loss: {name}={v!r} must be a non-negative float")
    if eps_low >= 1:
      raise ValueError(f"opd_loss: {eps_low=} must be < 1 (clip range [1-eps_low, ...])")
  else:
    if s_BTV is None or t_BTV is None:
      raise ValueError(f"opd_loss({objective!r}) needs student_logits_BTV and "
                       "teacher_logits_BTV")
  if objective == "top_k":
    v = s_BTV.shape[-1]
    if not isinstance(top_k, numbers.Integral) or not 1 <= top_k <= v:
      raise ValueError(f"opd_loss: {top_k=} must be an int in [1, V={v}]")


def _exact_kl(reverse_kl, s_BTV, t_BTV):
  kl_BT = reverse_kl(s_BTV, t_BTV)
  if kl_BT.shape != s_BTV.shape[:2]:
    raise ValueError(f"opd_loss: reverse_kl returned shape {kl_BT.shape}; expected the per-token "
                     f"KL [B, T] = {s_BTV.shape[:2]} of logits {s_BTV.shape}")
  return kl_BT


def opd_loss(objective, *, student_logits_BTV=None, teacher_logits_BTV=None,
             student_logp_BT=None, old_logp_BT=None, teacher_logp_BT=None, tokens_BT=None,
             mask_BT, aggregation="token_mean", num_valid_tokens=None, num_sequences=None,
             max_len=None, eps_low=0.2, eps_high=0.2, top_k=32, reverse_kl=None):
  """OPD loss and metrics: (scalar loss, aux dict of float scalars).

  objective: "sampled" | "full_vocab" | "top_k" (module docstring).
  sampled needs student_logp_BT (differentiable) and teacher_logp_BT, or the logits plus
    tokens_BT to compute them; old_logp_BT is the behaviour (sampler) log-probs, default the
    stop-gradient of student_logp_BT (strictly on-policy, rho = 1).
  full_vocab / top_k need student_logits_BTV (differentiable) and teacher_logits_BTV [B, T, V]
    at the positions that predict each token; logits must be finite everywhere (masked too).
  tokens_BT (optional): the sampled tokens, for the log-prob metrics of the logit objectives.
  mask_BT: 1/True on completion tokens.
  reverse_kl: `(student_logits_BTV, teacher_logits_BTV) -> KL [B, T]`, the exact KL of
    "full_vocab" (and of top_k's reverse_kl_full metric); None: full_vocab_kl. A train step passes
    functools.partial(smjax.kernels.dispatch.reverse_kl, impl=..., mesh=...).
  aux: loss; reverse_kl (mean per valid token of the objective's KL: the sampled estimate
    log pi_s - log pi_T for "sampled", exact for "full_vocab", top-k for "top_k");
    student_logp / teacher_logp (mean log-prob of the sampled tokens; NaN if not computable);
    num_valid_tokens, num_sequences; sampled adds ratio_mean, clip_frac, advantage_mean;
    top_k adds reverse_kl_full (exact KL) and top_k_mass (student mass on its top k).
  """
  _check_args(objective, student_logits_BTV, teacher_logits_BTV, student_logp_BT, old_logp_BT,
              teacher_logp_BT, tokens_BT, mask_BT, top_k=top_k, eps_low=eps_low,
              eps_high=eps_high, reverse_kl=reverse_kl)
  if student_logp_BT is None and student_logits_BTV is not None and tokens_BT is not None:
    student_logp_BT = token_logprobs(student_logits_BTV, tokens_BT)
  if teacher_logp_BT is None and teacher_logits_BTV is not None and tokens_BT is not None:
    teacher_logp_BT = token_logprobs(jax.lax.stop_gradient(teacher_logits_BTV), tokens_BT)
  agg = dict(aggregation=aggregation, num_valid_tokens=num_valid_tokens,
             num_sequences=num_sequences, max_len=max_len)
  sg = jax.lax.stop_gradient
  if reverse_kl is None:
    reverse_kl = full_vocab_kl
  aux = {}
  if objective == "sampled":
    old = sg(student_logp_BT) if old_logp_BT is None else old_logp_BT
    terms = sampled_token_terms(student_logp_BT, old, teacher_logp_BT, mask_BT,
                                eps_low=eps_low, eps_high=eps_high)
    loss = aggregate(terms.loss, mask_BT, **agg)
    kl_BT = -sampled_advantages(student_logp_BT, teacher_logp_BT)
    aux["ratio_mean"] = grpo.masked_mean(sg(terms.ratio), mask_BT)
    aux["clip_frac"] = grpo.masked_mean((terms.clip_low | terms.clip_high).astype(_F32),
                                        mask_BT)
    aux["advantage_mean"] = grpo.masked_mean(-kl_BT, mask_BT)
  elif objective == "full_vocab":
    kl_BT = _exact_kl(reverse_kl, student_logits_BTV, teacher_logits_BTV)
    loss = aggregate(kl_BT, mask_BT, **agg)
  else:
    kl_BT = top_k_kl(student_logits_BTV, teacher_logits_BTV, k=top_k)
    loss = aggregate(kl_BT, mask_BT, **agg)
    s = sg(student_logits_BTV)
    full_BT = _exact_kl(reverse_kl, s, sg(teacher_logits_BTV))
    aux["reverse_kl_full"] = grpo.masked_mean(full_BT, mask_BT)
    s32 = s.astype(_F32)
    mass_BT = jnp.exp(jax.nn.logsumexp(jax.lax.top_k(s32, top_k)[0], axis=-1)
                      - jax.nn.logsumexp(s32, axis=-1))
    aux["top_k_mass"] = grpo.masked_mean(mass_BT, mask_BT)
  valid = mask_BT > 0
  nan = jnp.array(jnp.nan, _F32)
  aux.update(
      loss=sg(loss),
      reverse_kl=grpo.masked_mean(sg(kl_BT), mask_BT),
      student_logp=(nan if student_logp_BT is None
                    else grpo.masked_mean(sg(student_logp_BT), mask_BT)),
      teacher_logp=(nan if teacher_logp_BT is None
                    else grpo.masked_mean(sg(teacher_logp_BT), mask_BT)),
      num_valid_tokens=jnp.sum(valid).astype(_F32),
      num_sequences=jnp.sum(jnp.any(valid, axis=1)).astype(_F32),
  )
  return loss, aux
