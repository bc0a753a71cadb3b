"""Command-line entry point: `python -m smjax.main --config=configs/study.py:two_domain,demo --workdir=DIR`.

Also installed as the `smjax` console script. It restarts itself once with tcmalloc preloaded where
that is installed (smjax.cpu_malloc). Everything it does is library code in
smjax.study; this file only parses flags. Overrides use ml_collections' syntax, e.g.
`--config.joint.steps=400`; an unknown field is an error naming it.
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "A configs/*.py file and its argument, e.g. configs/study.py:two_domain,demo.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and the report.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None or _WORKDIR.value is None:
    raise app.UsageError("--config and --workdir are required, e.g. "
                         "--config=configs/study.py:two_domain,demo --workdir=runs/demo")
  from smjax import cpu_malloc, distributed  # pylint: disable=import-outside-toplevel
  logging.info("malloc: %s", cpu_malloc.STATUS)
  distributed.maybe_initialize()  # multi-host pods: before any jax computation; no-op otherwise
  from smjax.study.run import run_study  # pylint: disable=import-outside-toplevel
  report = run_study(_CONFIG.value, _WORKDIR.value)
  print()
  print(report["table"])
  print(f"report: {report['paths']['json']}")
  print(f"plot:   {report['paths']['plot']}")
  print(f"TensorBoard: tensorboard --logdir {_WORKDIR.value}")


def run():
  """Console-script entry (`smjax --config=... --workdir=...`). Restarts itself once under tcmalloc
  where it is installed (smjax.cpu_malloc.reexec_under_tcmalloc; SMJAX_CPU_MALLOC=glibc: no)."""
  from smjax import cpu_malloc  # pylint: disable=import-outside-toplevel
  cpu_malloc.reexec_under_tcmalloc(sys.orig_argv[1:])  # as started, interpreter options too
  logging.getLogger("jax._src.xla_bridge").setLevel(logging.ERROR)  # "no TPU/GPU found" noise
  app.run(main, argv=sys.argv)


if __name__ == "__main__":
  run()
