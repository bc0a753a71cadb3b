"""`python tests/record_reads.py ARGS` runs `python -m smjax.main ARGS` recording which study
config fields each phase really reads, into the JSON file named by $SMJAX_RECORD_READS.

A finished phase is reused exactly when none of the fields it declares (smjax.study.layout,
`read_fields`) changed, so a field a phase reads without declaring it would let a changed config
reuse a stale result. Declarations are checked for consistency in test_experiment; this records
what the code does: `ml_collections.ConfigDict.__getitem__` (attribute access goes through it) is
wrapped so that every leaf field read from a study config is logged with the segment of the run it
was read in:

  setup    before the seed's shared record (the config file, validation): not a phase's read
  shared   smjax.study.shared.seed_shared: objects every phase may use (optimisers, samplers)
  phase    inside smjax.study.store.run_phase for one phase: that phase's own reads
  gap      between two phases (run_seed choosing the next phase's arguments, or describing the
           last one's arm): belongs to the phase before or the one after
  report   smjax.study.run.make_report: the report, which no phase's result depends on

Bookkeeping that reads a whole config (to_dict, to_json, copies, comparisons, repr) is not
recorded: the phase store does that to save and compare configs, not to compute a result.
`undeclared(path)` is the check the tests assert on.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_OUT = os.environ.get("SMJAX_RECORD_READS", "")
_paths: dict[int, str] = {}     # id(ConfigDict) -> its dotted prefix in a study config ("" root)
_alive: list = []               # the registered dicts, so that their ids stay theirs
_segments: list[dict] = []
_mute = 0
# Phases that run side by side (config.parallel_phases) run in threads: each thread's reads go to
# its own open segment; the main thread's gaps are the segments between its own calls.
_open = threading.local()
_lock = threading.Lock()


def _segment(kind: str, name: str = "", declared=()) -> dict:
  seg = {"kind": kind, "name": name, "declared": list(declared), "reads": []}
  with _lock:
    _segments.append(seg)
  _open.seg = seg
  return seg


_phase_thread_ended = threading.Event()   # the main thread's next read opens a new gap


def _record(field: str) -> None:
  main = threading.current_thread() is threading.main_thread()
  if main and _phase_thread_ended.is_set():   # after phases that ran in threads
    _phase_thread_ended.clear()
    _segment("gap")
  seg = getattr(_open, "seg", None)
  if seg is None:   # the main thread's first read, or a phase thread's outside any phase
    seg = _segment("setup" if threading.current_thread() is threading.main_thread() else "gap")
  if field not in seg["reads"]:
    seg["reads"].append(field)


def _install() -> None:
  from ml_collections.config_dict import config_dict as cd  # pylint: disable=import-outside-toplevel

  cls = cd.ConfigDict
  get = cls.__getitem__

  def getitem(self, key):
    value = get(self, key)
    if _mute or not isinstance(key, str) or "." in key:   # a dotted key recurses through here
      return value
    fields = object.__getattribute__(self, "_fields")
    if id(self) not in _paths and {"domains", "phases", "rl", "opd", "model"} <= set(fields):
      _paths[id(self)] = ""          # a study config's root
      _alive.append(self)
    prefix = _paths.get(id(self))
    if prefix is None:
      return value
    if isinstance(value, cls):       # a section: its leaves are what is read
      _paths[id(value)] = prefix + key + "."
      _alive.append(value)
    else:
      _record(prefix + key)
    return value

  def muted(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      global _mute
      _mute += 1
      try:
        return fn(*args, **kwargs)
      finally:
        _mute -= 1
    return wrapper

  cls.__getitem__ = getitem
  for name in ("to_dict", "to_json", "to_json_best_effort", "copy_and_resolve_references",
               "__deepcopy__", "__eq__", "__repr__", "__str__", "eq_as_configdict"):
    if hasattr(cls, name):
      setattr(cls, name, muted(getattr(cls, name)))

  from smjax.study import run, shared, store  # pylint: disable=import-outside-toplevel

  def in_segment(kind, fn, name_of=lambda *a, **k: ""):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
      name = name_of(*args, **kwargs)
      pre = getattr(_open, "seg", None)
      if (kind == "phase" and pre is not None and pre["kind"] == "gap"
          and threading.current_thread() is not threading.main_thread()):
        # What a phase's thread read before entering the phase is that phase's own code (e.g.
        # phase_external_teacher resolving its preset): judged by what that phase declares.
        pre.update(kind="prelude", name=name[0], declared=list(name[1]))
      _segment(kind, *name)
      try:
        return fn(*args, **kwargs)
      finally:
        if threading.current_thread() is threading.main_thread():
          _segment("gap")
        else:
          _open.seg = None
          _phase_thread_ended.set()
        with _lock:
          _dump()
    return wrapper

  phase = lambda workdir, config, name, reads, *a, **k: (name, tuple(reads))  # noqa: E731
  store.run_phase = in_segment("phase", store.run_phase, phase)
  seed = in_segment("shared", shared.seed_shared, lambda *a, **k: ("",))
  shared.seed_shared = run.seed_shared = seed
  run.make_report = in_segment("report", run.make_report, lambda *a, **k: ("",))


def _dump() -> None:
  if _OUT:
    with open(_OUT, "w") as f:
      json.dump(_segments, f, indent=1)


def undeclared(path: str) -> list[str]:
  """Every field a phase read without declaring it (nor any phase, for the shared record's
  reads), as lines naming the phase and the field; [] when the recording is consistent."""
  # pylint: disable=import-outside-toplevel
  from smjax.study.config import RUN_NEUTRAL_FIELDS
  from smjax.study.layout import COMMON_READS
  with open(path) as f:
    segments = json.load(f)
  under = lambda field, reads: any(field == r or field.startswith(r + ".")  # noqa: E731
                                   for r in reads)
  neutral = tuple(RUN_NEUTRAL_FIELDS)
  phases = [s for s in segments if s["kind"] == "phase"]
  every = set(COMMON_READS).union(*(s["declared"] for s in phases))
  bad = []
  for i, s in enumerate(segments):
    fields = [f for f in s["reads"] if not under(f, neutral)]
    if s["kind"] in ("phase", "prelude"):
      where = "phase" if s["kind"] == "phase" else "the thread of phase"
      bad += [f"{where} {s['name']} reads {f}, which it does not declare" for f in fields
              if not under(f, s["declared"])]
    elif s["kind"] == "shared":
      bad += [f"the shared record reads {f}, which no phase declares" for f in fields
              if not under(f, every)]
    elif s["kind"] == "gap":
      near = [p for p in (_nearest(segments, i, -1), _nearest(segments, i, 1)) if p]
      if near:
        bad += [f"between phases {' and '.join(p['name'] for p in near)}: {f} is read, which "
                "neither declares" for f in fields if not any(under(f, p["declared"])
                                                              for p in near)]
  return bad


def _nearest(segments, i, step):
  """The phase before (step=-1) or after (step=1) segment i, unless a shared or report segment
  lies between (another seed's record, the report)."""
  j = i + step
  while 0 <= j < len(segments):
    kind = segments[j]["kind"]
    if kind == "phase":
      return segments[j]
    if kind in ("shared", "report", "setup"):
      return None
    j += step
  return None


if __name__ == "__main__":
  _install()
  atexit.register(_dump)
  sys.argv = sys.argv[:]
  from smjax.main import run as _run  # pylint: disable=import-outside-toplevel
  _run()
