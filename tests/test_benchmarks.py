"""Smoke tests of the benchmark scripts: argument parsing, the shared batch, and the JSON they
write, on tiny sizes and without peer venvs (`--skip-peer`). No timing assertions: benchmarks measure
speed, tests only check that the scripts run and report consistent records."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from smjax.study import bench_tables, render

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import _peer_common as common  # pylint: disable=wrong-import-position


def _load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(BENCH, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_grpo_advantages_hand_values():
  # Group [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3); group [2, 2, 2, 2]: constant -> 0.
  adv = common.grpo_advantages(np.array([1, 0, 0, 1, 2, 2, 2, 2], np.float32), 4, eps=0.0)
  s = 0.5 / np.sqrt(1 / 3)
  np.testing.assert_allclose(adv, [s, -s, -s, s, 0, 0, 0, 0], rtol=1e-6)


def test_text_round_trip_and_reward():
  ids = [3, 17, 4096, 8]
  assert common.ids_to_text(ids) == "t3 t17 t4096 t8"
  assert common.text_to_ids("t3 t17 <eos> t4096 t8") == [3, 17, 2, 4096, 8]
  assert common.reward_of_ids([3, 4, 6, 0, 0]) == pytest.approx(2 / 3)  # pads ignored


def test_step_batch_layout():
  b = common.make_step_batch(prompts=3, group_size=2, prompt_len=(2, 5), completion_len=6,
                             vocab=50, seed=1)
  B, P = b["prompt_BP"].shape
  assert B == 6 and b["completion_BC"].shape == (6, 6)
  for r in range(B):
    n = int(b["prompt_mask_BP"][r].sum())
    # Left-padded prompts, the same prompt for the G rows of a group.
    assert (b["prompt_BP"][r, :P - n] == common.PAD_ID).all()
    assert (b["prompt_BP"][r, P - n:] >= common.FIRST_WORD_ID).all()
    np.testing.assert_array_equal(b["prompt_BP"][r], b["prompt_BP"][r - r % 2])
    # Right-padded completions: real tokens first, pad ids exactly where the mask is 0.
    m = b["completion_mask_BC"][r]
    assert (np.diff(m) <= 0).all() and m[0] == 1
    assert ((b["completion_BC"][r] == common.PAD_ID) == (m == 0)).all()


def test_sequence_batch_aligns_loss_mask_with_completion_targets():
  import _peer_smjax  # pylint: disable=import-outside-toplevel
  b = common.make_step_batch(prompts=2, group_size=2, prompt_len=(3, 6), completion_len=5,
                             vocab=40, seed=2)
  sb = _peer_smjax.sequence_batch(b)
  targets = np.asarray(sb.tokens_BS)[:, 1:]
  mask = np.asarray(sb.loss_mask_BT)
  for r in range(4):
    real = b["completion_BC"][r][b["completion_mask_BC"][r] == 1]
    np.testing.assert_array_equal(targets[r][mask[r]], real)
  # Positions count real tokens only (left padding does not shift them).
  pos = np.asarray(sb.positions_BS)
  attn = np.asarray(sb.attn_mask_BS)
  for r in range(4):
    np.testing.assert_array_equal(pos[r][attn[r]], np.arange(attn[r].sum()))


def test_train_mfu_tiny_writes_consistent_json(tmp_path):
  mfu = _load("train_mfu")
  out = tmp_path / "mfu.json"
  # The GRPO step only (the SFT one takes the same path with another loss; a compile saved).
  res = mfu.main(["--size", "tiny", "--batch", "2", "--seq", "16", "--group-size", "2",
                  "--steps", "grpo", "--reps", "2", "--warmup", "1", "--matmul-size", "128",
                  "--matmul-per-step", "2", "--out", str(out)])
  on_disk = json.loads(out.read_text())
  assert set(on_disk["steps"]) == {"grpo"}
  # XLA's cost analysis of a matmul is exactly 2 n^3.
  assert on_disk["matmul_peak"]["flops"] == 2 * 128 ** 3
  # Sampled once before the steps and after each of the 2 timed steps.
  assert len(on_disk["matmul_peak"]["runs_s"]) == 2 * 3
  assert len(on_disk["steps"]["grpo"]["runs_s"]) == 2
  for name, rec in on_disk["steps"].items():
    # The compiled step does at least the analytic forward+backward work (plus loss, optimiser).
    assert rec["flops"] >= rec["useful_flops"] > 0, name
    assert rec["finite"] == 1.0 and np.isfinite(rec["loss"])
    assert rec["fraction_of_peak"] == pytest.approx(
        rec["flops"] / rec["median_s"] / on_disk["matmul_peak"]["flops_per_s"])
  assert res["steps"]["grpo"]["flops"] == on_disk["steps"]["grpo"]["flops"]


def test_grpo_vs_trl_skip_peer_tiny(tmp_path):
  drv = _load("grpo_step_vs_trl")
  out = tmp_path / "trl.json"
  drv.main(["--size", "tiny", "--prompts", "2", "--group-size", "2", "--prompt-len", "3", "6",
            "--completion-len", "4", "--reps", "1", "--warmup", "1", "--iter-reps", "1",
            "--iter-warmup", "1", "--skip-peer", "--envs-dir", str(tmp_path / "envs"),
            "--matmul-size", "64", "--matmul-samples", "2", "--out", str(out)])
  res = json.loads(out.read_text())
  assert not (tmp_path / "envs").exists()  # --skip-peer creates no venv
  assert "trl" not in res and "speedup" not in res
  step, it = res["smjax"]["step"], res["smjax"]["iteration"]
  assert step["median_s"] > 0 and it["median_s"] > 0
  assert step["minor_faults_per_call"] >= 0 and it["minor_faults_per_call"] >= 0
  assert step["compiled_flops"] > 0 and np.isfinite(step["first_grad_norm"])
  assert step["first_grad_norm"] > 0  # rewards in the tiny batch are not all equal
  # The shared-prompt step takes the same update with fewer FLOPs.
  shared = res["smjax"]["step_shared_prompt"]
  assert shared["first_loss"] == pytest.approx(step["first_loss"], rel=1e-5, abs=1e-7)
  assert shared["first_grad_norm"] == pytest.approx(step["first_grad_norm"], rel=1e-4)
  assert 0 < shared["compiled_flops"] < step["compiled_flops"]
  # The packed step too, with fewer FLOPs still (completions of 2..4 of 4 tokens; the plan drops
  # each row's last token).
  packed = res["smjax"]["step_packed"]
  assert packed["first_loss"] == pytest.approx(step["first_loss"], rel=1e-5, abs=1e-7)
  assert packed["first_grad_norm"] == pytest.approx(step["first_grad_norm"], rel=1e-4)
  assert 0 < packed["compiled_flops"] < shared["compiled_flops"]
  assert res["params"] > 0 and res["config"]["size"] == "tiny"
  # The peak is sampled after the (only) smjax round; without a peer no goal figure is made up.
  assert len(res["matmul_peak"]["runs_s"]) == 2 and res["matmul_peak"]["flops"] == 2 * 64 ** 3
  roof = res["roofline"]
  assert roof["step_flops"] == step["compiled_flops"] and "goal_fraction_of_peak" not in roof
  assert roof["shared_step_flops"] == shared["compiled_flops"]
  assert roof["packed_step_flops"] == packed["compiled_flops"]
  assert "shared_goal_fraction_of_peak" not in roof
  assert roof["smjax_fraction_of_peak"] == pytest.approx(
      step["compiled_flops"] / step["median_s"] / res["matmul_peak"]["flops_per_s"])


_FAKE_PEER = """
import argparse, json, os
ap = argparse.ArgumentParser(); ap.add_argument("--spec"); ap.add_argument("--out")
a = ap.parse_args()
spec = json.load(open(a.spec))
tuned = os.environ.get("MALLOC_ARENA_MAX") == "1"
step = dict(median_s=0.5 if tuned else 1.0, first_loss=0.25, first_grad_norm=2.0, what="fake")
json.dump(dict(step=step, modes=spec["modes"],
               env={k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}),
          open(a.out, "w"))
