"""A study seed's workdir: finished phases (reused, never silently mixed) and the evaluation grid.

`<workdir>/<phase>/result.json` (FLOP ledger, accuracy curve, extras and the config it ran under)
plus `final/` (its parameters, orbax) mark a finished phase. `run_phase` reuses it when the
config fields that phase reads (declared with the phase, smjax.study.layout) are unchanged,
refuses it with the differing fields listed otherwise, and else runs the phase and saves its
output, result.json last and atomically, so an interrupted save leaves no finished-looking phase.
In-progress phases checkpoint under `<phase>/checkpoints/` (`checkpointer`) with the same guard.

`<workdir>/eval_interval.json` holds the FLOP interval of the seed's evaluation grid, fixed once
from the first GRPO step's cost (`save_eval_every`), so every arm is evaluated on the same grid.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Callable, Sequence

import ml_collections as mlc
from tqdm.auto import tqdm

from smjax import checkpoint as ckpt_lib
from smjax import distributed, paths
from smjax.json_io import flat_fields, read_json
from smjax.ledger import FlopLedger, is_training
from smjax.study.config import upgrade_old_config
from smjax.study.layout import seed_dirs
from smjax.study.rules import AT_RULE
from smjax.train.metrics import progress_bar_shown

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PhaseOutput:
  params: Any
  ledger: FlopLedger
  curve: list[dict]
  extra: dict


def phase_dir(workdir: str, phase: str) -> str:
  return paths.join(workdir, phase)


def unread_fields(config: mlc.ConfigDict, reads: Sequence[str]) -> tuple[str, ...]:
  """Every dotted field of `config` that is not under one of `reads` (sections or fields): what
  a phase reading `reads` may see change and still be reused or resumed."""
  under = lambda k: any(k == r or k.startswith(r + ".") for r in reads)
  return tuple(k for k in flat_fields(config.to_dict()) if not under(k))


def load_done(workdir: str, config: mlc.ConfigDict, phase: str, reads: Sequence[str],
              template_params) -> PhaseOutput | None:
  """The finished phase's output, None if it has not finished; ConfigMismatchError if it
  finished under a config that differs in a field the phase reads."""
  path = paths.join(phase_dir(workdir, phase), "result.json")
  if not paths.exists(path):
    return None
  res = read_json(path, f"delete {phase_dir(workdir, phase)} to rerun phase {phase!r}",
                  keys=("ledger", "curve"))
  diff = ("config" in res and
          ckpt_lib.config_diff(upgrade_old_config(res["config"]), config.to_dict(),
                               unread_fields(config, reads)))
  if diff:
    raise ckpt_lib.ConfigMismatchError(
        f"{path}: phase {phase!r} finished under a different config; reusing it would mix two "
        "studies. Differing fields (finished -> now):\n  " + "\n  ".join(diff) +
        "\nUse a fresh --workdir, or delete that phase directory to rerun it.")
  final = paths.join(phase_dir(workdir, phase), "final")
  fix = f"delete {phase_dir(workdir, phase)} to rerun phase {phase!r}"
  mgr = ckpt_lib.Checkpointer(final, max_to_keep=1, keep_best=False, async_save=False)
  step = mgr.latest_step()
  if step is None:
    mgr.close()
    raise ckpt_lib.CorruptCheckpointError(
        f"{path} says phase {phase!r} finished, but {final} holds no saved parameters; {fix}")
  try:
    # Not restore_latest: a finished phase's parameters are not moved aside and replaced by an
    # earlier step; unreadable, they are reported and the workdir is left as it is.
    restored = mgr.restore(step, {"params": template_params})
  except ckpt_lib.CorruptCheckpointError as e:
    detail = str(e).split("; delete that step directory")[0]
    raise ckpt_lib.CorruptCheckpointError(f"phase {phase!r} finished ({path}), but its final "
                                          f"parameters are unreadable: {detail}; {fix}") from None
  finally:
    mgr.close()
  log.info("phase %s already finished: loaded %s", phase, path)
  return PhaseOutput(restored.state["params"], FlopLedger.from_dict(res["ledger"]), res["curve"],
                     res.get("extra", {}))


def save_params(path: str, params) -> None:
  """Parameters alone, as one orbax step under `path` (replacing what was there; every process
  calls it, as orbax's save)."""
  if distributed.is_coordinator():
    paths.rmtree(path)
  distributed.sync("smjax_save_params")
  mgr = ckpt_lib.Checkpointer(path, max_to_keep=1, keep_best=False, async_save=False)
  mgr.save(0, {"params": params})
  mgr.close()


def load_params(path: str, template_params, what: str):
  """The parameters `save_params` wrote under `path` (`template_params`: their abstract shapes);
  CorruptCheckpointError naming `what` when there are none."""
  mgr = ckpt_lib.Checkpointer(path, max_to_keep=1, keep_best=False, async_save=False)
  try:
    step = mgr.latest_step()
    if step is None:
      raise ckpt_lib.CorruptCheckpointError(
          f"{path} holds no saved parameters of {what}; delete the phase's directory to rerun it")
    return mgr.restore(step, {"params": template_params}).state["params"]
  finally:
    mgr.close()


# The snapshot label of a run's parameters where its stop rule would have ended it, had it not
# run on to its cap (smjax.study.phases.rl_phase `to_cap`; the report's "<arm>@rule").
RULE_SNAPSHOT = AT_RULE.removeprefix("@")


def snapshot_dir(workdir: str, phase: str, label: str) -> str:
  """Where a phase keeps the parameters it had when it first crossed mark `label` (an expert's
  bar of joint GRPO's gain, or RULE_SNAPSHOT)."""
  return paths.join(phase_dir(workdir, phase), "snapshots", label)


def save_done(workdir: str, config: mlc.ConfigDict, phase: str, out: PhaseOutput) -> PhaseOutput:
  d = phase_dir(workdir, phase)
  save_params(paths.join(d, "final"), out.params)
  if distributed.is_coordinator():
    paths.write_atomic(paths.join(d, "result.json"), json.dumps(
        {"ledger": out.ledger.to_dict(), "curve": out.curve, "extra": out.extra,
         "config": config.to_dict()}))
  return out


def run_phase(workdir: str, config: mlc.ConfigDict, phase: str, reads: Sequence[str],
              template_params, fn: Callable[[], PhaseOutput]) -> PhaseOutput:
  """Runs `fn` unless the phase already finished; saves its output atomically when it does.
  `reads`: the config fields the phase's result depends on."""
  done = load_done(workdir, config, phase, reads, template_params)
  if done is not None:
    _say(config, f"phase {phase}: finished before, reused ({_flops(done)})")
    return done
  if distributed.is_coordinator():
    paths.makedirs(phase_dir(workdir, phase))
  t0 = time.perf_counter()
  out = save_done(workdir, config, phase, fn())
  _say(config, f"phase {phase}: done in {time.perf_counter() - t0:.0f} s ({_flops(out)})")
  return out


def _flops(out: PhaseOutput) -> str:
  """"4.6e+09 training FLOPs, 1.3e+10 more in eval/*": the FLOPs no arm is charged named by the
  ledger namespaces they are under (base/* SFT, eval/* evaluation)."""
  train = out.ledger.total(training_only=True)
  rest = out.ledger.total(training_only=False) - train
  spaces = sorted({p.partition("/")[0] for p, v in out.ledger.by_phase().items()
                   if v and not is_training(p)})
  where = ", ".join(f"{n}/*" for n in spaces) or "nothing else"
  return f"{train:.3g} training FLOPs, {rest:.3g} more in {where}"


def _say(config: mlc.ConfigDict, line: str) -> None:
  """A phase line on the terminal beside the progress bars (config.progress, stderr a terminal);
  without a bar on stdout among the metric lines (smjax.train.metrics.MetricLines), and in the
  log."""
  if progress_bar_shown(config.progress):
    tqdm.write(line)
  else:
    log.info("%s", line)
    print(line, flush=True)


def checkpointer(workdir: str, config: mlc.ConfigDict, phase: str,
                 reads: Sequence[str]) -> ckpt_lib.Checkpointer:
  """The running phase's checkpoints (resume refuses a config that changed a field it reads)."""
  return ckpt_lib.Checkpointer(paths.join(phase_dir(workdir, phase), "checkpoints"),
                               max_to_keep=2, keep_best=False, async_save=True,
                               config=config.to_dict(), ignore_fields=unread_fields(config, reads),
                               upgrade_saved_config=upgrade_old_config)


# ------------------------------------------------------------------------- evaluation grid

def _interval_file(workdir: str) -> str:
  return paths.join(workdir, "eval_interval.json")


def new_links(pairs: Sequence[tuple[str, str]], fix: str) -> list[tuple[str, str]]:
  """The (src, dst) pairs whose link dst -> src is still to be made: one already there is
  skipped; a dst that exists and is not a link to src is an error ending in `fix`."""
  out = []
  for src, dst in pairs:
    if os.path.islink(dst) and os.path.realpath(dst) == os.path.realpath(src):
      continue
    if os.path.lexists(dst):
      raise ValueError(f"{dst} exists and is not a link to {src}: {fix}")
    out.append((src, dst))
  return out


def lend(src_workdir: str, dst_workdir: str, phases: Sequence[str],
         seeds: Sequence[int] | None = None) -> list[str]:
  """Lends study workdir `dst_workdir` each seed's *finished* phases named `phases` from
  `src_workdir` (links dst/seed_<k>/<phase> -> src/seed_<k>/<phase>) with the seed's evaluation
  grid (eval_interval.json, copied), so that a variant run in dst (another setting of a later
  phase, or a regime cell alike in those phases) reuses them and computes the rest on the same
  grid. No config is compared here: each lent phase is checked as it is loaded (`load_done`),
  reused where its config agrees on every field it reads and refused otherwise, never rerun over.
  `seeds`: those only (default: every seed_<k> of src). Local workdirs only (links). Refused,
  before anything is written: a seed src lacks, a phase no seed has finished, a phase dst holds
  that is not a link to src's, a dst seed on another grid. Returns the links it made (none for
  those already there). A phase given as `src=dst` is lent under another name: e.g.
  `degrade=degrade@0` lends a study run with self_teacher.degrade_correct_fraction=0 its
  degradation as the further depth `degrade@0` of one that lists 0 in also_correct_fractions
  (each is the same phase, smjax.study.run._self_teacher; checked on loading like any other)."""
  renamed = [p.partition("=") for p in phases]
  bad = [p for p, (a, eq, b) in zip(phases, renamed) if not a or (eq and not b) or "/" in p]
  if bad:
    raise ValueError(f"lend: phases {bad}: expected a phase directory's name, or src=dst to "
                     "lend it under another name (e.g. degrade=degrade@0)")
  as_name = {a: b or a for a, _, b in renamed}
  phases = list(as_name)
  if paths.is_url(src_workdir) or paths.is_url(dst_workdir):
    raise ValueError(f"lending links directories, so both workdirs must be local; got "
                     f"{src_workdir} and {dst_workdir}")
  if not os.path.isdir(src_workdir):
    raise FileNotFoundError(f"{src_workdir}: no such study workdir to lend phases from")
  names = seed_dirs(src_workdir)
  if seeds is not None:
    missing = [f"seed_{k}" for k in seeds if f"seed_{k}" not in names]
    if missing:
      raise ValueError(f"{src_workdir}: no {', '.join(missing)} to lend (it has "
                       f"{', '.join(names) or 'no seed_<k> directories'})")
    names = [f"seed_{k}" for k in seeds]
  if not names:
    raise ValueError(f"{src_workdir}: no seed_<k> directories to lend")
  done = lambda d, p: os.path.exists(os.path.join(src_workdir, d, p, "result.json"))  # noqa: E731
  never = [p for p in phases if not any(done(d, p) for d in names)]
  if never:
    raise ValueError(f"{src_workdir}: no seed has finished {', '.join(never)} (a finished phase "
                     "has <phase>/result.json), so there is nothing of it to lend")
  links, grids = [], []
  for d in names:   # every refusal before anything is written
    src_seed = os.path.abspath(os.path.join(src_workdir, d))
    pairs = [(os.path.join(src_seed, p), os.path.join(dst_workdir, d, as_name[p]))
             for p in phases if done(d, p)]
    links += new_links(pairs, "that workdir ran it on its own; move it away to lend it the other's")
    grid, mine = os.path.join(src_seed, "eval_interval.json"), os.path.join(dst_workdir, d,
                                                                             "eval_interval.json")
    if pairs and os.path.exists(grid):
      if not os.path.exists(mine):
        grids.append((grid, mine))
      elif read_json(mine, "") != read_json(grid, ""):
        raise ValueError(f"{mine}: this seed is on another evaluation grid than {grid}; its "
                         "phases cannot be lent to it")
  for src, dst in grids:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    with open(src, encoding="utf-8") as f:
      paths.write_atomic(dst, f.read())
  for src, dst in links:
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    os.symlink(src, dst)
  return [dst for _, dst in links]


def load_eval_every(workdir: str, config: mlc.ConfigDict) -> float:
  """The seed's evaluation grid interval in training FLOPs: `config.eval.every_flops` when set,
  else the one fixed by the first GRPO step (0 until then)."""
  if config.eval.every_flops:
    return float(config.eval.every_flops)
  if paths.exists(_interval_file(workdir)):
    return float(read_json(_interval_file(workdir), "delete the seed's directory to rerun it "
                           "(its phases were evaluated on that grid)", keys=("every_flops",))
                 ["every_flops"])
  return 0.0


def grid_or_refuse(workdir: str, config: mlc.ConfigDict, phase: str, may_fix: bool) -> float:
  """The seed's grid interval for `phase` (`load_eval_every`), or 0 when this phase may fix it
  (`may_fix`: a GRPO phase, and no phase of the seed has finished on a grid yet). Refuses when
  the grid is gone but phases were evaluated on it: deriving another would put the arms on two
  grids."""
  every = load_eval_every(workdir, config)
  if every or not config.eval.points:
    return every
  # SFT phases are evaluated once, on no grid: their results do not tie the seed to one.
  done = [d for d in paths.listdir(workdir)
          if d not in ("base", "base_strong", "external_teacher", phase)
          and paths.exists(paths.join(workdir, d, "result.json"))]
  if done or not may_fix:
    raise FileNotFoundError(
        f"{_interval_file(workdir)} is missing, but phase {phase!r} must be evaluated on the "
        f"seed's grid{' that ' + ', '.join(done) + ' finished on' if done else ''}; restore the "
        "file, or delete the seed's directory to rerun every phase on one new grid")
  return 0.0


def save_eval_every(workdir: str, config: mlc.ConfigDict, step_flops: float) -> float:
  """Fixes the grid from the first GRPO step's training FLOPs, once per seed: (joint GRPO steps x
  that cost) / eval.points (0 with eval.points = 0: FLOP-grid evaluation off). Returns it."""
  if not config.eval.points:
    return 0.0
  every = step_flops * config.joint.steps / config.eval.points
  if distributed.is_coordinator():
    paths.makedirs(workdir)
    paths.write_atomic(_interval_file(workdir),
                       json.dumps({"every_flops": every, "from_step_flops": step_flops}))
  return every


def main(argv=None) -> int:
  """`smjax lend SRC DST --phases a,b [--seeds 0,1]` (`lend`): lend a study's finished phases to
  a variant's workdir before running the variant there."""
  import argparse  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(
      prog="smjax lend", description="Link each seed's finished phases of study SRC into DST (and "
      "copy the seed's evaluation grid), so that a study run in DST with a later phase changed "
      "reuses them; each is checked against DST's config as it is loaded, and refused, not "
      "rerun, where a field it reads differs.")
  ap.add_argument("src", help="the study's --workdir")
  ap.add_argument("dst", help="the variant's --workdir (created)")
  ap.add_argument("--phases", required=True,
                  help="comma-separated phase directories, e.g. base,joint_grpo; src=dst lends "
                  "one under another name, e.g. degrade=degrade@0")
  ap.add_argument("--seeds", help="comma-separated seeds (default: every seed_<k> of SRC)")
  a = ap.parse_args(argv)
  phases = [p for p in a.phases.split(",") if p]
  try:
    seeds = None if a.seeds is None else [int(k) for k in a.seeds.split(",") if k]
  except ValueError:
    ap.error(f"--seeds={a.seeds}: expected comma-separated integers, e.g. 0,1,2")
  linked = lend(a.src, a.dst, phases, seeds)
  print(f"{a.dst}: linked {len(linked)} phase directories from {a.src}")
  return 0
