"""smjax.precheck: the GRPO step compiled abstractly for a 64-device mesh, memory checked.

CI compiles Qwen3-8B's shape truncated to 2 layers (vocab, widths and heads as published) for
(data=8, fsdp=8, tensor=1) on 64 fake CPU devices; the full 36-layer compile (1.5-3 minutes and
~1.5 GB of host memory on the CPU path, 6-10 minutes and ~8.5 GB through libtpu) is run by hand;
launch/README.md has its figures. The per-device argument bytes are checked against a count
written out here from the model's shapes: parameters and both Adam moments split 8 ways over
"fsdp" (replicated over "data"), norm scales replicated, one batch row per device. An --hbm-gib
below that fails with exit status 1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import FAST_XLA_FLAGS

# Qwen3-8B (config.json): hidden 4096, 32 heads, 8 KV heads, head_dim 128, MLP 12288,
# vocab 151936, untied embeddings; truncated to 2 layers.
D, N, K, H, F, V, L = 4096, 32, 8, 128, 12288, 151936, 2
BATCH, SEQ, FSDP, DEVICES = 64, 256, 8, 64


def _precheck(*args):
  # The suite's fast-compile flags (conftest.py) and no device count: the CLI sets that itself.
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=FAST_XLA_FLAGS)
  return subprocess.run([sys.executable, "-m", "smjax.precheck", *args], env=env,
                        capture_output=True, text=True, timeout=600)


def _gib(text, name):
  m = re.search(rf"{name} ([0-9.]+) (GiB|MiB)", text)
  assert m, text
  return float(m.group(1)) * (1 if m.group(2) == "GiB" else 1 / 1024)


@pytest.fixture(scope="module")
def qwen3_8b_2_layers():
  return _precheck("--preset", "qwen3-8b", "--layers", str(L), "--mesh", "data=8,fsdp=8,tensor=1",
                   "--batch", str(BATCH), "--seq", str(SEQ), "--hbm-gib", "2")


def test_reports_the_cpu_path_and_64_devices(qwen3_8b_2_layers):
  out = qwen3_8b_2_layers.stdout
  assert "AOT compile path: cpu  topology=cpu:64  64 x cpu" in out, out + qwen3_8b_2_layers.stderr
  assert "mesh={'data': 8, 'fsdp': 8, 'tensor': 1}" in out
  assert "memory source: the CPU compiler" in out


def test_state_is_sharded_as_designed(qwen3_8b_2_layers):
  out = qwen3_8b_2_layers.stdout
  split = 2 * V * D + L * (D * N * H + 2 * D * K * H + N * H * D + 3 * D * F)
  replicated = L * (2 * D + 2 * H) + D               # RMSNorm scales (and q/k norms)
  state = 3 * 4 * (split / FSDP + replicated)        # float32 params, Adam mu and nu
  rows = BATCH // DEVICES
  # tokens and positions int32, attention mask bool; loss mask bool, old log-probs f32; reward
  batch = rows * (SEQ * (4 + 4 + 1) + (SEQ - 1) * (1 + 4) + 4)
  expected_gib = (state + batch) / 2**30
  assert _gib(out, "argument") == pytest.approx(expected_gib, abs=0.002)
  # The state is donated: the updated state reuses its buffers.
  assert _gib(out, "alias") == pytest.approx(state / 2**30, abs=0.002)


def test_flops_match_the_analytic_count(qwen3_8b_2_layers):
  out = qwen3_8b_2_layers.stdout
  tokens = BATCH * SEQ
  matmul = L * (D * N * H + 2 * D * K * H + N * H * D + 3 * D * F) + D * V
  analytic = 3 * (2 * matmul * tokens + 4 * L * N * H * tokens * SEQ)  # fwd + bwd, full attention
  measured = float(re.search(r"flops: ([0-9.e+]+) global", out).group(1))
  assert 1.0 <= measured / analytic < 1.05  # norms, softmax, loss and Adam add a little


def test_over_budget_exits_1(qwen3_8b_2_layers):
  assert qwen3_8b_2_layers.returncode == 1, qwen3_8b_2_layers.stderr[-3000:]
  assert "vs 2.000 GiB HBM: DOES NOT FIT" in qwen3_8b_2_layers.stdout


def test_within_budget_exits_0():
  proc = _precheck("--preset", "toy-tiny", "--mesh", "fsdp=2", "--batch", "8", "--seq", "16",
                   "--objective", "opd-full-vocab", "--hbm-gib", "1")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert "AOT compile path: cpu  topology=cpu:2  2 x cpu" in proc.stdout
  assert "HBM: fits" in proc.stdout


def test_shared_prompt_step_does_fewer_flops_as_counted():
  """toy-tiny, 16 rows of 8 prompt + 24 completion tokens, groups of 8: the shared-prompt step's
  measured FLOPs follow the analytic count of 16 x 24 + 2 x 8 body tokens (vs 16 x 32)."""
  flops = {}
  for extra in ((), ("--completion-len", "24"), ("--completion-len", "24", "--shared-prompt")):
    proc = _precheck("--preset", "toy-tiny", "--mesh", "fsdp=2", "--batch", "16", "--seq", "32",
                     "--group-size", "8", *extra)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    m = re.search(r"flops: ([0-9.e+]+) global.*analytic .* = ([0-9.e+]+) \(", proc.stdout)
    flops[extra[-1] if extra else "full"] = measured, analytic = tuple(map(float, m.groups()))
    assert 1.0 <= measured / analytic < 1.1, proc.stdout  # norms, softmax, loss, Adam add some
  assert flops["--shared-prompt"][0] < flops["24"][0] < flops["full"][0]
  assert "each prompt once per group" in proc.stdout


@pytest.mark.parametrize("args,message", [
    (("--mesh", "data=8,pipeline=2"), "'pipeline=2' must be AXIS=INT"),
    (("--mesh", "data=-1"), "every axis size must be >= 1"),
    (("--mesh", "data=3", "--batch", "8"), "batch field tokens_BS has 8 rows, not divisible"),
    (("--batch", "12"), "batch=12 rows must be a multiple of group_size=8"),
    (("--group-size", "8", "--shared-prompt"), "--shared-prompt needs --completion-len"),
    (("--completion-len", "8"), "--completion-len 8 must be in [0, seq=8)"),
])
def test_bad_arguments_exit_2(args, message):
  base = {"--preset": "toy-tiny", "--mesh": "data=2", "--batch": "16", "--seq": "8"}
  flags = dict(base, **dict(zip(args[::2], args[1::2])))
  switch = args[-1:] if len(args) % 2 else ()   # a trailing flag without a value
  proc = _precheck(*[x for kv in flags.items() for x in kv], *switch)
  assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
  assert message in proc.stderr