"""


@pytest.mark.parametrize("peer_malloc", ["both", "default"])
def test_peer_runs_as_shipped_and_under_smjax_malloc_settings(tmp_path, monkeypatch, peer_malloc):
  # A stand-in peer (this interpreter, no venv) that reports the malloc variables it was started
  # with and a step time that depends on them: the driver must run it as shipped, then (with
  # --peer-malloc both) under smjax.cpu_malloc.ENV, and take each ratio against its own run.
  import _peer_smjax  # pylint: disable=import-outside-toplevel
  from smjax import cpu_malloc  # pylint: disable=import-outside-toplevel
  script = tmp_path / "fake_peer.py"
  script.write_text(_FAKE_PEER)
  monkeypatch.setattr(_peer_smjax.common, "ensure_venv", lambda path, reqs: sys.executable)
  for k in list(os.environ):
    if k.startswith("MALLOC_"):
      monkeypatch.delenv(k)
  args = _peer_smjax.parse_args("t", "fake", [
      "--size", "tiny", "--prompts", "2", "--group-size", "2", "--prompt-len", "3", "6",
      "--completion-len", "4", "--reps", "1", "--warmup", "1", "--modes", "step",
      "--matmul-size", "64", "--matmul-samples", "1", "--peer-malloc", peer_malloc,
      "--envs-dir", str(tmp_path / "envs"), "--out", str(tmp_path / "r.json")])
  res = _peer_smjax.compare(args, peer="fake", requirements=[], peer_script=str(script), goal=2.0)
  assert json.loads((tmp_path / "r.json").read_text())["speedup"] == res["speedup"]
  assert res["smjax_malloc"] == cpu_malloc.STATUS
  slow = max(res["smjax"]["step"]["median_s"], res["smjax_after_peer"]["step"]["median_s"])
  assert res["fake"]["env"] == {} and res["fake"]["malloc"] == "glibc defaults"
  assert res["fake"]["modes"] == ["step"]
  assert res["speedup"]["step"] == pytest.approx(1.0 / slow)
  assert res["roofline"]["goal_step_s"] == pytest.approx(0.5)  # against the as-shipped run
  if peer_malloc == "both":
    assert res["fake_tuned_malloc"]["env"] == cpu_malloc.ENV
    assert res["fake_tuned_malloc"]["malloc"] == cpu_malloc.ENV
    assert res["speedup_tuned_malloc"]["step"] == pytest.approx(0.5 / slow)
  else:
    assert "fake_tuned_malloc" not in res and "speedup_tuned_malloc" not in res


def test_step_xla_options_tiny_writes_consistent_json(tmp_path):
  drv = _load("step_xla_options")
  out = tmp_path / "xo.json"
  # The default and one other set; an option name jaxlib rejects is reported, not fatal.
  drv.OPTION_SETS["bogus"] = {"xla_cpu_no_such_option_smjax": True}
  try:
    res = drv.main(["--size", "tiny", "--prompts", "2", "--group-size", "2", "--prompt-len", "3",
                    "6", "--completion-len", "4", "--sets", "vector_512", "bogus", "--rounds", "2",
                    "--warmup", "1", "--out", str(out)])
  finally:
    del drv.OPTION_SETS["bogus"]
  on_disk = json.loads(out.read_text())
  assert set(on_disk["sets"]) == {"default", "vector_512"} and set(on_disk["failed"]) == {"bogus"}
  assert "xla_cpu_no_such_option_smjax" in on_disk["failed"]["bogus"]
  d, v = on_disk["sets"]["default"], on_disk["sets"]["vector_512"]
  assert d["speedup_vs_default"] == 1.0 and len(d["runs_s"]) == 2
  assert v["speedup_vs_default"] == pytest.approx(d["median_s"] / v["median_s"])
  assert v["options"] == {"xla_cpu_prefer_vector_width": 512}
  # The options change rounding at most: the same update.
  assert v["first_loss"] == pytest.approx(d["first_loss"], rel=1e-4, abs=1e-7)
  assert v["first_grad_norm"] == pytest.approx(d["first_grad_norm"], rel=1e-4)
  assert d["compiled_flops"] > 0 and res["sets"]["default"]["median_s"] == d["median_s"]


def test_roofline_hand_values():
  _load("grpo_step_vs_trl")  # puts benchmarks/ on sys.path
  import _peer_smjax  # pylint: disable=import-outside-toplevel
  # 40 GFLOP on a 200 GFLOP/s peak: 0.2 s floor. smjax 0.4 s = 50 %; the peer 0.5 s = 40 %; a
  # step 2x faster than the peer (0.25 s) would need 40 * 2 / 0.5 / 200 = 80 % of the peak.
  r = _peer_smjax.roofline(step_flops=40e9, peak_flops_per_s=200e9, smjax_s=0.4, peer_s=0.5,
                           goal=2.0)
  assert r["floor_s"] == pytest.approx(0.2)
  assert r["smjax_fraction_of_peak"] == pytest.approx(0.5)
  assert r["peer_fraction_of_peak"] == pytest.approx(0.4)
  assert r["goal_step_s"] == pytest.approx(0.25)
  assert r["goal_fraction_of_peak"] == pytest.approx(0.8)
  # A shared-prompt step of 30 GFLOP in 0.3 s: 50 % of the peak; at 2x the peer (0.25 s), 60 %.
  r = _peer_smjax.roofline(step_flops=40e9, peak_flops_per_s=200e9, smjax_s=0.4, peer_s=0.5,
                           goal=2.0, variants={"shared": (30e9, 0.3)})
  assert r["shared_fraction_of_peak"] == pytest.approx(0.5)
  assert r["shared_goal_fraction_of_peak"] == pytest.approx(0.6)


def test_tunix_driver_parses_its_arguments():
  drv = _load("grpo_step_vs_tunix")
  import _peer_smjax  # pylint: disable=import-outside-toplevel
  args = _peer_smjax.parse_args("x", "tunix", ["--size", "mid", "--modes", "step"])
  assert args.out == "bench_results/grpo_step_vs_tunix.json"
  assert args.modes == ["step"] and args.size == "mid" and not args.skip_peer
  assert drv.REQUIREMENTS and all("tunix" in r for r in drv.REQUIREMENTS[:1])
  with pytest.raises(SystemExit):
    _peer_smjax.parse_args("x", "tunix", ["--size", "huge"])


def test_gpu_check_cpu_smoke_writes_every_section(tmp_path):
  # The GPU script's own CPU path (issue 27): every section at tiny shapes, the kernels
  # interpreted, in a subprocess as a GPU session would run it (its env and imports included).
  import subprocess  # pylint: disable=import-outside-toplevel
  out, tmp = tmp_path / "gpu_check.json", tmp_path / "tmp"
  tmp.mkdir()
  proc = subprocess.run([sys.executable, os.path.join(BENCH, "gpu_check.py"), "--cpu-smoke",
                         "--out", str(out), "--demo-workdir", str(tmp_path / "demo")],
                        capture_output=True, text=True, timeout=300, check=False,
                        env=dict(os.environ, TMPDIR=str(tmp)))
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  assert not list(tmp.iterdir())   # the real-model section's run directory is removed
  res = json.loads(out.read_text())
  assert res["smoke"] and res["backend"] == "cpu"
  secs = res["sections"]
  assert list(secs) == ["kernels", "step", "sampler", "real_model", "demo"]
  for name, rec in secs.items():
    assert "error" not in rec and "skipped" not in rec, (name, rec)

  def numbers(x):  # every number in a record (None: a figure the CPU does not give)
    if isinstance(x, dict):
      return [n for v in x.values() for n in numbers(v)]
    if isinstance(x, list):
      return [n for v in x for n in numbers(v)]
    return [x] if isinstance(x, (int, float)) and not isinstance(x, bool) else []

  for name, rec in secs.items():
    assert numbers(rec) and all(np.isfinite(numbers(rec))), name
  kern = secs["kernels"]
  assert kern["interpret"]
  for dtype, rows in kern["reverse_kl"].items():
    assert set(rows) >= {"pallas", "xla", "naive"}
    for impl in ("pallas", "xla"):
      assert rows[impl]["err_fwd"]["max_abs"] < 1e-4, (dtype, impl)
      assert rows[impl]["err_grad"]["max_rel"] < 1e-2, (dtype, impl)
      assert rows[impl]["grad"]["temp_bytes"] >= 0 and rows[impl]["grad"]["median_s"] > 0
  for impl in ("pallas", "xla"):
    ga = kern["group_advantage"][impl]
    assert ga["err_fwd"]["max_abs"] < 1e-5 and ga["err_grad"]["max_rel"] < 1e-4, impl
  step = secs["step"]
  assert step["finite"] == 1.0 and step["compiled_flops"] > 0 and step["step_s"] > 0
  assert 2 * 128 ** 3 <= step["matmul"]["flops"] <= 1.05 * 2 * 128 ** 3  # + bf16 converts
  assert step["mfu_vs_matmul"] == pytest.approx(
      step["compiled_flops"] / step["step_s"] / step["matmul"]["flops_per_s"])
  samp = secs["sampler"]
  assert samp["steps_run"] == samp["new_tokens"] - 1 and samp["tokens_per_s"] > 0
  real = secs["real_model"]   # the smoke settings on toy-small: the section's code, not SmolLM2
  assert real["source"].startswith("toy-small") and real["settings"]["steps"] == 2
  assert [p["step"] for p in real["curve"]] == [0, 1, 2] and real["train_flops_per_step"] > 0
  assert real["mfu_vs_spec"] == pytest.approx(
      real["train_flops_per_step"] / real["seconds_per_step"]["median"] / 989e12)
  demo = secs["demo"]
  assert demo["stand_in"] and demo["returncode"] == 0 and demo["verdicts"]
  # Goals are for the GPU run: here every one is marked not applicable, with its value.
  assert set(res["goals"]) == {"reverse_kl_at_least_as_fast_as_chunked_xla",
                               "reverse_kl_8x_less_temp_memory_than_naive",
                               "grpo_step_mfu_40pct_bf16", "demo_under_2_min"}
  for g in res["goals"].values():
    assert g["applicable"] is False and g["met"] is None and g["value"] is not None
  assert "gpu_check on cpu" in proc.stdout and "goal grpo_step_mfu_40pct_bf16" in proc.stdout


def test_rollout_vs_hf_toy_writes_consistent_json(tmp_path):
  """The sampler benchmark end to end at toy size: both sides run, the JSON renders; decoded in
  two stages, one loop over the whole cache is timed beside them."""
  out = tmp_path / "r.json"
  proc = subprocess.run([sys.executable, os.path.join(BENCH, "rollout_vs_hf.py"), "--size", "toy",
                         "--prompts", "2", "--samples", "2", "--new-tokens", "20", "--reps", "2",
                         "--rounds", "3", "--modes", "sample", "--decode-stages", "2", "--out",
                         str(out)],
                        capture_output=True, text=True, check=False, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  res = json.loads(out.read_text())
  e = res["sizes"]["toy"]["modes"]["sample"]
  assert res["sizes"]["toy"]["rows"] == 4 and e["tokens"] == 80
  # 3 rounds of 2 calls per side; each ratio is the median over rounds of the round's ratio
  assert e["rounds"] == 3 and len(e["smjax_runs_s"]) == len(e["hf_runs_s"]) == 6
  pair = lambda side, r: np.median(e[f"{side}_runs_s"][2 * r:2 * r + 2])
  rounds = [pair("hf", r) / pair("smjax", r) for r in range(3)]
  assert e["speedup_rounds"] == pytest.approx(rounds)
  assert e["speedup"] == pytest.approx(np.median(rounds))
  assert e["smjax_s"] == pytest.approx(np.median(e["smjax_runs_s"]))
  assert e["smjax_rounds_s"] == pytest.approx([pair("smjax", r) for r in range(3)])
  assert res["goals"] == []  # 4 rows x 20 tokens is no GRPO-sized batch
  assert e["smjax_floor_fraction"] == pytest.approx(
      e["smjax_useful_flops"] / e["smjax_s"] / res["matmul_flops_per_s"])
  assert res["sizes"]["toy"]["decode_stages"] == 2 and e["stages_same_tokens"] is True
  assert e["stages_rows_same"] == 4
  assert e["stages_speedup"] == pytest.approx(np.median(
      [pair("smjax_one_loop", r) / pair("smjax", r) for r in range(3)]))
  assert e["smjax_one_loop_compiled_flops"] > e["smjax_compiled_flops"]
  md = bench_tables.bench_markdown(res)
  assert "| toy (0.1M) | sample |" in md and "| decode stages vs one loop |" in md
  lo, hi = min(e["stages_speedup_rounds"]), max(e["stages_speedup_rounds"])
  assert f"| 2 stages **{e['stages_speedup']:.2f}x** [{lo:.2f}, {hi:.2f}] |" in md
  assert "3 rounds of 2 call(s) per side in rotating order" in md


def test_rollout_vs_hf_goals_by_the_median_over_rounds():
  """The goals at a GRPO-sized batch: met by the median over rounds, with the rounds that met it
  counted; smaller batches get none; the table prints each ratio's range over rounds."""
  rvh = _load("rollout_vs_hf")
  e = dict(rounds=3, smjax_rounds_s=[1.0, 2.0, 1.0], smjax_useful_flops=4e10, smjax_s=1.0,
           smjax_floor_fraction=0.4, speedup=3.1, speedup_rounds=[2.9, 3.1, 3.3],
           speedup_vs_tunix=1.9, speedup_vs_tunix_rounds=[1.9, 1.8, 2.2])
  res = dict(matmul_flops_per_s=1e11, sizes={"small": dict(rows=64, modes={"sample": e}),
                                             "toy": dict(rows=8, modes={"sample": e})})
  args = type("A", (), dict(new_tokens=64))
  g = {x["goal"]: x for x in rvh.goals(res, args)}
  assert {x["size"] for x in g.values()} == {"small"}
  hf, tunix, floor = (g["smjax / HF generate >= 3x"], g["smjax / Tunix sampler >= 2x"],
                      g["decode >= 40 % of the matmul floor"])
  assert (hf["met"], hf["rounds_met"], hf["low"], hf["high"]) == (True, 2, 2.9, 3.3)
  assert (tunix["met"], tunix["rounds_met"]) == (False, 1)
  # per round: 4e10 useful FLOPs / the round's time / 1e11 -> 0.4, 0.2, 0.4
  assert floor["low"] == pytest.approx(0.2) and floor["rounds_met"] == 2 and floor["met"]
  args.new_tokens = 32
  assert rvh.goals(res, args) == []
  e.update(smjax_tokens_per_s=1.0, hf_tokens_per_s=1.0, hf_floor_fraction=0.1)
  md = bench_tables.bench_markdown(dict(
      benchmark="rollout_vs_hf", command="c", cpu="cpu", threads=2, jax="0", date="d",
      matmul_flops_per_s=1e11, goals=[hf, tunix, floor], config=dict(
          prompts=16, samples=4, new_tokens=64, prompt_len=[16, 32], reps=1),
      sizes={"small": dict(params=5.5e6, rows=64, modes={"sample": e})}))
  assert "| **3.10x** [2.90, 3.30] |" in md
  assert ("- small: smjax / HF generate >= 3x: **met**, 3.10x (rounds 2.90x to 3.30x; met in 2 "
          "of 3)") in md
  assert "- small: decode >= 40 % of the matmul floor: **met**, 40 % (rounds 20 % to 40 %" in md


