"""`smjax status WORKDIR`: where a study, or each cell of a regime map, stands, read from its
workdir alone (nothing is computed, compiled or written, so it is safe beside a running study).

  smjax status runs/two_full          # a study: each seed's phases
  smjax status runs/regimes           # a map: each cell's (a directory with a config.json)
  smjax status gs://BUCKET/run        # a workdir in a bucket (smjax.paths), e.g. a pod's

For each seed, every phase that has started: `done` (the step it ended at and of how many; for
an RL phase how: stopped by its rule, collapsed, or at its cap, saying where its rule was met
when that was too late for its run-on to end it first, or, for an arm run on to its cap past
its rule (external.to_cap), where the rule would have ended it; its training FLOPs; its final
mean held-out accuracy), or `running` / `stopped` (the last step its metrics file records, of
how many, how long ago it wrote, and the checkpoint a rerun resumes from; `stopped` when it has
written nothing for STALE_S; `unfinished` where the file system gives no times). A phase lent
by another workdir (`smjax lend`, a regime cell's `share`) says from where; a seed whose log
(`make study`'s seed_<k>.log) or a cell whose log (`make regimes`' <cell>.log) ends with an
error shows it. Phases not started are not listed: which run depends on the earlier ones (the
experts' bars, the MOPD checkpoint sets), so only the study itself can say.
"""

from __future__ import annotations

import json
import os
import sys
import time

from etils import epath

from smjax import paths
from smjax.json_io import read_json
from smjax.study.layout import seed_dirs, spec_of

# A phase whose metrics file is older than this is reported as stopped, not running.
STALE_S = 600


def _cap(config: dict, phase: str) -> int | None:
  """The step cap its declaration names (smjax.study.layout.PhaseSpec.cap), None where the
  workdir's config lacks it or no phase has that name."""
  spec = spec_of(phase)
  try:
    return spec.steps(config) if spec is not None else None
  except (KeyError, TypeError, ValueError):
    return None


def _ago(seconds: float) -> str:
  # A file written this instant can carry a modification time a hair past the clock's now (a
  # bucket's clock, more than a hair).
  seconds = max(0.0, seconds)
  if seconds < 120:
    return f"{seconds:.0f} s ago"
  if seconds < 7200:
    return f"{seconds / 60:.0f} min ago"
  return f"{seconds / 3600:.1f} h ago"


def _tail(path: str, size: int) -> list[str]:
  """The last lines of a text file (its last `size` bytes locally); [] when it is absent."""
  try:
    if paths.is_url(path):
      data = paths.read_bytes(path)[-size:]
    else:
      with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        data = f.read()
  except (OSError, FileNotFoundError):
    return []
  return data.decode("utf-8", "replace").splitlines()


def _mtime(path: str) -> float | None:
  """When the file was last written; None where the file system does not say (or it is absent)."""
  try:
    return float(epath.Path(path).stat().mtime) or None
  except (OSError, FileNotFoundError):
    return None


def _dirs(path: str) -> list[str]:
  """The names of the directories in `path` (prefixes, in a bucket)."""
  return [n for n in paths.listdir(path) if epath.Path(paths.join(path, n)).is_dir()]


def _last_step(metrics: str) -> int | None:
  """The step of the last record of a metrics.jsonl (None when it has none yet)."""
  for line in reversed(_tail(metrics, 65536)):
    try:
      return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
      continue
  return None


def _checkpoint_step(phase_dir: str) -> int | None:
  root = paths.join(phase_dir, "checkpoints", "checkpoints")
  steps = [int(d) for d in paths.listdir(root) if d.isdigit()] if paths.exists(root) else []
  return max(steps) if steps else None


