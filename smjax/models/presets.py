"""Named model shapes: tiny configs for tests and the toy study, and real Qwen/Llama shapes.

The real shapes follow each model's published config.json; `tests/test_presets.py` checks every one
against the parameter count its model card publishes, with `jax.eval_shape` (nothing allocated).
"""

from __future__ import annotations

from smjax.models.tokenizer import CHAR_VOCAB_SIZE
from smjax.models.transformer import ModelConfig, RopeScaling

_QWEN25 = dict(rope_theta=1e6, rms_norm_eps=1e-6, qkv_bias=True, max_seq_len=32768)
_QWEN3 = dict(rope_theta=1e6, rms_norm_eps=1e-6, qk_norm=True, max_seq_len=40960, head_dim=128)
_LLAMA32 = dict(rope_theta=5e5, rms_norm_eps=1e-5, max_seq_len=131072, tie_embeddings=True,
                rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192))

PRESETS: dict[str, ModelConfig] = {
    # Toy char-level decoders (docs/design.md#toy-model-size: 2 layers, d_model 64 learns the
    # toy tasks in seconds).
    "toy-tiny": ModelConfig(vocab_size=CHAR_VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4,
                            n_kv_heads=4, head_dim=16, d_ff=256, max_seq_len=64, name="toy-tiny"),
    "toy-small": ModelConfig(vocab_size=CHAR_VOCAB_SIZE, d_model=128, n_layers=4, n_heads=4,
                             n_kv_heads=2, head_dim=32, d_ff=512, max_seq_len=96,
                             name="toy-small"),
    # Qwen2.5
    "qwen2.5-0.5b": ModelConfig(vocab_size=151936, d_model=896, n_layers=24, n_heads=14,
                                n_kv_heads=2, head_dim=64, d_ff=4864, tie_embeddings=True,
                                name="qwen2.5-0.5b", **_QWEN25),
    "qwen2.5-1.5b": ModelConfig(vocab_size=151936, d_model=1536, n_layers=28, n_heads=12,
                                n_kv_heads=2, head_dim=128, d_ff=8960, tie_embeddings=True,
                                name="qwen2.5-1.5b", **_QWEN25),
    "qwen2.5-7b": ModelConfig(vocab_size=152064, d_model=3584, n_layers=28, n_heads=28,
                              n_kv_heads=4, head_dim=128, d_ff=18944, tie_embeddings=False,
                              name="qwen2.5-7b", **_QWEN25),
    # Qwen3
    "qwen3-0.6b": ModelConfig(vocab_size=151936, d_model=1024, n_layers=28, n_heads=16,
                              n_kv_heads=8, d_ff=3072, tie_embeddings=True, name="qwen3-0.6b",
                              **_QWEN3),
    "qwen3-1.7b": ModelConfig(vocab_size=151936, d_model=2048, n_layers=28, n_heads=16,
                              n_kv_heads=8, d_ff=6144, tie_embeddings=True, name="qwen3-1.7b",
                              **_QWEN3),
    "qwen3-4b": ModelConfig(vocab_size=151936, d_model=2560, n_layers=36, n_heads=32,
                            n_kv_heads=8, d_ff=9728, tie_embeddings=True, name="qwen3-4b",
                            **_QWEN3),
    "qwen3-8b": ModelConfig(vocab_size=151936, d_model=4096, n_layers=36, n_heads=32,
                            n_kv_heads=8, d_ff=12288, tie_embeddings=False, name="qwen3-8b",
                            **_QWEN3),
    # Llama 3
    "llama-3.2-1b": ModelConfig(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32,
                                n_kv_heads=8, head_dim=64, d_ff=8192, name="llama-3.2-1b",
                                **_LLAMA32),
    "llama-3.2-3b": ModelConfig(vocab_size=128256, d_model=3072, n_layers=28, n_heads=24,
                                n_kv_heads=8, head_dim=128, d_ff=8192, name="llama-3.2-3b",
                                **_LLAMA32),
    "llama-3.1-8b": ModelConfig(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32,
                                n_kv_heads=8, head_dim=128, d_ff=14336, rope_theta=5e5,
                                rms_norm_eps=1e-5, max_seq_len=131072, tie_embeddings=False,
                                rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8192),
                                name="llama-3.1-8b"),
}


def get_preset(name: str, **overrides) -> ModelConfig:
  """A preset by name, with field overrides (e.g. `param_dtype="bfloat16"`)."""
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
  return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