PEER_SCRIPT = """
import sys
import _peer_common as common
spec, _ = common.read_spec("a test peer")
def boom():
  raise ValueError("the peer's own error")
common.serve(dict(add=lambda a, b: a + b + spec["offset"], boom=boom,
                  hang=lambda: __import__("time").sleep(60)), dict(hello="peer"))
"""


def test_peer_session_serves_requests_and_reports_failures(tmp_path):
  """A serving peer (what the Tunix sampler peer runs on) answers requests in order and ignores
  other output; its exception, its exit and a request past its timeout raise RuntimeError with
  what the peer said."""
  script = tmp_path / "peer.py"
  script.write_text("print('a library talking on stdout')\n" + PEER_SCRIPT)
  peer = common.PeerSession(sys.executable, str(script), dict(offset=10), str(tmp_path),
                            timeout_s=60, log=lambda *_: None)
  assert peer.ready == dict(hello="peer")
  assert peer.call("add", a=1, b=2, timeout_s=60) == 13
  assert peer.call("add", a=5, b=5, timeout_s=60) == 20
  peer.close()
  peer = common.PeerSession(sys.executable, str(script), dict(offset=0), str(tmp_path),
                            timeout_s=60, log=lambda *_: None)
  with pytest.raises(RuntimeError, match="the peer's own error"):
    peer.call("boom", timeout_s=60)
  peer = common.PeerSession(sys.executable, str(script), dict(offset=0), str(tmp_path),
                            timeout_s=60, log=lambda *_: None)
  with pytest.raises(RuntimeError, match="gave no answer within 1 s"):
    peer.call("hang", timeout_s=1)
  script.write_text("import sys; print('no spec here', file=sys.stderr); sys.exit(3)\n")
  with pytest.raises(RuntimeError, match=r"exited \(code 3\)[\s\S]*no spec here"):
    common.PeerSession(sys.executable, str(script), {}, str(tmp_path), timeout_s=60,
                       log=lambda *_: None)


