"""Tiny model configs and a grouped batch with every loss input, shared by the step and layout tests
(test_layouts.py, test_train_state.py): rows [p0 x G, p1 x G, ...] with prompts and completions of
different lengths."""

import jax.numpy as jnp
import numpy as np

from smjax.batch import SequenceBatch
from smjax.models.transformer import ModelConfig

CFGS = {
    "qwen3": ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                         head_dim=8, d_ff=48, qk_norm=True),
    "qwen2": ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1,
                         head_dim=8, d_ff=48, qkv_bias=True, tie_embeddings=True),
}
PROMPTS, G, P, C = 3, 4, 7, 9
B, S = PROMPTS * G, P + C
T = S - 1


def grouped_batch(seed=0) -> SequenceBatch:
  """Rows [p0 x G, p1 x G, ...]: each prompt left-padded to P (lengths differ between prompts),
  G completions of varying length (pad after the end) and the per-target inputs of every loss.
  Layout(): every target column scored (the reference computation)."""
  rng = np.random.RandomState(seed)
  tok = np.zeros((B, S), np.int32)
  attn = np.zeros((B, S), bool)
  lm = np.zeros((B, T), bool)
  for p in range(PROMPTS):
    n = rng.randint(2, P + 1)
    ids = rng.randint(3, 64, n)
    for g in range(G):
      i = p * G + g
      tok[i, P - n:P] = ids
      attn[i, P - n:P] = True
      c = rng.randint(2, C + 1)
      tok[i, P:P + c] = rng.randint(3, 64, c)
      attn[i, P:P + c] = True
      lm[i, P - 1:P - 1 + c] = True
  pos = np.maximum(np.cumsum(attn, 1) - 1, 0).astype(np.int32)
  f = lambda *shape: jnp.asarray(-rng.rand(*shape).astype(np.float32) * 4)  # noqa: E731
  return SequenceBatch(
      tokens_BS=jnp.asarray(tok), positions_BS=jnp.asarray(pos), attn_mask_BS=jnp.asarray(attn),
      loss_mask_BT=jnp.asarray(lm), old_logp_BT=f(B, T), ref_logp_BT=f(B, T),
      rewards_B=jnp.asarray(rng.randint(0, 2, B).astype(np.float32)),
      teacher_logp_BT=f(B, T),
      teacher_logits_BTV=jnp.asarray(rng.randn(B, T, 64).astype(np.float32)))
