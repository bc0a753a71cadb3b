"""`python -m smjax.prepare DATASET IN OUT`: a published data set's file as the JSONL a study reads.

  python -m smjax.prepare gsm8k gsm8k/main/train-00000-of-00001.parquet data/gsm8k_train.jsonl
  python -m smjax.prepare mbpp mbpp.jsonl data/mbpp_train.jsonl --test data/mbpp_test.jsonl
  python -m smjax.prepare math MATH/train data/math_train.jsonl       # the tarball's directory
  python -m smjax.prepare humaneval HumanEval.jsonl.gz data/humaneval.jsonl

DATASET is gsm8k, math, mbpp or humaneval; IN a file in that data set's own schema (JSONL, .gz,
Parquet, a JSON array, or a directory of JSON files; smjax.domains.datasets has each schema and
what it becomes); OUT the .jsonl (or .jsonl.gz) of the study's records: math {question, answer}
(`jsonl_math:OUT`) or code {prompt, tests, entry_point} (`jsonl_code:OUT`), with MBPP's prompt
naming the function its tests call. A record that is not DATASET's schema stops it with one line
naming the file, the record and the missing field; nothing is written then.

Splits: without --test, OUT holds every record and the study holds out those whose prompt's
CRC-32 is 0 mod 5 (smjax.domains.real). With `--test FILE`, a share `--test-fraction` (0.2) of
the records, chosen by the CRC-32 of their prompt (identical prompts together, the same split on
every run and machine), goes to FILE and the rest to OUT: pass both as
`jsonl_math:train=OUT,test=FILE`. A data set published with its own splits (GSM8K's train and
test files) is prepared file by file instead.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib

from smjax.domains import datasets


def _key(rec: dict) -> str:
  return rec.get("question") or rec["prompt"]


def in_test(rec: dict, fraction: float) -> bool:
  """Whether a study record goes to the test file: CRC-32 of its prompt below `fraction`."""
  return zlib.crc32(_key(rec).encode()) < fraction * 2 ** 32


def _write(path: str, recs: list[dict]) -> None:
  """Writes JSON lines atomically (a temporary file beside `path`, then renamed)."""
  parent = os.path.dirname(os.path.abspath(path))
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp{os.getpid()}")
  opener = gzip.open if path.endswith(".gz") else open
  with opener(tmp, "wt", encoding="utf-8") as f:
    f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
  os.replace(tmp, path)


def _check_out(flag: str, path: str, src: str) -> None:
  if not path.endswith((".jsonl", ".jsonl.gz")):
    raise ValueError(f"{flag} {path}: expected a .jsonl or .jsonl.gz file name (the study reads "
                     "those)")
  if os.path.exists(src) and os.path.exists(path) and os.path.samefile(src, path):
    raise ValueError(f"{flag} {path} is the input file; give another file name")


def prepare(dataset: str, src: str, out: str, *, test: str | None = None,
            test_fraction: float | None = None) -> dict:
  """Reads `src` as `dataset` and writes the study's records (module docstring). Returns
  {"dataset", "kind", "records", "files": {path: count}, "domain": the study's domain name}."""
  if dataset not in datasets.READERS:
    raise ValueError(f"DATASET {dataset!r}: expected one of {list(datasets.DATASETS)}")
  if not os.path.exists(src):
    raise FileNotFoundError(f"IN {src}: no such file or directory; expected {dataset}'s "
                            "published file (JSONL, Parquet, JSON) or a directory of them")
  _check_out("OUT", out, src)
  if test is None and test_fraction is not None:
    raise ValueError(f"--test-fraction {test_fraction} without --test FILE: give the file the "
                     "test split goes to (without --test, OUT holds every record)")
  test_fraction = 0.2 if test_fraction is None else test_fraction
  if test is not None:
    _check_out("--test", test, src)
    if os.path.abspath(test) == os.path.abspath(out):
      raise ValueError(f"--test {test} is OUT; give the test split a file of its own")
  if not 0.0 < test_fraction < 1.0:
    raise ValueError(f"--test-fraction {test_fraction}: expected a number in (0, 1)")
  kind = datasets.READERS[dataset].kind
  recs = datasets.read(dataset, src)
  if test is None:
    files = {out: recs}
    domain = f"jsonl_{kind}:{out}"
  else:
    held = [r for r in recs if in_test(r, test_fraction)]
    files = {out: [r for r in recs if not in_test(r, test_fraction)], test: held}
    for path, part in files.items():
      if not part:
        raise ValueError(f"--test-fraction {test_fraction} leaves {path} empty of the "
                         f"{len(recs)} records; give a fraction that puts records in both")
    domain = f"jsonl_{kind}:train={out},test={test}"
  for path, part in files.items():
    _write(path, part)
  return {"dataset": dataset, "kind": kind, "records": len(recs),
          "files": {p: len(r) for p, r in files.items()}, "domain": domain}


def main(argv: list[str] | None = None) -> int:
  """`smjax prepare` / `python -m smjax.prepare` (module docstring): prints what it wrote and the
  study's domain name for it."""
  from smjax.main import OneLineParser  # pylint: disable=import-outside-toplevel
  p = OneLineParser(prog="smjax prepare", description=__doc__.split("\n\n")[0])
  p.add_argument("dataset", metavar="DATASET", help=f"one of {', '.join(datasets.DATASETS)}")
  p.add_argument("src", metavar="IN", help="the data set's published file (JSONL, .gz, Parquet, "
                 "JSON) or a directory of them")
  p.add_argument("out", metavar="OUT", help="the study's records: a .jsonl or .jsonl.gz file")
  p.add_argument("--test", default=None, metavar="FILE",
                 help="also split: a share of the records goes here, the rest to OUT")
  p.add_argument("--test-fraction", type=float, default=None, metavar="F",
                 help="the share --test gets, by the CRC-32 of each prompt (default 0.2)")
  a = p.parse_args(argv)
  r = prepare(a.dataset, a.src, a.out, test=a.test, test_fraction=a.test_fraction)
  for path, n in r["files"].items():
    print(f"wrote {n} {r['dataset']} records to {path}")
  print(f"study domain: {r['domain']}")
  return 0


if __name__ == "__main__":
  try:
    sys.exit(main())
  except (ValueError, OSError) as e:
    print(f"smjax: error: {' '.join(str(e).split())}", file=sys.stderr)
    sys.exit(2)