def test_rollout_vs_hf_tunix_columns_and_refusal(tmp_path):
  """With Tunix figures the table gains Tunix's tok/s, smjax / Tunix and Tunix's floor share; when
  Tunix's venv cannot be made, the benchmark exits non-zero before measuring anything."""
  e = dict(smjax_tokens_per_s=2000.0, hf_tokens_per_s=500.0, speedup=4.0,
           smjax_floor_fraction=0.4, hf_floor_fraction=0.1, tunix_s=0.5,
           tunix_tokens_per_s=800.0, speedup_vs_tunix=2.5, tunix_floor_fraction=0.16)
  res = dict(benchmark="rollout_vs_hf", command="python benchmarks/rollout_vs_hf.py --tunix",
             cpu="cpu", threads=2, jax="0", date="d", matmul_flops_per_s=1e11,
             config=dict(prompts=16, samples=4, new_tokens=64, prompt_len=[16, 32]),
             sizes={"mid": dict(params=12.6e6, rows=64, modes={"sample": e})})
  md = bench_tables.bench_markdown(res)
  assert "| Tunix tok/s | smjax / Tunix | Tunix, of floor |" in md
  assert ("| mid (12.6M) | sample | 2,000 | 500 | **4.00x** | 40 % | 10 % | 800 | **2.50x** | "
          "16 % |") in md
  header, rule = [line for line in md.splitlines() if line.startswith("|")][:2]
  assert header.count("|") == rule.count("|")
  blocker = tmp_path / "not_a_dir"
  blocker.write_text("")
  out = tmp_path / "r.json"
  proc = subprocess.run([sys.executable, os.path.join(BENCH, "rollout_vs_hf.py"), "--tunix",
                         "--envs-dir", str(blocker), "--out", str(out)],
                        capture_output=True, text=True, check=False, timeout=300)
  assert proc.returncode != 0 and "Tunix could not be installed" in proc.stderr, proc.stderr[-2000:]
  assert not out.exists()


