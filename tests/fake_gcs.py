"""A fake Google Cloud Storage, in memory, for tests of gs:// workdirs (test_remote_workdir.py).

Every way smjax and its libraries reach gs:// lands in one store of objects:
  - etils.epath (smjax.paths, orbax's metadata files): an fsspec file system registered for the
    gs/gcs protocols (in place of gcsfs);
  - tensorstore (orbax's arrays, its `gcs` kvstore driver): a local HTTP server speaking the subset
    of the GCS JSON API that driver uses (TENSORSTORE_GCS_HTTP_URL, GOOGLE_AUTH_TOKEN_FOR_TESTING);
  - orbax's bucket lookup (google.cloud.storage, asked whether the bucket has a hierarchical
    namespace): a stand-in module answering no.
Like a real bucket it has no directories (mkdir does nothing; a prefix exists while objects are
under it), cannot append, and shows an object only once its upload is complete.

`python tests/fake_gcs.py ARGS...` runs `smjax.main` (the study command) with ARGS against the fake;
FAKE_GCS_STATE names a file the bucket is loaded from (when present) and saved to at exit, so that
a second run sees the first one's objects.
"""

from __future__ import annotations

import http.server
import io
import itertools
import json
import os
import pickle
import re
import sys
import threading
import types
from urllib.parse import parse_qs, unquote, urlsplit

import fsspec
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem
from fsspec.utils import stringify_path

_GENERATION = itertools.count(1)
_LOCK = threading.RLock()


class _Upload(MemoryFile):
  """An object being written: stored (whole, with a new generation) when its writer closes."""

  def close(self):
    if not getattr(self, "_done", True):
      self._done = True
      self.commit()

  def commit(self):
    with _LOCK:
      FakeGCS.generations[self.path] = next(_GENERATION)
      super().commit()


class FakeGCS(MemoryFileSystem):
  """The bucket store as an fsspec file system for gs:// (keys "/BUCKET/NAME")."""

  protocol = ("gs", "gcs")
  store: dict = {}
  pseudo_dirs = [""]
  generations: dict = {}

  @classmethod
  def _strip_protocol(cls, path):
    path = stringify_path(path)
    for prefix in ("gs://", "gcs://"):
      path = path.removeprefix(prefix)
    path = path.strip("/")
    return "/" + path if path else ""

  def mkdir(self, path, create_parents=True, **kwargs):
    pass   # no directories in a bucket

  def makedirs(self, path, exist_ok=False):
    pass

  def _open(self, path, mode="rb", **kwargs):
    path = self._strip_protocol(path)
    if mode in ("wb", "xb"):
      if "x" in mode and path in self.store:
        raise FileExistsError(path)
      upload = _Upload(self, path)
      upload._done = False
      return upload
    if mode != "rb":
      raise ValueError(f"fake gcs: mode {mode!r} is not supported (a bucket cannot append)")
    with _LOCK:
      if path not in self.store:
        raise FileNotFoundError(path)
      return io.BytesIO(self.store[path].getvalue())

  def _rm(self, path):
    with _LOCK:
      path = self._strip_protocol(path)
      self.store.pop(path, None)
      self.generations.pop(path, None)

  def objects(self) -> dict[str, bytes]:
    """Every object, "gs://BUCKET/NAME" -> its bytes."""
    with _LOCK:
      return {"gs:/" + k: v.getvalue() for k, v in self.store.items()}


# ------------------------------------------------------------------------------ the HTTP side

def _put(key: str, data: bytes) -> int:
  with _LOCK:
    f = MemoryFile(FakeGCS(), key, data)
    FakeGCS.generations[key] = gen = next(_GENERATION)
    FakeGCS.store[key] = f
    return gen


def _meta(bucket: str, name: str) -> dict:
  key = f"/{bucket}/{name}"
  return {"kind": "storage#object", "bucket": bucket, "name": name,
          "size": str(FakeGCS.store[key].size), "generation": str(FakeGCS.generations[key]),
          "metageneration": "1"}


