"""The study's config files, configs/*.py: named by a path or by a short name, found installed too.

The configs ship inside the package: pyproject.toml's package-dir installs configs/ as
smjax.configs (as kernels/ is smjax.kernels), so `--config=study:two_domain,demo` and
`load("study", "two_domain,demo")` work outside a clone (a wheel install, any cwd). What --config
names (`PATH[:ARG]`, ARG going to the file's `get_config`) resolves to a file, in this order:

  1. PATH is an existing file (relative to the cwd, as ml_collections reads it): that file, so
     `configs/study.py:...` in a clone is the clone's file, and any other config file works too;
  2. PATH is a short name (`study`, `study.py`), or a relative `configs/study.py` or
     `smjax/configs/study.py` that does not exist from the cwd (outside a clone): the packaged
     file of that name; a name no packaged config has is a ValueError listing those there are;
  3. any other PATH (absolute, or in another directory): as given, so that a missing file is
     ml_collections' "no such file" (one line on the command line, smjax.main.user_error).

The packaged files are found through the installed package smjax.configs (importlib: a wheel's
copy, or the clone's configs/ for an editable install), else, in a source tree run without
installing (PYTHONPATH=<repo>), in <repo>/configs beside the smjax package. This module imports
nothing heavy: the command line resolves --config before it imports jax.
"""

from __future__ import annotations

import importlib.util
import os
import re

EXAMPLE = "study:two_domain,demo"   # the short name the usage texts and errors show
_LAYOUT_DIRS = ("configs", os.path.join("smjax", "configs"))


def configs_dir() -> str | None:
  """The directory holding the packaged config files: the installed smjax.configs' (a wheel's
  copy, or the clone's configs/ for an editable install), else <repo>/configs beside the smjax
  package (a source tree on PYTHONPATH, not installed); None where neither is."""
  try:
    spec = importlib.util.find_spec("smjax.configs")
  except (ImportError, ValueError):   # a broken install: fall back to the source tree
    spec = None
  if spec is not None and spec.submodule_search_locations:
    return list(spec.submodule_search_locations)[0]
  beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
  return beside if os.path.isfile(os.path.join(beside, "__init__.py")) else None


def names() -> list[str]:
  """The packaged configs' short names (their file names without .py), sorted."""
  where = configs_dir()
  if where is None:
    return []
  return sorted(f[:-3] for f in os.listdir(where) if f.endswith(".py") and not f.startswith("_"))


def _short_name(path: str) -> str | None:
  """The config name `path` stands for when it is a short name (`study`, `study.py`) or a
  relative path of the repository's layout (`configs/study.py`, `smjax/configs/study.py`)."""
  if not path or os.path.isabs(path):
    return None
  head, tail = os.path.split(os.path.normpath(path))
  if head not in ("",) + _LAYOUT_DIRS or tail in (os.curdir, os.pardir):
    return None
  return tail[:-3] if tail.endswith(".py") else tail


def unknown_message(path: str) -> str:
  """The one line for a --config that is neither a file nor a packaged config's name."""
  known = names()
  listed = (f"the packaged configs are {', '.join(known)}" if known else
            "no packaged configs were found (smjax.configs is not installed)")
  return (f"config {path!r}: no such file and no packaged config of that name; {listed} "
          f"(e.g. --config={EXAMPLE})")


def resolve(spec: str) -> str:
  """`PATH[:ARG]`, as --config takes it, with PATH made the file to load (the module docstring
  gives the order); ARG is kept as given. A short name that no packaged config has: ValueError."""
  path, sep, arg = spec.partition(":")
  if os.path.isfile(path):
    return spec
  name = _short_name(path)
  if name is None:
    return spec
  if name not in names():
    raise ValueError(unknown_message(path))
  return os.path.join(configs_dir(), f"{name}.py") + sep + arg


def load(config: str, arg: str | None = None, *, lock: bool = True):
  """A config file's `get_config(arg)`: the study's ml_collections ConfigDict, e.g.
  `load("study", "two_domain,demo")` or `load("study:two_domain,demo")`.

  `config` is what --config takes (a packaged config's short name, or a path), resolved the same
  way; `arg` goes to `get_config` (none: `get_config()`). The dict is locked, as the command line
  locks it, so that setting a misspelt field is an error naming it; `lock=False` leaves it open.
  The file runs afresh on every call (an edited config is picked up without a restart)."""
  if ":" in config:
    if arg is not None:
      raise ValueError(f"load({config!r}, {arg!r}): give the argument once, after the colon or "
                       "as arg")
    config, arg = config.split(":", 1)
  path = resolve(config)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path}: no such file; give a path to a config file or "
                            f"a packaged config's name ({', '.join(names())})")
  stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
  spec = importlib.util.spec_from_file_location(f"smjax_config_{stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise ValueError(f"config file {path}: defines no get_config(arg); expected an ml_collections "
                     "config file")
  c = module.get_config() if arg is None else module.get_config(arg)
  if lock and callable(getattr(c, "lock", None)):
    c.lock()
  return c