def test_decode_profile_interval_merge_and_scopes():
  dp = _load("decode_profile")
  assert dp.merged_ns([(0, 10), (5, 12), (20, 25), (24, 30)]) == 22  # hand-computed
  assert dp.merged_ns([]) == 0
  hlo = ('  %dot.3 = f32[2]{0} dot(%a, %b), metadata={op_name="jit(f)/while/body/Transformer/'
         'layers_0/mlp/dot_general" stack_frame_id=1}\n  ROOT %x = f32[] add(%c)')
  scopes = dp.op_scopes(hlo)
  assert scopes == {"dot.3": "jit(f)/while/body/Transformer/layers_0/mlp/dot_general"}
  part = next(name for name, test in dp.PARTS if test(scopes["dot.3"]))
  assert part.startswith("MLP")


def test_decode_profile_captures_the_loops_the_sampler_calls(monkeypatch):
  """The profile swaps rollout's decode loops for one call to capture their arguments: the names
  it swaps must be the ones Sampler.generate calls (a rename once left it failing at start)."""
  import jax
  from smjax import rollout as ro
  from smjax.models.transformer import ModelConfig, init_params
  dp = _load("decode_profile")
  called = []
  for name in dp.LOOPS:
    loop = getattr(ro, name)
    monkeypatch.setattr(ro, name, lambda *a, _n=name, _l=loop, **k: called.append(_n) or _l(*a, **k))
  cfg = ModelConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                    d_ff=32, max_seq_len=64)
  params = init_params(cfg, jax.random.key(0))
  for stages in (1, 2):
    ro.Sampler(cfg, max_new_tokens=17, eos_id=None, pad_id=0, decode_stages=stages).generate(
        params, [[3, 4, 5]], jax.random.key(1), num_samples=2)
  assert called == list(dp.LOOPS)