class _Handler(http.server.BaseHTTPRequestHandler):
  """GCS JSON API: object read (media or metadata, byte ranges, generation preconditions), media
  upload, delete and list."""

  protocol_version = "HTTP/1.1"

  def log_message(self, *args):
    pass

  def _reply(self, code: int, body: bytes | dict = b"", headers: dict | None = None):
    if isinstance(body, dict):
      body = json.dumps(body).encode()
    self.send_response(code)
    for k, v in (headers or {}).items():
      self.send_header(k, v)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def _error(self, code: int, msg: str):
    self._reply(code, {"error": {"code": code, "message": msg}})

  def _route(self):
    url = urlsplit(self.path)
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    m = re.fullmatch(r"(/upload)?/storage/v1/b/([^/]+)/o(?:/(.+))?", url.path)
    if not m:
      return None, None, None, q
    return bool(m.group(1)), m.group(2), unquote(m.group(3)) if m.group(3) else None, q

  def _precondition(self, key: str, q: dict) -> bool:
    gen = FakeGCS.generations.get(key, 0) if key in FakeGCS.store else 0
    if "ifGenerationMatch" in q and int(q["ifGenerationMatch"]) != gen:
      return False
    return True

  def do_GET(self):
    _, bucket, name, q = self._route()
    if bucket is None:
      return self._error(404, "unknown path")
    with _LOCK:
      if name is None:   # list
        prefix = f"/{bucket}/{q.get('prefix', '')}"
        items = []
        for key in sorted(FakeGCS.store):
          obj = key[len(bucket) + 2:]
          if (key.startswith(prefix) and obj >= q.get("startOffset", "")
              and (not q.get("endOffset") or obj < q["endOffset"])):
            items.append(_meta(bucket, obj))
        return self._reply(200, {"kind": "storage#objects", "items": items})
      key = f"/{bucket}/{name}"
      if key not in FakeGCS.store:
        return self._error(404, f"no such object: {bucket}/{name}")
      gen = FakeGCS.generations[key]
      if not self._precondition(key, q):
        return self._error(412, "precondition failed")
      if "ifGenerationNotMatch" in q and int(q["ifGenerationNotMatch"]) == gen:
        return self._reply(304, b"", {"x-goog-generation": str(gen)})
      if q.get("alt") != "media":
        return self._reply(200, _meta(bucket, name), {"x-goog-generation": str(gen)})
      data = FakeGCS.store[key].getvalue()
    headers = {"x-goog-generation": str(gen), "Content-Type": "application/octet-stream"}
    rng = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "") or "")
    if rng and data:
      lo = int(rng.group(1) or 0)
      hi = min(int(rng.group(2)) if rng.group(2) else len(data) - 1, len(data) - 1)
      headers["Content-Range"] = f"bytes {lo}-{hi}/{len(data)}"
      return self._reply(206, data[lo:hi + 1], headers)
    return self._reply(200, data, headers)

  def do_POST(self):
    upload, bucket, _, q = self._route()
    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
    if not upload or "name" not in q:
      return self._error(400, "only uploadType=media uploads are faked")
    key = f"/{bucket}/{q['name']}"
    with _LOCK:
      if not self._precondition(key, q):
        return self._error(412, "precondition failed")
      _put(key, body)
      return self._reply(200, _meta(bucket, q["name"]))

  def do_DELETE(self):
    _, bucket, name, q = self._route()
    key = f"/{bucket}/{name}"
    with _LOCK:
      if key not in FakeGCS.store:
        return self._error(404, "no such object")
      if not self._precondition(key, q):
        return self._error(412, "precondition failed")
      FakeGCS.store.pop(key)
      FakeGCS.generations.pop(key, None)
    return self._reply(204)


# ------------------------------------------------------------------------------ installing it

class _Bucket:
  hierarchical_namespace_enabled = False

  def __init__(self, name: str):
    self.name = name


def install() -> FakeGCS:
  """Routes gs:// of epath/fsspec, tensorstore and google.cloud.storage to the fake; returns
  its file system."""
  fsspec.register_implementation("gs", FakeGCS, clobber=True)
  fsspec.register_implementation("gcs", FakeGCS, clobber=True)
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  os.environ["TENSORSTORE_GCS_HTTP_URL"] = f"http://127.0.0.1:{server.server_port}"
  os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"] = "fake"
  storage = types.ModuleType("google.cloud.storage")
  storage.Client = lambda *a, **k: types.SimpleNamespace(get_bucket=_Bucket)
  cloud = sys.modules.setdefault("google.cloud", types.ModuleType("google.cloud"))
  cloud.storage = storage
  sys.modules["google.cloud.storage"] = storage
  return FakeGCS()


def load(path: str) -> None:
  """The bucket as `save` left it."""
  with open(path, "rb") as f:
    objects = pickle.load(f)
  for key, data in objects.items():
    _put(key, data)


def save(path: str) -> None:
  with _LOCK, open(path, "wb") as f:
    pickle.dump({k: v.getvalue() for k, v in FakeGCS.store.items()}, f)


if __name__ == "__main__":
  state = os.environ.get("FAKE_GCS_STATE")
  install()
  if state and os.path.exists(state):
    load(state)
  try:
    from smjax import main  # pylint: disable=import-outside-toplevel
    main.run()
  finally:
    if state:
      save(state)
