"""The study's config files (ml_collections: `get_config(arg)`), installed as smjax.configs.

Each file's docstring gives its command, arguments, runtime and expected result:

  study                  a whole study: split-then-merge against joint GRPO, plus claims (c), (d)
  base                   the shared toy base only (SFT, then the band check)
  joint_grpo             joint GRPO on the mixed prompt stream of all domains
  expert_grpo            GRPO experts, one per domain
  mopd                   split-then-merge: the experts, then multi-teacher OPD from them
  external_teacher_opd   claim (c): OPD from an external post-trained teacher against GRPO
  self_teacher           claim (d): recover a degraded domain from the model's own checkpoint
  regimes                one cell of the regime map
  qwen25_1p5b_v5e8       a real model (Qwen2.5-1.5B-class) on a TPU v5e-8
  smollm2                a real pretrained model on CPU: SmolLM2-135M-Instruct, GRPO then MOPD
                         (benchmarks/real_model.py)
  smollm2_study          the study's main comparison on SmolLM2-135M-Instruct on CPU: two-digit
                         sums and differences asked in words

On the command line by path in a clone (`--config=configs/study.py:two_domain,demo`) or by short
name anywhere (`--config=study:two_domain,demo`); in Python, `smjax.configs.load("study",
"two_domain,demo")` returns the ConfigDict. How a name resolves: smjax.config_files. The files
stay in the repository's configs/ (pyproject.toml's package-dir maps it to smjax.configs, as
kernels/ to smjax.kernels), and each still works given as a path.
"""

from smjax.config_files import load, names

__all__ = ["load", "names"]
