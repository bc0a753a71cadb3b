"""Host-side assembly of `SequenceBatch`es: supervised (prompt + gold solution) and from rollouts.

Only tokenisation and padding happen on the host; everything per-token after that is on device.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from smjax.rollout import RolloutResult, full_sequence
from smjax.train.steps import SequenceBatch


def encode_prompt(tokenizer, text: str) -> list[int]:
  """Prompt ids, with BOS first when the tokenizer has one."""
  ids = tokenizer.encode(text)
  return ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + ids


def sft_batch(tokenizer, prompts: Sequence[str], targets: Sequence[str], *, seq_len: int) -> SequenceBatch:
  """Left-padded `prompt + target + EOS` rows; the loss covers target and EOS tokens only."""
  if len(prompts) != len(targets):
    raise ValueError(f"sft_batch: {len(prompts)} prompts but {len(targets)} targets")
  B = len(prompts)
  tokens = np.full((B, seq_len), tokenizer.pad_id, np.int32)
  attn = np.zeros((B, seq_len), bool)
  loss = np.zeros((B, seq_len), bool)
  for i, (p, t) in enumerate(zip(prompts, targets)):
    p_ids = encode_prompt(tokenizer, p)
    t_ids = tokenizer.encode(t) + [tokenizer.eos_id]
    n = len(p_ids) + len(t_ids)
    if n > seq_len:
      raise ValueError(f"sft_batch: example {i} needs {n} tokens ({p!r} -> {t!r}); "
                       f"seq_len={seq_len}")
    tokens[i, seq_len - n:] = p_ids + t_ids
    attn[i, seq_len - n:] = True
    loss[i, seq_len - len(t_ids):] = True
  positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
  return SequenceBatch(tokens_BS=jnp.asarray(tokens), positions_BS=jnp.asarray(positions),
                       attn_mask_BS=jnp.asarray(attn), loss_mask_BT=jnp.asarray(loss[:, 1:]))


def rollout_batch(result: RolloutResult, *, rewards_B=None) -> SequenceBatch:
  """The train-step view of a rollout: full sequences, target-aligned loss mask and behaviour
  log-probs (the sampler's temperature-1 log-probs; 0 on prompt targets)."""
  seq = full_sequence(result)
  B, P = result.prompt_BP.shape
  old_logp = jnp.concatenate([jnp.zeros((B, P - 1), jnp.float32),
                              result.logprobs_BT.astype(jnp.float32)], axis=1)
  return SequenceBatch(
      tokens_BS=seq.tokens_BS, positions_BS=seq.positions_BS, attn_mask_BS=seq.mask_BS,
      loss_mask_BT=seq.loss_mask_BS[:, 1:], old_logp_BT=old_logp,
      rewards_B=None if rewards_B is None else jnp.asarray(rewards_B, jnp.float32))


def decode_completions(tokenizer, result: RolloutResult) -> list[str]:
  """Completion texts (up to and excluding EOS) of every row."""
  toks = np.asarray(result.completion_BT)
  mask = np.asarray(result.completion_mask_BT)
  return [tokenizer.decode([int(t) for t, m in zip(row, mrow) if m]) for row, mrow in zip(toks, mask)]
