"""Workdirs anywhere: a study whose --workdir is a gs:// bucket writes every file there (config,
arms, phase results, orbax checkpoints, metrics, TensorBoard events, the report) and nothing on the
local disk; a rerun reads the bucket back (finished phases reused, their parameters restored by
orbax); a workdir this install cannot write is refused in one line before anything runs.

The bucket is tests/fake_gcs.py's in-memory fake, which epath (fsspec), tensorstore (HTTP) and
orbax reach as they would a real one; the study runs in a subprocess through the real entry point.
"""

import json
import os
import pickle
import re
import subprocess
import sys

import pytest

from conftest import cache_env
from study_runs import study_compilation_cache
from test_experiment import MINI

from smjax import paths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "gs://fake-bucket/study"
# The study's phases that write every kind of file; the config file by its absolute path (the run
# starts in an empty directory).
ARGS = [f"--config={ROOT}/{a.split('=', 1)[1]}" if a.startswith("--config=") else a
        for a in MINI if not a.startswith("--config.phases=")]
ARGS.append("--config.phases=('base','joint')")


def _run(tmp, script_args, cache=None, **env):
  """`python tests/fake_gcs.py ARGS` (or other args) in the empty directory `tmp/cwd`, its temp
  files in `tmp/tmp`, its bucket kept in `tmp/bucket.pkl` between runs; `cache`: a persistent
  compilation cache (default `tmp/cache`)."""
  for d in ("cwd", "tmp", "cache"):
    (tmp / d).mkdir(exist_ok=True)
  cache = cache or tmp / "cache"
  env = dict(os.environ, JAX_PLATFORMS="cpu", TMPDIR=str(tmp / "tmp"),
             **cache_env(cache), FAKE_GCS_STATE=str(tmp / "bucket.pkl"), **env)
  return subprocess.run([sys.executable, *script_args], cwd=tmp / "cwd", env=env,
                        capture_output=True, text=True, timeout=1200)


def _bucket(tmp) -> dict[str, bytes]:
  with open(tmp / "bucket.pkl", "rb") as f:
    return {"gs:/" + k: v for k, v in pickle.load(f).items()}


def _no_url_dirs(root):
  """No directory named like a URL's scheme (gs:, s3:) under `root` or in the repository: a URL
  taken for a local path."""
  bad = [d for d in os.listdir(ROOT) if d.endswith(":")]
  for d, subdirs, _ in os.walk(root):
    bad += [os.path.join(d, s) for s in subdirs if s.endswith(":")]
  assert not bad, f"a URL written to the local disk: {bad}"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
  """The compilation cache test_experiment's runs of the same miniature study fill."""
  return study_compilation_cache(tmp_path_factory)


@pytest.fixture(scope="module")
def study(tmp_path_factory, cache):
  tmp = tmp_path_factory.mktemp("remote")
  r = _run(tmp, [os.path.join(ROOT, "tests", "fake_gcs.py"), *ARGS, f"--workdir={BUCKET}"], cache)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return tmp, r


def test_every_file_goes_to_the_bucket_and_none_to_the_local_disk(study):
  tmp, run = study
  objects = _bucket(tmp)
  seed = f"{BUCKET}/seed_0"
  expected = [f"{BUCKET}/config.json", f"{seed}/arms.json", f"{seed}/eval_interval.json"]
  expected += [f"{BUCKET}/report/{f}" for f in ("report.json", "report.csv", "report.txt",
                                                "curves.json", "accuracy_vs_flops.png")]
  for phase in ("base", "joint_grpo"):
    expected += [f"{seed}/{phase}/result.json", f"{seed}/{phase}/logs/metrics.jsonl",
                 # orbax: the finished phase's parameters and its last in-progress checkpoint,
                 # committed (on a bucket orbax marks a finished save with commit_success.txt)
                 f"{seed}/{phase}/final/checkpoints/0/commit_success.txt",
                 f"{seed}/{phase}/checkpoints/checkpoints/20/commit_success.txt"
                 if phase == "base" else
                 f"{seed}/{phase}/checkpoints/checkpoints/6/commit_success.txt"]
  missing = [k for k in expected if k not in objects]
  assert not missing, (missing, sorted(objects)[:40])
  for phase in ("base", "joint_grpo"):
    assert any(re.fullmatch(rf"{seed}/{phase}/logs/events\.out\.tfevents\..+", k) and objects[k]
               for k in objects), phase
    # orbax's arrays (tensorstore's gcs driver) went to the bucket too
    assert any(k.startswith(f"{seed}/{phase}/final/checkpoints/0/state/") and "/d/" in k
               for k in objects), phase
  assert not [k for k in objects if k.endswith(".tmp") or ".tmp." in k]
  assert objects[f"{BUCKET}/report/accuracy_vs_flops.png"].startswith(b"\x89PNG")
  rep = json.loads(objects[f"{BUCKET}/report/report.json"])
  assert {"base", "joint_grpo"} <= set(rep["arms"])
  assert json.loads(objects[f"{BUCKET}/config.json"])["joint"]["steps"] == 6
  assert {a["arm"] for a in json.loads(objects[f"{seed}/arms.json"])["arms"]} == {"base",
                                                                                 "joint_grpo"}
  rows = [json.loads(l) for l in objects[f"{seed}/joint_grpo/logs/metrics.jsonl"].splitlines()]
  assert any("reward/math" in r for r in rows) and any("heldout/mean" in r for r in rows)
  assert f"report: {BUCKET}/report/report.json" in run.stdout
  # Nothing on the local disk: the run's directory stays empty, no gs: directory anywhere; the
  # INFO log alone is local (an object store cannot append), in the temp directory.
  assert os.listdir(tmp / "cwd") == []
  _no_url_dirs(tmp)
  assert [re.fullmatch(r"smjax-\d+\.log", f) is not None
          for f in os.listdir(tmp / "tmp")] == [True], os.listdir(tmp / "tmp")


