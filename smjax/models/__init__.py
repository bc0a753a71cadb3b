"""Decoder models (Qwen2/Qwen2.5, Qwen3, Llama 3), presets, HF import/export and tokenizers."""
