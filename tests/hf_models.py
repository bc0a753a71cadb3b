"""Random tiny `transformers` models for parity tests (built locally, nothing downloaded)."""

import torch
import transformers


def tiny_hf_model(family: str, *, tie: bool = False, seed: int = 0, vocab: int = 97):
  """A random tiny HF causal LM of `family` in ("qwen2", "qwen3", "llama"), eval mode, fp32."""
  torch.manual_seed(seed)
  common = dict(vocab_size=vocab, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                tie_word_embeddings=tie, rms_norm_eps=1e-6)
  if family == "qwen2":
    cfg = transformers.Qwen2Config(rope_theta=10000.0, **common)
    model = transformers.Qwen2ForCausalLM(cfg)
  elif family == "qwen3":
    cfg = transformers.Qwen3Config(head_dim=16, rope_theta=1e6, **common)
    model = transformers.Qwen3ForCausalLM(cfg)
  elif family == "llama":
    cfg = transformers.LlamaConfig(
        rope_theta=500000.0, head_dim=8,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
        **common)
    model = transformers.LlamaForCausalLM(cfg)
  else:
    raise ValueError(family)
  # Default init leaves biases and norms at 0/1; randomise everything so each tensor matters.
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 and p.shape[0] in (48, 16, 8)
                                            else 0.0))
  return model.eval()
