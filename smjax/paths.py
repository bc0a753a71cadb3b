"""Workdir files on any file system: the one layer (over etils.epath, as orbax's) through which the
study, the report and the metrics read and write, for local paths and `gs://BUCKET/DIR` alike.

- `resolve`: a local path made absolute (orbax requires it); a URL (`scheme://...`) unchanged, never
  `os.path.abspath`'d (that would turn gs://BUCKET/run into <cwd>/gs:/BUCKET/run on the local disk).
- `check_workdir`: before any work starts, a one-line error for a workdir this install cannot
  write: a scheme other than gs:// (orbax writes checkpoint arrays with tensorstore, which reaches
  only gs:// buckets and local or mounted paths), or a gs:// without the packages it needs.
- `write_atomic`: an interrupted write never leaves a finished-looking file. Locally the file is
  written beside its final name and renamed (atomic); on an object store the object is uploaded
  whole under its final name (a store publishes an object only when its upload completes, and a
  rename there is a copy then a delete), so a file a reader finds is whole.
- Object stores have no directories and no appends: `makedirs` does nothing there, and a file that
  grows (metrics.jsonl, TensorBoard's events) is rewritten whole (smjax.train.metrics).

On a multi-host run every process runs the study; only process 0 writes the shared files
(`smjax.distributed.is_coordinator`: config.json, arms.json, result.json, the report, metrics),
while every process calls orbax's save (it coordinates its own writes).
"""

from __future__ import annotations

import importlib
import os
import posixpath

from etils import epath

# The URL schemes a workdir may have: tensorstore (orbax's array writer) has a driver for gs://
# only; any other scheme would reach it as a relative local path.
SCHEMES = ("gs",)


def is_url(path) -> bool:
  """True for `scheme://...` (gs://, s3://, ...), False for a local path."""
  return "://" in str(path)


def resolve(path) -> str:
  """A local path made absolute, a URL unchanged."""
  path = os.fspath(path)
  return path if is_url(path) else os.path.abspath(path)


def join(base, *parts: str) -> str:
  """`base/part/...` as a string (posix separators for a URL)."""
  base = os.fspath(base)
  return posixpath.join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def check_workdir(workdir, *, checkpoints: bool = True) -> None:
  """Raises a one-line ValueError naming `workdir` when it is a URL this install cannot read and
  write (its scheme, or the package to install); does nothing for a local path. `checkpoints`:
  orbax will save there too (on gs://, it asks google-cloud-storage about the bucket whenever it
  lists or deletes steps)."""
  workdir = os.fspath(workdir)
  if not is_url(workdir):
    return
  scheme = workdir.split("://", 1)[0]
  if scheme not in SCHEMES:
    raise ValueError(f"workdir {workdir}: {scheme}:// is not supported; give a local path (or a "
                     "mounted bucket) or gs://BUCKET/DIR (orbax writes checkpoint arrays with "
                     "tensorstore, which reaches only gs:// buckets)")
  missing = []
  try:
    epath.Path(workdir).exists()
  except ImportError:   # fsspec finds no gs:// implementation: gcsfs is not installed
    missing.append("gcsfs")
  except Exception as e:  # pylint: disable=broad-except  # credentials, network, no such bucket
    raise ValueError(f"workdir {workdir}: cannot be reached ({' '.join(str(e).split())[:300]});"
                     " check the bucket's name and this machine's credentials (gcloud auth "
                     "application-default login)") from e
  try:
    if checkpoints:
      importlib.import_module("google.cloud.storage")
  except ImportError:
    missing.append("google-cloud-storage")
  if missing:
    raise ValueError(f"workdir {workdir}: reading and writing gs:// needs {' and '.join(missing)}"
                     f" (pip install {' '.join(missing)}, or 'smjax[gcs]'), which this install lacks")


def exists(p) -> bool:
  return epath.Path(p).exists()


def listdir(p) -> list[str]:
  """The names of `p`'s entries, sorted."""
  return sorted(c.name for c in epath.Path(p).iterdir())


def makedirs(p) -> None:
  """`p` and its parents (nothing on an object store: a file's write creates its prefixes)."""
  if not is_url(p):
    epath.Path(p).mkdir(parents=True, exist_ok=True)


def rmtree(p) -> None:
  """Removes the tree at `p` if there is one."""
  if exists(p):
    epath.Path(p).rmtree(missing_ok=True)


def read_bytes(p) -> bytes:
  """The file's bytes; FileNotFoundError if it is absent."""
  return epath.Path(p).read_bytes()


def read_text(p) -> str:
  """The file's UTF-8 text; FileNotFoundError if it is absent, UnicodeDecodeError if not UTF-8."""
  return read_bytes(p).decode("utf-8")


def write_atomic(p, data: str | bytes, *, tmp_suffix: str = ".tmp") -> None:
  """Writes `data` (text as UTF-8) to `p` so that a reader never sees a half-written file: locally
  to `p + tmp_suffix`, renamed over `p`; on an object store, one upload under `p` (see the module
  docstring). The parent directory must exist (`makedirs`)."""
  p = os.fspath(p)
  raw = data.encode("utf-8") if isinstance(data, str) else data
  if is_url(p):
    epath.Path(p).write_bytes(raw)
    return
  tmp = epath.Path(p + tmp_suffix)
  tmp.write_bytes(raw)
  tmp.replace(p)


def open_append(p):
  """`p` opened for appending text (a local path: an object store cannot append)."""
  if is_url(p):
    raise ValueError(f"{p}: an object store cannot append; rewrite the file whole")
  return epath.Path(p).open("a")
