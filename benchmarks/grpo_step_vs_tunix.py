"""GRPO step and iteration time: smjax's jitted step against Tunix's GRPO learner, both on jax CPU.

Same model (a random Qwen3-style `transformers` model saved with `save_pretrained`; smjax loads it
with `smjax.models.hf.load_params`, Tunix with `tunix.models.qwen3.params.
create_model_from_safe_tensors`), same batch, group size, lengths, loss settings and optimiser
(benchmarks/_peer_smjax.py and _peer_tunix.py say exactly what each side times):
- step: one GRPO update on a fixed batch (the same prompt/completion ids, masks, advantages).
  smjax: its jitted step; Tunix: its actor trainer's `nnx.jit` train step on a `TrainExample`.
  The first-step gradient norms are printed as a check that both compute the same thing.
- iteration: sampling G completions per prompt + reward + update. smjax: `Sampler.generate` +
  the step; Tunix: one `GRPOLearner.train()` global step with the "vanilla" rollout engine.

Tunix runs in its own venv (`<envs-dir>/tunix`, created on first use with `pip install
google-tunix`, which brings its own jax and flax), as a subprocess that inherits this process's
CPU affinity, so both sides use the same cores (`--threads N` pins both to N). If Tunix cannot
be installed or cannot run here, the script prints why and exits non-zero; it never reports a
number it did not measure.

The peer runs twice: as shipped, and under the glibc malloc settings of SMJAX_CPU_MALLOC=tuned
(`--peer-malloc both`, the default; benchmarks/_peer_smjax.py says why); both ratios are printed
and kept. smjax's side runs with glibc's defaults unless this process has SMJAX_CPU_MALLOC=tuned.

  .venv/bin/python benchmarks/grpo_step_vs_tunix.py   # writes bench_results/grpo_step_vs_tunix.json
  .venv/bin/python benchmarks/grpo_step_vs_tunix.py --size tiny --skip-peer --out /tmp/t.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _peer_common  # pylint: disable=wrong-import-position
import _peer_smjax  # pylint: disable=wrong-import-position

# The step speedup the benchmark issue asks for (printed against the machine's matmul peak).
GOAL = 1.5
REQUIREMENTS = _peer_common.TUNIX_REQUIREMENTS


def main(argv=None) -> dict:
  args = _peer_smjax.parse_args(__doc__.split("\n\n")[0], "tunix", argv)
  try:
    return _peer_smjax.compare(args, peer="tunix", requirements=REQUIREMENTS,
                               goal=GOAL, peer_script="_peer_tunix.py")
  except RuntimeError as e:
    sys.exit(f"grpo_step_vs_tunix: the Tunix side could not run, so there is no comparison: {e}")


if __name__ == "__main__":
  main()