def test_decode_profile_matmuls_alone_cover_the_step():
  """The shapes timed alone are every matmul of a decode step: their FLOPs are the analytic dense
  FLOPs of one token per row (no attention); the timing and the rendered table hold together."""
  import jax
  from smjax.flops import analytic_flops
  from smjax.models.transformer import ModelConfig
  dp = _load("decode_profile")
  cfg = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                    d_ff=48, max_seq_len=64)
  shapes = dp.decode_matmuls(cfg, rows=6)
  assert 2 * sum(m * k * n * c for _, m, k, n, c in shapes) == analytic_flops(
      cfg, tokens=6, context_len=0, backward=False)
  alone, dispatch = dp.matmuls_alone(jax, shapes, reps=3)
  assert dispatch > 0 and [a["shape"] for a in alone] == [[m, k, n] for _, m, k, n, _ in shapes]
  assert all(a["flops_per_s"] == pytest.approx(2 * m * k * n / (a["ms"] / 1e3))
             for a, (_, m, k, n, _) in zip(alone, shapes))
  data = dict(benchmark="decode_profile", command="c", cpu="cpu", threads=2, jax="0", date="d",
              matmul_flops_per_s=1e11, rows=6, new_tokens=8, ms_per_step=1.0, floor_fraction=0.1,
              categories=[dict(category="MLP", ms_per_step=0.5, share=1.0)], matmuls_alone=alone,
              dispatch_ms=dispatch * 1e3, matmuls_alone_ms_per_step=0.25,
              matmuls_alone_floor_fraction=0.4)
  md = bench_tables.bench_markdown(data)
  assert "0.25 ms per step; a step that took only that would be at 40 % of the matmul floor" in md
  assert md.count("| q/k/v | 6 x 32 x 64 | 2 |") == 1


