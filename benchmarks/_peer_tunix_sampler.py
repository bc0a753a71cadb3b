"""The Tunix side of benchmarks/rollout_vs_hf.py --tunix; runs inside the Tunix venv, not smjax's.

Usage (the driver does this, through `_peer_common.PeerSession`): `<envs-dir>/tunix/bin/python
_peer_tunix_sampler.py --spec s.json --out unused.json`; it then serves timing requests on stdin
(`{"op": "run", "args": {"mode": "sample", "reps": 1}}`), so the driver can interleave its rounds
with the other sides'.

The model is Tunix's own Qwen3 (`tunix.models.qwen3`), loaded from the same safetensors directory
the other sides load (`params.create_model_from_safe_tensors`), on a one-device ("fsdp", "tp")
mesh; the sampler is `tunix.generate.sampler.Sampler` (the "vanilla" engine Tunix's GRPO rollout
uses) with a KV cache of prompt bucket + new tokens. Each prompt string is repeated G times, as
Tunix's GRPO learner does, so the batch has the same rows as the other sides. An id the model
cannot emit is the only EOS, so every row runs the full `new_tokens`.

Modes: "sample" is temperature 1 with top_p = 1.0 (how Tunix's GRPO rollout config samples; with
top_p None Tunix decodes greedily), "greedy" is temperature 0. What is timed: one
`Sampler.__call__` (tokenising the prompts, prefill, the decode loop, detokenising), median of
`reps` calls after one warm-up call that compiles, each with its own seed.
"""

from __future__ import annotations

import os
import time

import numpy as np

import _peer_common as common
from _peer_tunix import WordTokenizer


def main():
  spec, _ = common.read_spec(__doc__.split("\n\n")[0])
  from importlib import metadata  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from tunix.generate import sampler as sampler_lib  # pylint: disable=import-outside-toplevel
  from tunix.models.qwen3 import model as qwen3_model  # pylint: disable=import-outside-toplevel
  from tunix.models.qwen3 import params as qwen3_params  # pylint: disable=import-outside-toplevel

  d = spec["dims"]
  cfg = qwen3_model.ModelConfig(
      num_layers=d["layers"], vocab_size=d["vocab"], embed_dim=d["d_model"], hidden_dim=d["d_ff"],
      num_heads=d["heads"], head_dim=d["head_dim"], num_kv_heads=d["kv_heads"],
      rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=False, dtype=jnp.float32,
      param_dtype=jnp.float32)
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  G, T, bucket = spec["samples"], spec["new_tokens"], spec["prompt_bucket"]
  strings = [common.ids_to_text(p) for p in spec["prompts"] for _ in range(G)]
  ready = dict(threads=len(os.sched_getaffinity(0)), jax=jax.__version__,
               tunix=metadata.version("google-tunix"), rows=len(strings), modes={})
  seeds = iter(range(1_000_000))
  with mesh:
    model = qwen3_params.create_model_from_safe_tensors(spec["model_dir"], cfg, mesh,
                                                        dtype=jnp.float32)
    sampler = sampler_lib.Sampler(
        model, WordTokenizer(),
        sampler_lib.CacheConfig(cache_size=bucket + T + 1, num_layers=d["layers"],
                                num_kv_heads=d["kv_heads"], head_dim=d["head_dim"]))
    kws = {mode: dict(temperature=0.0) if mode == "greedy" else dict(temperature=1.0, top_p=1.0)
           for mode in spec["modes"]}

    def call(mode):
      out = sampler(strings, max_generation_steps=T, max_prompt_length=bucket,
                    eos_tokens=[d["vocab"]], seed=next(seeds), **kws[mode])
      jax.block_until_ready(out.tokens)
      return out

    for mode, kw in kws.items():
      t0 = time.perf_counter()
      first_out = call(mode)
      first = time.perf_counter() - t0
      lengths = sorted({len(np.asarray(t)) for t in first_out.tokens})
      if lengths != [T]:
        raise RuntimeError(f"Tunix sampler returned completions of lengths {lengths}, "
                           f"expected {T} each (EOS is an id the model cannot emit)")
      ready["modes"][mode] = dict(
          first_call_s=first, what="Sampler.__call__: tokenise, prefill, decode loop, "
                                   "detokenise; " + ", ".join(f"{k}={v}" for k, v in kw.items()))
    common.serve(dict(run=lambda mode, reps: common.timed(lambda: call(mode), reps)), ready)


if __name__ == "__main__":
  main()
