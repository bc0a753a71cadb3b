"""A study's record: what `smjax report` reads to render it again, without its checkpoints.

  smjax report runs/two_full --record docs/records/two_full     # the report, and the record
  smjax report docs/records/two_full                            # rendered again from the record
  smjax report runs/regimes --record docs/regimes/records       # a map: one record per cell

A study's phases, checkpoints and logs are gigabytes and live in its workdir; its report is
computed from far less: the study's config.json and each seed's arms.json (every finished arm's
curve, FLOPs and stops, with each evaluation's per-prompt results for the intervals), plus, for a
regime map's cell, joint GRPO's per-domain share of zero-advantage groups from its
metrics.jsonl. A record is those files, in the workdir's own layout (arms.json gzipped, as
arms.json.gz: a few MB of JSON a seed becomes a few hundred kB; the metrics rows cut to the step
and those shares), so that a record is a workdir `smjax report` renders like any other, and a
map's record is a map.

A study too long for one session, on machines that do not keep each other's workdirs, is run
seed by seed and recorded into one record: a second recording adds its seeds to the record's
(a seed recorded again is replaced), refused when the two studies' configs differ in anything
but their run-neutral fields (seeds, phases, report settings, ...). The record's config.json
names the union of the recorded seeds and phases. `record.json` is written last: a directory
without it is not a record (an interrupted recording is redone by recording again).
"""

from __future__ import annotations

import datetime
import gzip
import json

from smjax import paths
from smjax.json_io import config_diff, read_json, require_keys

RECORD_FILE = "record.json"
ARMS_FILE = "arms.json"   # smjax.study.run.ARMS_FILE; a record holds it gzipped (ARMS_GZ)
ARMS_GZ = ARMS_FILE + ".gz"
# Joint GRPO's metrics rows, cut to what the map reads (smjax.study.regimes._zero_variance).
METRICS = ("joint_grpo", "logs", "metrics.jsonl")
_KEEP_PREFIXES = ("zero_variance_groups/", "reward/zero_variance_groups")


def read_arms(seed_dir: str) -> list[dict] | None:
  """The arms a seed directory holds: its arms.json (a study's), else its arms.json.gz (a
  record's: every evaluation's per-prompt results are megabytes of JSON a seed, which gzip takes
  to a fifteenth); None when it has neither. A file that is not (gzipped) JSON with "arms" is a
  one-line ValueError naming it."""
  path, gz = paths.join(seed_dir, ARMS_FILE), paths.join(seed_dir, ARMS_GZ)
  if paths.exists(path):
    return read_json(path, "delete it and rerun the study command, which rewrites it from the "
                     "finished phases", keys=("arms",))["arms"]
  if not paths.exists(gz):
    return None
  try:
    obj = json.loads(gzip.decompress(paths.read_bytes(gz)).decode("utf-8"))
  except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{gz}: not gzipped UTF-8 JSON ({e}); record the study again") from None
  return require_keys(obj, ("arms",), gz, "record the study again")["arms"]


def _seeds(workdir: str) -> list[str]:
  """The seed directories of `workdir` holding arms (arms.json, or a record's .gz), in order."""
  names = [n for n in paths.listdir(workdir) if n.startswith("seed_") and (
      paths.exists(paths.join(workdir, n, ARMS_FILE))
      or paths.exists(paths.join(workdir, n, ARMS_GZ)))]
  return sorted(names, key=lambda n: (len(n), n))


def _cut_metrics(text: str) -> str:
  rows = []
  for line in text.splitlines():
    if not line.strip():
      continue
    row = json.loads(line)
    kept = {k: v for k, v in row.items() if k.startswith(_KEEP_PREFIXES)}
    if kept:
      rows.append(json.dumps({"step": row.get("step"), **kept}))
  return "".join(r + "\n" for r in rows)


def _merged_config(old: dict | None, new: dict, dest: str, seeds: list[int]) -> dict:
  # pylint: disable-next=import-outside-toplevel
  from smjax.study.config import RUN_NEUTRAL_FIELDS, upgrade_old_config
  if old is None:
    return {**new, "seeds": seeds}
  diff = config_diff(upgrade_old_config(old), upgrade_old_config(new), RUN_NEUTRAL_FIELDS)
  if diff:
    raise ValueError(f"{paths.join(dest, 'config.json')}: the record is of another study; "
                     "differing fields (record -> this study): " + "; ".join(diff))
  phases = list(old.get("phases") or [])
  phases += [p for p in new.get("phases") or [] if p not in phases]
  return {**new, "seeds": seeds, "phases": phases}


