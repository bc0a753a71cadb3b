"""A study's record: what `smjax report` reads to render it again, without its checkpoints.

  smjax report runs/two_full --record docs/records/two_full     # the report, and the record
  smjax report docs/records/two_full                            # rendered again from the record
  smjax report runs/regimes --record docs/regimes/records       # a map: one record per cell

A study's phases, checkpoints and logs are gigabytes and live in its workdir; its report is
computed from far less: the study's config.json and each seed's arms.json (every finished arm's
curve, FLOPs and stops), plus, for a regime map's cell, joint GRPO's per-domain share of
zero-advantage groups from its metrics.jsonl. A record is those files, in the workdir's own
layout (the metrics rows cut to the step and those shares), so that a record is a workdir
`smjax report` renders like any other, and a map's record is a map.

A study too long for one session, on machines that do not keep each other's workdirs, is run
seed by seed and recorded into one record: a second recording adds its seeds to the record's
(a seed recorded again is replaced), refused when the two studies' configs differ in anything
but their run-neutral fields (seeds, phases, report settings, ...). The record's config.json
names the union of the recorded seeds and phases. `record.json` is written last: a directory
without it is not a record (an interrupted recording is redone by recording again).
"""

from __future__ import annotations

import datetime
import json

from smjax import paths
from smjax.checkpoint_meta import config_diff, read_json

RECORD_FILE = "record.json"
ARMS_FILE = "arms.json"
# Joint GRPO's metrics rows, cut to what the map reads (smjax.study.regimes._zero_variance).
METRICS = ("joint_grpo", "logs", "metrics.jsonl")
_KEEP_PREFIXES = ("zero_variance_groups/", "reward/zero_variance_groups")


def _seeds(workdir: str) -> list[str]:
  """The seed directories of `workdir` holding an arms.json, in seed order."""
  names = [n for n in paths.listdir(workdir)
           if n.startswith("seed_") and paths.exists(paths.join(workdir, n, ARMS_FILE))]
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


def _plan_study(workdir: str, dest: str) -> tuple[dict, list[tuple[str, str]]]:
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
    text = paths.read_text(paths.join(workdir, s, ARMS_FILE))
    recorded = paths.join(dest, s, ARMS_FILE)
    if earlier is not None and paths.exists(recorded):
      # A seed recorded again is replaced, never by one that has finished fewer of its arms.
      arms = lambda t: {a["arm"] for a in json.loads(t)["arms"]}  # noqa: E731
      lost = sorted(arms(paths.read_text(recorded)) - arms(text))
      if lost:
        raise ValueError(f"{recorded}: the record's {s} has arms {lost} that {workdir}'s has not "
                         "finished; recording it would lose them (record another seed, or into "
                         "a new directory)")
    files.append((recorded, text))
    metrics = paths.join(workdir, s, *METRICS)
    if paths.exists(metrics):
      files.append((paths.join(dest, s, *METRICS), _cut_metrics(paths.read_text(metrics))))
  files.append((paths.join(dest, "config.json"), json.dumps(merged, indent=1)))
  files.append((paths.join(dest, RECORD_FILE), json.dumps({
      "study": workdir, "seeds": numbers, "written": datetime.date.today().isoformat(),
      "added": [int(s.removeprefix("seed_")) for s in seeds]}, indent=1)))
  return merged, files


def save(workdir: str, dest: str) -> dict:
  """Records the study (or the regime map, one record per cell) at `workdir` into `dest`;
  returns {record directory: the seeds it now holds}. Every refusal (nothing finished, `dest`
  not a record, a record of another study) comes before anything is written."""
  # pylint: disable-next=import-outside-toplevel
  from smjax.study import regimes
  if regimes.is_map(workdir):
    cells = [c.name for c in regimes.CELLS
             if paths.exists(paths.join(workdir, c.name, "config.json"))
             and _seeds(paths.join(workdir, c.name))]
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
    held = [c.name for c in regimes.CELLS if c.name in cells or c.name in earlier.get("cells", [])]
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
