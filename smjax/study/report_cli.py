"""`smjax report WORKDIR` (= `python -m smjax.study.report_cli WORKDIR`): re-renders a finished or
partial study's table, CSV, JSON and plot from what its seeds have finished (their arms.json),
without running or compiling anything.

  smjax report runs/demo                  # writes runs/demo/report/, prints the table
  smjax report runs/demo --out=/tmp/rep   # somewhere else
  smjax report runs/demo --bootstrap=0    # point estimates only (fast)
  smjax report runs/two_full --seeds=0,1  # only these seeds (a study whose others are running)
  smjax report runs/regimes               # a regime map's folder: the map (smjax.study.regimes)
  smjax report runs/regimes --keep docs/regimes/map.json   # + an earlier map's other cells
  smjax report runs/two_full --record docs/records/two_full   # + a record it renders again from
"""

from __future__ import annotations

import argparse
import sys

import ml_collections as mlc

from smjax import paths
from smjax.json_io import read_json


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="smjax report", description=__doc__.split("\n\n")[0])
  p.add_argument("workdir", help="a study's --workdir")
  p.add_argument("--out", default=None, help="where to write the report (default WORKDIR/report)")
  p.add_argument("--bootstrap", type=int, default=None,
                 help="bootstrap resamples (default: the study's config.report.bootstrap)")
  p.add_argument("--seeds", default=None,
                 help="comma-separated seeds to report (default: every seed that has finished "
                 "a phase); a partial study's finished seeds, so that its intervals are over them")
  p.add_argument("--keep", default=None, metavar="MAP_JSON",
                 help="a regime map only: an earlier map's map.json whose rows stand for the "
                 "cells WORKDIR has no directory of (each marked with the map it came from)")
  p.add_argument("--record", default=None, metavar="DIR",
                 help="also record the study (a map: each cell) into DIR: its config and each "
                 "seed's arms, what this command renders from, without checkpoints; a second "
                 "recording adds its seeds (smjax.study.records)")
  a = p.parse_args(argv)
  # pylint: disable=import-outside-toplevel
  from smjax.study.render import TERMINAL_WIDTH, format_table
  from smjax.study.run import load_arms, make_report
  out = a.out or paths.join(a.workdir, "report")
  for where in (a.workdir, out):
    paths.check_workdir(where, checkpoints=False)
  from smjax.study import records, regimes
  is_map = regimes.is_map(a.workdir)
  # Every refusal of the arguments before the record is written.
  if is_map and a.seeds is not None:
    raise ValueError(f"--seeds: {a.workdir} is a regime map; each cell reports the seeds that "
                     "have finished its comparison")
  if not is_map and a.keep is not None:
    raise ValueError(f"--keep: {a.workdir} is a study, not a regime map's folder; --keep takes "
                     "an earlier map's rows for the cells a map's folder lacks")
  if a.keep is not None:
    regimes.earlier_rows(a.keep)
  if a.record is not None:
    paths.check_workdir(a.record, checkpoints=False)
    cells = [c.name for c in regimes.CELLS] if is_map else None
    for where, seeds in records.save(a.workdir, a.record, cells).items():
      print(f"record: {where} (seeds {', '.join(map(str, seeds))})", file=sys.stderr)
  if is_map:   # a regime map's folder: its cells' studies, one line each
    data = regimes.map_report(a.workdir, a.out, a.bootstrap, keep=a.keep)
    print(paths.read_text(data["paths"]["markdown"]), end="")
    print(f"map:  {data['paths']['json']}\nplot: {data['paths']['plot']}")
    return 0
  cfg_path = paths.join(a.workdir, "config.json")
  if not paths.exists(cfg_path):
    raise FileNotFoundError(f"{a.workdir}: not a study workdir (no config.json); give the "
                            "--workdir a study ran with")
  config = mlc.ConfigDict(read_json(cfg_path, "rerun the study command, which writes it",
                                    keys=("report", "phases")))
  if a.bootstrap is not None:
    config.report.bootstrap = a.bootstrap
  arms = load_arms(a.workdir)
  if not arms:
    raise ValueError(f"{a.workdir}: no seed has finished a phase yet (no seed_*/arms.json); "
                     "nothing to report")
  if a.seeds is not None:
    try:
      seeds = sorted({int(x) for x in a.seeds.split(",") if x.strip()})
    except ValueError:
      raise ValueError(f"--seeds={a.seeds!r}: expected comma-separated integers, e.g. "
                       "--seeds=0,1") from None
    have = sorted({x.seed for x in arms})
    if not seeds or not set(seeds) <= set(have):
      raise ValueError(f"--seeds={a.seeds}: {a.workdir} has finished phases of seeds {have} "
                       f"only")
    arms = [x for x in arms if x.seed in seeds]
  else:
    # A study still running: seeds without the comparison's arms would be reported as gaps.
    ref = config.report.reference_arm
    have = sorted({x.seed for x in arms})
    done = sorted({x.seed for x in arms if x.arm == ref} & {x.seed for x in arms
                                                            if x.arm == "split_merge"})
    if done and done != have:
      print(f"note: seeds {sorted(set(have) - set(done))} have not finished {ref} and "
            f"split_merge yet; --seeds={','.join(map(str, done))} reports the ones that have",
            file=sys.stderr)
  report = make_report(config, arms, out)
  print(format_table(report, width=TERMINAL_WIDTH))  # report.txt: every column in full
  print(f"report: {report['paths']['json']}\nplot:   {report['paths']['plot']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