def phase_line(seed_dir: str, phase: str, config: dict, now: float) -> str:
  """One phase's line (module docstring)."""
  d = paths.join(seed_dir, phase)
  cap = _cap(config, phase)
  of = f"/{cap}" if cap else ""
  lent = (f"  (lent by {os.path.dirname(os.path.dirname(os.path.realpath(d)))})"
          if not paths.is_url(d) and os.path.islink(d) else "")
  result = paths.join(d, "result.json")
  if paths.exists(result):
    res = read_json(result, f"delete {d} to rerun phase {phase!r}", keys=("curve",))
    last = res["curve"][-1] if res["curve"] else {}
    extra = res.get("extra") or {}
    step = last.get("step")
    # An RL phase says how it ended (its extra has "reached"); an SFT phase runs all its steps.
    # A rule met too late for its run-on to end the run before the cap: the cap ended it.
    met = extra.get("stop_point")
    met_at = (res["curve"][met].get("step") if isinstance(met, int)
              and 0 <= met < len(res["curve"]) else None)
    ruled = (extra.get("rule_end") or {}).get("met")   # run on to its cap past its rule
    how = ("" if "reached" not in extra else "collapsed" if extra.get("collapsed") else
           f"at its cap; its rule met at step {met_at}, which would have ended it at step "
           f"{extra['rule_end']['step']}" if ruled and met_at is not None else
           f"at its cap; its rule met at step {met_at}" if (
               cap and step == cap and met_at is not None and met_at < cap) else
           "stopped by its rule" if extra["reached"] or met is not None else
           "at its cap" if cap and step == cap else "")
    flops = sum(v for p, v in ((res.get("ledger") or {}).get("flops") or {}).items()
                if p.split("/")[0] in ("rollout", "train"))
    acc = last.get("mean")
    parts = [f"step {step}{of}" + (f" ({how})" if how else ""),
             f"{flops:.3g} training FLOPs" if flops else "no training FLOPs charged",
             f"held-out {100 * acc:.1f}%" if isinstance(acc, (int, float)) else ""]
    return f"  {'done':<10} {phase:<22} " + ", ".join(p for p in parts if p) + lent
  metrics = paths.join(d, "logs", "metrics.jsonl")
  step, ckpt = _last_step(metrics), _checkpoint_step(d)
  if step is None and ckpt is None:
    return f"  {'started':<10} {phase:<22} nothing written yet" + lent
  written = _mtime(metrics)
  age = None if written is None else now - written
  state = "unfinished" if age is None else "running" if age < STALE_S else "stopped"
  parts = [f"step {step if step is not None else ckpt}{of}",
           "" if age is None else f"wrote {_ago(age)}",
           f"resumes from step {ckpt}" if ckpt is not None else "resumes from its start"]
  return f"  {state:<10} {phase:<22} " + ", ".join(p for p in parts if p) + lent


def study_status(workdir: str, now: float | None = None) -> list[str]:
  """The lines for one study workdir (its config.json and seed_<k> directories)."""
  now = time.time() if now is None else now
  config = read_json(paths.join(workdir, "config.json"), "is it a study's --workdir?")
  seeds = seed_dirs(workdir)
  out = [f"{workdir} ({config.get('name', 'study')}): "
         + (f"seeds {', '.join(s.removeprefix('seed_') for s in seeds)}" if seeds
            else "no seed has started")]
  for s in seeds:
    seed_dir = paths.join(workdir, s)
    # In the order they started, where the file system keeps times (a bucket: by name).
    phases = sorted(_dirs(seed_dir), key=lambda p: (_mtime(paths.join(seed_dir, p)) or 0, p))
    lines = [phase_line(seed_dir, p, config, now) for p in phases]
    done = sum(ln.startswith("  done") for ln in lines)
    out += [f"{s}: {done} of {len(lines)} started phases done"] + lines + _failure(workdir, s)
  return out


def _failure(workdir: str, name: str) -> list[str]:
  """The error a process ended with, where its log ends with one (a one-line error, or a
  traceback's last line): `make study`'s <seed>.log beside the seed's directory, or `make
  regimes`' <cell>.log beside the cell's."""
  log = paths.join(workdir, f"{name}.log")
  tail = [ln for ln in _tail(log, 8192) if ln.strip()]
  last = tail[-1] if tail else ""
  traceback = any(ln.startswith("Traceback (most recent call last)") for ln in tail)
  if last.startswith("smjax: error:") or (traceback and not last.startswith(" ")):
    return [f"  its log ({log}) ends with an error: {last}"]
  return []


def status(workdir: str, now: float | None = None) -> list[str]:
  """A study's lines, or for a map (a directory of cells, each with a config.json) each cell's;
  FileNotFoundError / ValueError naming the workdir when it is neither."""
  paths.check_workdir(workdir, checkpoints=False)
  if not paths.exists(workdir):
    raise FileNotFoundError(f"{workdir}: no such workdir")
  if paths.exists(paths.join(workdir, "config.json")):
    return study_status(workdir, now)
  cells = [c for c in _dirs(workdir) if paths.exists(paths.join(workdir, c, "config.json"))]
  if not cells:
    raise ValueError(f"{workdir}: neither a study's workdir (no config.json) nor a map's (no "
                     "directory in it has one)")
  out = []
  for c in cells:   # `make regimes` logs each cell to <map>/<cell>.log
    out += study_status(paths.join(workdir, c), now) + _failure(workdir, c) + [""]
  return out[:-1]


def main(argv=None) -> int:
  """`smjax status WORKDIR`."""
  import argparse  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(
      prog="smjax status", description="Where a study (or each cell of a regime map) stands: "
      "each seed's started phases, done or how far along, read from the workdir alone.")
  ap.add_argument("workdir", help="a study's --workdir, or a regime map's folder")
  a = ap.parse_args(argv)
  print("\n".join(status(a.workdir)))   # errors: one line from `smjax` (main._subcommand)
  return 0


if __name__ == "__main__":
  sys.exit(main())
