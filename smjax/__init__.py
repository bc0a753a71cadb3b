"""smjax: compute-efficient LLM post-training in JAX.

GRPO experts per domain, multi-teacher on-policy distillation (MOPD) into one student, and a FLOP
ledger that counts every training FLOP of each route. See README.md for the map of the package;
`smjax.grpo` and `smjax.distill` (smjax.api) run GRPO with your own reward, and distillation, in
a few lines.

Shapes are in the names of arrays (`logits_BTV`, `mask_BT`), with one letter legend for the whole
project (docs/design.md#shape-legend); no module gives a letter another meaning, and anything else
is named in words (`s_BT_topk`, `w_Bblocks_block`):

  B rows            G group size (samples per prompt)   P prompt length     C completion length
  S = P + C         T = S - 1 target positions (query time inside the model)
  D model dim       N query heads    K kv heads    H head dim    F mlp dim    V vocab    L layers

With SMJAX_CPU_MALLOC=tuned in the environment, importing smjax sets glibc's malloc so that XLA:CPU
reuses a big step's per-call buffers instead of page-faulting them in again on every call; the
command line (smjax.main) gets the same from tcmalloc where installed (smjax.cpu_malloc says when
each helps).
"""

from smjax import cpu_malloc as _cpu_malloc

__version__ = "0.1.0"

_cpu_malloc.tune()

# The short API (smjax.api): `smjax.grpo(...)`, `smjax.distill(...)`. Imported on first use, so
# that `import smjax` stays light (no jax until a run is asked for).
_API = ("grpo", "distill", "grpo_settings", "distill_settings", "Model", "Result")


def __getattr__(name: str):
  if name in _API:
    from smjax import api  # pylint: disable=import-outside-toplevel
    return getattr(api, name)
  raise AttributeError(f"module 'smjax' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_API))