def test_study_seeds_base_only_records_each_seeds_band_and_misses(tmp_path):
  """Two seeds' bases, at once: each row holds its band measurement and what it misses of the
  config's band (recomputed here from the measurement), and the docs renderer's table says so."""
  out = tmp_path / "band.json"
  p = subprocess.run(
      [sys.executable, os.path.join(BENCH, "study_seeds.py"), "--base-only", "--jobs", "2",
       "--seeds", "0", "1", "--config", "configs/study.py:two_domain,demo",
       f"--workdir={tmp_path / 'w'}", f"--out={out}", "--config.base.steps=3",
       "--config.base.batch_size=16",
       "--config.domains=('math',)", "--config.heldout_size=8", "--config.stop_size=8",
       "--config.eval.batch_size=8", "--config.eval.samples=1", "--config.eval.greedy=False",
       "--config.band.low=0.5"],
      cwd=os.path.dirname(BENCH), capture_output=True, text=True, timeout=600)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
  data = json.loads(out.read_text())
  assert data["base_only"] and [r["seed"] for r in data["seeds"]] == [0, 1]
  for r in data["seeds"]:
    band = r["band"]
    assert band["samples"] == 8 and set(band["accuracy"]) == {"math"}
    assert r["band_config"]["low"] == 0.5
    want = [d for d, a in band["accuracy"].items() if not 0.5 <= a <= r["band_config"]["high"]]
    assert want and all(any(m.startswith(f"{d} accuracy ") for m in r["misses"]) for d in want)
    assert not (tmp_path / "w" / f"seed{r['seed']}" / f"seed_{1 - r['seed']}").exists()
  table = render.seeds_markdown(data)
  assert "| seed | sampled accuracy | pass@8 | band |" in table
  assert "accuracy in [50%, 50%]" in table
  assert table.count("math accuracy ") == 2 and "is outside [50%, 50%]" in table


def test_study_seeds_refuses_an_unknown_argument():
  p = subprocess.run([sys.executable, os.path.join(BENCH, "study_seeds.py"), "--bogus=1"],
                     capture_output=True, text=True, timeout=120)
  assert p.returncode == 2 and "unrecognized argument '--bogus=1'" in p.stderr, p.stderr