def test_a_rerun_reads_the_bucket_back(study, cache):
  """The same command again: every phase found finished in the bucket and reused (orbax restores
  its parameters from there), the report rewritten, still nothing local."""
  tmp, _ = study
  before = _bucket(tmp)
  r = _run(tmp, [os.path.join(ROOT, "tests", "fake_gcs.py"), *ARGS, f"--workdir={BUCKET}"], cache)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  logs = [f for f in os.listdir(tmp / "tmp") if f.endswith(".log")]
  text = "".join(open(tmp / "tmp" / f).read() for f in logs)
  for phase in ("base", "joint_grpo"):
    assert f"phase {phase}: finished before, reused" in text, phase
  after = _bucket(tmp)
  for phase in ("base", "joint_grpo"):
    key = f"{BUCKET}/seed_0/{phase}/result.json"
    assert after[key] == before[key]
  assert "split_merge" not in r.stdout and "joint_grpo" in r.stdout
  assert os.listdir(tmp / "cwd") == []
  _no_url_dirs(tmp)


def test_the_report_command_reads_and_writes_the_bucket(study):
  """`smjax report gs://...` re-renders the report from the bucket's config.json and arms.json,
  into the bucket."""
  tmp, _ = study
  code = ("import sys; sys.path.insert(0, sys.argv[1]); import os, fake_gcs; fake_gcs.install(); "
          "fake_gcs.load(os.environ['FAKE_GCS_STATE']); from smjax.study import report_cli; "
          "code = report_cli.main(sys.argv[2:]); fake_gcs.save(os.environ['FAKE_GCS_STATE']); "
          "sys.exit(code)")
  r = _run(tmp, ["-c", code, os.path.join(ROOT, "tests"), BUCKET, f"--out={BUCKET}/report2",
                 "--bootstrap=0"])
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "joint_grpo" in r.stdout and f"report: {BUCKET}/report2/report.json" in r.stdout
  objects = _bucket(tmp)
  rep = json.loads(objects[f"{BUCKET}/report2/report.json"])
  assert {"base", "joint_grpo"} <= set(rep["arms"]) and rep["bootstrap"] == 0
  assert os.listdir(tmp / "cwd") == []
  _no_url_dirs(tmp)


def test_the_status_command_reads_the_bucket(study):
  """`smjax status gs://...`: each seed's phases, read from the bucket alone (a bucket keeps no
  times for its prefixes, so the phases are listed by name)."""
  tmp, _ = study
  code = ("import sys; sys.path.insert(0, sys.argv[1]); import os, fake_gcs; fake_gcs.install(); "
          "fake_gcs.load(os.environ['FAKE_GCS_STATE']); from smjax.study import status; "
          "sys.exit(status.main(sys.argv[2:]))")
  r = _run(tmp, ["-c", code, os.path.join(ROOT, "tests"), BUCKET])
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  lines = r.stdout.splitlines()
  assert lines[0].startswith(f"{BUCKET} (") and lines[1] == "seed_0: 2 of 2 started phases done"
  assert [ln.split()[:2] for ln in lines[2:]] == [["done", "base"], ["done", "joint_grpo"]], lines
  assert os.listdir(tmp / "cwd") == []
  _no_url_dirs(tmp)


@pytest.mark.parametrize("workdir,needle", [
    ("s3://some-bucket/run", "workdir s3://some-bucket/run: s3:// is not supported"),
    ("foo://x/run", "workdir foo://x/run: foo:// is not supported"),
    # without the fake, and with gcsfs and google-cloud-storage made unimportable
    ("gs://some-bucket/run", "workdir gs://some-bucket/run: reading and writing gs:// needs gcsfs "
     "and google-cloud-storage (pip install gcsfs google-cloud-storage, or 'smjax[gcs]')"),
])
def test_a_workdir_this_install_cannot_write_is_one_line_before_any_work(tmp_path, workdir,
                                                                          needle):
  code = ("import sys; sys.modules['gcsfs'] = None; sys.modules['google.cloud.storage'] = None; "
          "from smjax import main; main.run()")
  r = _run(tmp_path, ["-c", code, *ARGS, f"--workdir={workdir}"])
  assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
  lines = [l for l in r.stderr.splitlines() if l.startswith("smjax: error:")]
  assert len(lines) == 1 and needle in lines[0], r.stderr[-2000:]
  assert "Traceback" not in r.stderr and "phase" not in r.stdout
  assert os.listdir(tmp_path / "cwd") == []
  _no_url_dirs(tmp_path)


def test_report_command_refuses_an_unsupported_scheme():
  from smjax.study import report_cli  # pylint: disable=import-outside-toplevel
  with pytest.raises(ValueError, match=r"workdir s3://b/run: s3:// is not supported"):
    report_cli.main(["s3://b/run"])


def test_paths_keep_urls_and_write_atomically(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.resolve("gs://b/run") == "gs://b/run"     # never <cwd>/gs:/b/run
  assert paths.resolve("runs/x") == str(tmp_path / "runs" / "x")
  assert paths.join("gs://b/run", "seed_0", "result.json") == "gs://b/run/seed_0/result.json"
  paths.makedirs("d/e")
  paths.write_atomic("d/e/f.json", '{"a": 1}')
  paths.write_atomic("d/e/f.json", b'{"a": 2}')
  assert paths.read_text("d/e/f.json") == '{"a": 2}' and paths.listdir("d/e") == ["f.json"]
  paths.rmtree("d")
  assert not paths.exists("d")
  paths.rmtree("d")   # absent: nothing to do
  with pytest.raises(FileNotFoundError):
    paths.read_text("d/e/f.json")