def _check_dest(dest: str) -> dict | None:
  """The record already at `dest` (its record.json), None for a new or empty directory; a
  ValueError for anything else, so that nothing but a record is written into."""
  if not paths.exists(dest) or not paths.listdir(dest):
    return None
  if not paths.exists(paths.join(dest, RECORD_FILE)):
    raise ValueError(f"{dest}: not empty and not a record (no {RECORD_FILE}); give a new "
                     "directory or an earlier record of the same study")
  return read_json(paths.join(dest, RECORD_FILE), "delete the record and record it again")


def _plan_study(workdir: str, dest: str) -> tuple[dict, list[tuple[str, str | bytes]]]:
  """(the record's config, [(file to write, its text)]) for the study at `workdir`; every
  refusal raised before anything is written."""
  config = read_json(paths.join(workdir, "config.json"),
                     "give the --workdir a study ran with", keys=("seeds", "phases"))
  seeds = _seeds(workdir)
  if not seeds:
    raise ValueError(f"{workdir}: no seed has finished a phase yet (no seed_*/{ARMS_FILE}); "
                     "nothing to record")
  earlier = _check_dest(dest)
  old = (read_json(paths.join(dest, "config.json"), "delete the record and record it again")
         if earlier is not None else None)
  have = [] if earlier is None else [int(s) for s in earlier.get("seeds", [])]
  numbers = sorted(set(have) | {int(s.removeprefix("seed_")) for s in seeds})
  merged = _merged_config(old, config, dest, numbers)
  files = []
  for s in seeds:
    arms = read_arms(paths.join(workdir, s))
    recorded = paths.join(dest, s, ARMS_GZ)
    if earlier is not None:
      # A seed recorded again is replaced, never by one that has finished fewer of its arms.
      held = read_arms(paths.join(dest, s)) or []
      lost = sorted({a["arm"] for a in held} - {a["arm"] for a in arms})
      if lost:
        raise ValueError(f"{recorded}: the record's {s} has arms {lost} that {workdir}'s has not "
                         "finished; recording it would lose them (record another seed, or into "
                         "a new directory)")
    # mtime 0: the same arms give the same bytes (a record committed again does not change).
    files.append((recorded, gzip.compress(json.dumps({"arms": arms}).encode("utf-8"),
                                          mtime=0)))
    metrics = paths.join(workdir, s, *METRICS)
    if paths.exists(metrics):
      files.append((paths.join(dest, s, *METRICS), _cut_metrics(paths.read_text(metrics))))
  files.append((paths.join(dest, "config.json"), json.dumps(merged, indent=1)))
  files.append((paths.join(dest, RECORD_FILE), json.dumps({
      "study": workdir, "seeds": numbers, "written": datetime.date.today().isoformat(),
      "added": [int(s.removeprefix("seed_")) for s in seeds]}, indent=1)))
  return merged, files


def save(workdir: str, dest: str, cells: list[str] | None = None) -> dict:
  """Records the study at `workdir` into `dest` or, given the map's `cells` (their names, in
  the map's order: smjax.study.regimes.CELLS, which the caller knows is a map), the map, one
  record per cell that has finished a phase; returns {record directory: the seeds it now
  holds}. Every refusal (nothing finished, `dest` not a record, a record of another study)
  comes before anything is written."""
  if cells is not None:
    names = cells
    cells = [c for c in names if paths.exists(paths.join(workdir, c, "config.json"))
             and _seeds(paths.join(workdir, c))]
    if not cells:
      raise ValueError(f"{workdir}: no cell of the map has finished a phase yet; nothing to "
                       "record")
    if paths.exists(dest) and paths.listdir(dest) and not any(
        paths.exists(paths.join(dest, n)) for n in [RECORD_FILE] + cells):
      raise ValueError(f"{dest}: not empty and not a map's record; give a new directory or an "
                       "earlier record of the same map")
    plans = [(paths.join(dest, c), *_plan_study(paths.join(workdir, c), paths.join(dest, c)))
             for c in cells]
    earlier = (read_json(paths.join(dest, RECORD_FILE), "delete the record and record it again")
               if paths.exists(paths.join(dest, RECORD_FILE)) else {})
    held = [c for c in names if c in cells or c in earlier.get("cells", [])]
    plans.append((dest, None, [(paths.join(dest, RECORD_FILE), json.dumps(
        {"map": workdir, "written": datetime.date.today().isoformat(), "cells": held,
         "added": cells}, indent=1))]))
  else:
    plans = [(dest, *_plan_study(workdir, dest))]
  for _, _, files in plans:
    for path, text in files:
      paths.makedirs(path.rsplit("/", 1)[0])
      paths.write_atomic(path, text)
  return {where: config["seeds"] for where, config, _ in plans if config is not None}
