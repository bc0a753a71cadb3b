"""smjax: compute-efficient LLM post-training in JAX.

GRPO experts per domain, multi-teacher on-policy distillation (MOPD) into one student, and a FLOP
ledger that counts every training FLOP of each route. See README.md for the map of the package.
"""

__version__ = "0.1.0"
