"""Pallas kernels, one file each (kernel + jitted wrapper + custom_vjp + *_reference).

Installed as `smjax.kernels` (package-dir mapping in pyproject.toml): `from smjax.kernels import X`.

The bare name `kernels` belongs to Hugging Face's hub-kernels distribution, which transformers
(>= 5.25) imports from `transformers.activations`. Wherever the repository root is on sys.path
(`python -m pytest`, `python -c` or a notebook started in the root) this directory would shadow
it and every transformers model would fail to import, so imported under the bare name it hands
the import over to the installed distribution, and stays this empty package where none is installed.
"""
if __name__ == "kernels":
  import importlib.machinery as _machinery
  import importlib.util as _util
  import os as _os
  import sys as _sys

  _root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
  _spec = _machinery.PathFinder.find_spec(
      __name__, [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != _root])
  if _spec is not None and _spec.loader is not None:
    _module = _util.module_from_spec(_spec)
    _sys.modules[__name__] = _module  # the import statement returns what sys.modules holds
    _spec.loader.exec_module(_module)