def test_real_model_gain_curve_points_and_markdown(tmp_path):
  """benchmarks/real_model.py's figures from scripted evaluations: the paired gain's interval
  (none where nothing changed, beyond 0 where every prompt improved), a curve point's accuracy and
  prompt count, and the JSON rendered as the docs' block and plot."""
  # pylint: disable=protected-access
  rm = _load("real_model")
  same = {"correct": {"d": [1, 2, 0, 4]}, "samples": 4}
  g = rm._gain(same, same, "d")
  assert g["mean"] == g["lo"] == g["hi"] == 0.0 and not g["beyond_interval"]
  better = {"correct": {"d": [3, 4, 2, 4]}, "samples": 4}
  g = rm._gain(same, better, "d")
  assert g["mean"] == pytest.approx(1.5 / 4) and g["lo"] > 0 and g["beyond_interval"]
  raw = {"step": 5, "flops": 2e12, "samples": 4, "correct": {"d": [3, 4, 2, 4]},
         "pass_at_k": {"d": 1.0}, "length": {"d": 11.5}, "at_cap": {"d": 0.25},
         "completions": {"d": [{"prompt": "p", "completion": "c", "reward": 1.0}] * 3}}
  p = rm._point(raw, "d")
  assert p["prompts"] == 4 and p["accuracy"]["mean"] == pytest.approx(13 / 16)
  assert p["accuracy"]["lo"] <= 13 / 16 <= p["accuracy"]["hi"] and len(p["completions"]) == 2
  start = rm._point(same | {"step": 0, "flops": 0.0, "pass_at_k": {"d": 0.75},
                            "length": {"d": 14.0}, "at_cap": {"d": 0.5}}, "d")
  settings = {"steps": 5, "prompts_per_step": 8, "samples_per_prompt": 8, "learning_rate": 1e-5,
              "temperature": 0.5, "max_new_tokens": 24, "eval_samples": 4}
  data = {"benchmark": "real_model", "command": "benchmarks/real_model.py", "date": "2026-12-05",
          "machine": {"cpu": "cpu", "cores": 2}, "wall_s": 600.0, "matmul_flops_per_s": 1e11,
          "config": {"grpo": settings, "distill": settings},
          "grpo": {"curve": [start, p], "gain_first_to_last": g,
                   "seconds_per_step": {"median": 10.0, "first": 20.0},
                   "train_flops_per_step": 4e11, "matmul_floor_fraction": 0.4}}
  md = bench_tables.bench_markdown(data)
  assert "| 5 | 2e+12 | 81.2 % [" in md and "held-out: 4 prompts x 4 samples" in md
  assert "+37.5 points" in md and "beyond its interval" in md and "40 % of the matmul floor" in md
  assert "MOPD" not in md
  rm.plot(data, str(tmp_path / "p.png"))
  assert os.path.getsize(tmp_path / "p.png") > 1000


def test_real_model_profile_names_every_part_on_a_toy_model():
  """The real-model profile's machinery on toy-tiny (seconds): every part of a step timed, the
  traced update's ops reach the LM head and log-prob parts by their name scopes (`lm_head`,
  `token_logprobs`: a renamed scope would leave those parts empty), and the decode loop's by
  decode_profile's parts; the rendered table holds together."""
  from smjax.api import grpo_settings
  from smjax.domains import get_domain
  rmp = _load("real_model_profile")
  s = grpo_settings()
  s.update(dict(prompts_per_step=2, samples_per_prompt=2, max_new_tokens=8, eval_size=4,
                eval_samples=1, learning_rate=1e-3))
  out = rmp.profile("toy-tiny", get_domain("math"), s, steps=3, rate=1e11)
  assert out["steps_timed"] == 1 and len(out["evaluation_s"]) == 2   # before and after
  assert set(out["step_parts_s"]) == {"rollout", "batch", "update"}
  assert all(v > 0 for v in out["step_parts_s"].values()) and out["step_s"] > 0
  update = {r["part"]: r for r in out["update_parts"]}
  for part in ("LM head matmuls (forward and backward)",
               "log-probs and entropy over the vocabulary", "MLP (matmuls, SiLU)"):
    assert update[part]["ms"] > 0, (part, update)
  decode = {r["part"] for r in out["decode_parts"]}
  assert {"MLP (gate/up and down matmuls, SiLU)", "LM head and final norm"} <= decode
  for key in ("update_parts", "decode_parts"):
    assert sum(r["share"] for r in out[key]) == pytest.approx(1.0)
  assert out["decode_steps"] >= 1 and out["update_flops"] > 0 and out["rollout_flops"] > 0
  data = dict(benchmark="real_model_profile", command="c", cpu="cpu", threads=2, jax="0",
              date="d", matmul_flops_per_s=1e11) | out
  md = bench_tables.bench_markdown(data)
  assert "| update (per step) | LM head matmuls (forward and backward) |" in md
  assert f"took {out['step_s']:.2f} s (median of 1 steps" in md
