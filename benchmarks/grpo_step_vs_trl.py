"""GRPO step and iteration time: smjax's jitted step against TRL's GRPOTrainer on torch CPU.

Same model (a random Qwen3-style `transformers` model saved with `save_pretrained`; smjax loads it
with `smjax.models.hf.load_params`, TRL with `from_pretrained`), same batch, group size, lengths,
loss settings and optimiser on both sides (benchmarks/_peer_smjax.py and _peer_trl.py say
exactly what each side times):
- step: one GRPO update on a fixed batch (the same prompt/completion ids, masks, advantages).
  smjax: the jitted step; TRL: a `GRPOTrainer.train()` optimizer step with generation replaced
  by that batch. The first-step gradient norms of the two are printed as a check that both
  compute the same thing.
- iteration: sampling G completions per prompt + reward + update. smjax: `Sampler.generate` +
  the step; TRL: a plain `GRPOTrainer.train()` step (`transformers.generate`).

TRL runs in its own venv (`<envs-dir>/trl`, created on first use with `pip install trl
torch==2.13.0 transformers`; torch is pinned to the CPU wheel on this disk), as a subprocess that
inherits this process's CPU affinity, so both sides use the same cores (`--threads N` pins both
to N; the output says which). TRL's dependencies never enter smjax's venv.

The peer runs twice: as shipped, and under the glibc malloc settings of SMJAX_CPU_MALLOC=tuned
(`--peer-malloc both`, the default; benchmarks/_peer_smjax.py says why); both ratios are printed
and kept. smjax's side runs with glibc's defaults unless this process has SMJAX_CPU_MALLOC=tuned.

  .venv/bin/python benchmarks/grpo_step_vs_trl.py     # writes bench_results/grpo_step_vs_trl.json
  .venv/bin/python benchmarks/grpo_step_vs_trl.py --size tiny --skip-peer --out /tmp/t.json
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _peer_smjax  # pylint: disable=wrong-import-position

# The step speedup the benchmark issue asks for (printed against the machine's matmul peak).
GOAL = 2.0
REQUIREMENTS = ["trl==1.16.0", "torch==2.13.0", "transformers"]


def main(argv=None) -> dict:
  args = _peer_smjax.parse_args(__doc__.split("\n\n")[0], "trl", argv)
  try:
    return _peer_smjax.compare(args, peer="trl", requirements=REQUIREMENTS,
                               goal=GOAL, peer_script="_peer_trl.py")
  except RuntimeError as e:
    sys.exit(f"grpo_step_vs_trl: the TRL side could not run: {e}")


if __name__ == "__main__":
  main()
