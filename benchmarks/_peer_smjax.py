"""The smjax side of the GRPO peer benchmarks (grpo_step_vs_trl.py, grpo_step_vs_tunix.py).

Runs in smjax's own venv. The model is a random Qwen3-style `transformers` model saved with
`save_pretrained` and loaded into smjax with `smjax.models.hf.load_params`, so the peers (which
load the same directory) train exactly the same weights.

What is timed here:
- step: `jit_step(make_grpo_step(...))`, compiled ahead of time (compile time reported apart),
  on the fixed batch of `_peer_common.make_step_batch` (forward over prompt + completion, the LM
  head and log-probs on the completion positions only (the batch's `Layout.completion_len`, as
  TRL's `logits_to_keep`), GRPO loss from rewards, backward, grad-norm clip, AdamW): median of `reps`
  calls after `warmup`. The peers' computation, token for token.
- step_shared_prompt: the same step on a batch laid out with `Layout.rows_per_prompt = G`: each
  prompt's forward runs once for its G completions (smjax.train.score). The same loss, gradient
  and update (its first loss and gradient norm are checked against the peer's too) with fewer
  FLOPs; neither peer does this.
- step_packed: the shared-prompt step on the batch packed by `smjax.batch.pack`: the
  completions run as one stream without their padding and without each row's last token (which
  predicts nothing), attention alone back in the padded row layout (smjax.models.attention
  PackedRows). The same update again (checked against the peer's first loss and gradient norm),
  fewer FLOPs still: the batch's completions are 32-64 of 64 tokens, 697 real of 1024.
- iteration: `Sampler.generate` (G samples per prompt, fixed length, no EOS), the reward on the
  host, `rollout_batch`, and the compiled shared-prompt step (the fixed batch is padded to the
  sampler's prompt bucket, so both have one shape): one full GRPO iteration, median of `reps`.

malloc: with glibc's default settings the small packed step page-faults its 145 MB of XLA:CPU
temporaries in again on every call, and torch's CPU allocator does the same for TRL's step
(smjax.cpu_malloc). SMJAX_CPU_MALLOC=tuned in this process's environment switches smjax's side to
settings that keep those pages (opt-in; the output and the JSON's `smjax_malloc` say which ran).
The peer runs as shipped, with glibc's defaults, and by default (`--peer-malloc both`) a second
time under the same settings as environment variables (`cpu_malloc.ENV`), so each side's ratio
can be read with either setting on the other. The JSON keeps both (`<peer>`, `speedup`;
`<peer>_tuned_malloc`, `speedup_tuned_malloc`).
"""

from __future__ import annotations

import time

import numpy as np

# With SMJAX_CPU_MALLOC=tuned, importing smjax sets glibc's malloc for XLA:CPU (smjax.cpu_malloc);
# it must come before any JAX backend starts.
import smjax  # noqa: F401  pylint: disable=unused-import
from smjax import cpu_malloc

import _peer_common as common


def build_hf_model(size: str, path: str, *, seed: int = 0) -> int:
  """Saves a random Qwen3-style HF model of `size` at `path`; returns its parameter count."""
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  torch.manual_seed(seed)
  model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common.hf_config_kwargs(size)))
  model.save_pretrained(path)
  return sum(p.numel() for p in model.parameters())


def _optimizer(lr: float):
  from smjax.train import state as state_lib  # pylint: disable=import-outside-toplevel
  # AdamW as torch's defaults (betas 0.9/0.999, eps 1e-8, no weight decay), global-norm clip 1.0.
  return state_lib.make_optimizer(state_lib.OptimizerConfig(
      learning_rate=lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0, clip_norm=1.0))


def sequence_batch(b: dict[str, np.ndarray], rows_per_prompt: int = 1, group_size: int = 0):
  """The numpy step batch as a `SequenceBatch` (prompt ++ completion, target-aligned mask), laid
  out as `rollout_batch` lays out a sampler result of the same shapes (`group_size`: its reward
  groups, the sampler's samples per prompt)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from smjax.batch import Layout, SequenceBatch  # pylint: disable=import-outside-toplevel
  tokens = np.concatenate([b["prompt_BP"], b["completion_BC"]], axis=1).astype(np.int32)
  attn = np.concatenate([b["prompt_mask_BP"], b["completion_mask_BC"]], axis=1).astype(bool)
  positions = np.maximum(np.cumsum(attn, axis=1) - 1, 0).astype(np.int32)
  P = b["prompt_BP"].shape[1]
  loss_mask = np.zeros((tokens.shape[0], tokens.shape[1] - 1), bool)
  loss_mask[:, P - 1:] = b["completion_mask_BC"].astype(bool)
  return SequenceBatch(tokens_BS=jnp.asarray(tokens), positions_BS=jnp.asarray(positions),
                       attn_mask_BS=jnp.asarray(attn), loss_mask_BT=jnp.asarray(loss_mask),
                       rewards_B=jnp.asarray(b["rewards_B"]),
                       layout=Layout(completion_len=b["completion_BC"].shape[1],
                                     rows_per_prompt=rows_per_prompt, group_size=group_size))


class Side:
  """smjax's GRPO step for a saved model, compiled once (ahead of time) for the batch shape that
  both the fixed step batch and the sampler's rollouts have, and shared by both measurements."""

  def __init__(self, model_dir: str, batch_np: dict, *, group_size: int, lr: float,
               shared_prompt_rows: int = 1, packed: bool = False):
    import jax  # pylint: disable=import-outside-toplevel
    from smjax.flops import executable_flops  # pylint: disable=import-outside-toplevel
    from smjax.models import hf  # pylint: disable=import-outside-toplevel
    from smjax.models.transformer import Transformer  # pylint: disable=import-outside-toplevel
    from smjax.batch import check_layout, pack  # pylint: disable=import-outside-toplevel
    from smjax.train import steps  # pylint: disable=import-outside-toplevel
    from smjax.train.score import target_logprobs  # pylint: disable=import-outside-toplevel
    self.cfg, self.params = hf.load_params(model_dir)
    self.tx = _optimizer(lr)
    self.shared_prompt_rows = shared_prompt_rows
    self.packed = packed
    model = Transformer(self.cfg)
    grpo_cfg = steps.GRPOConfig(group_size=group_size, advantage_mode="grpo", eps_low=0.2,
                                eps_high=0.28, beta=0.0, aggregation="token_mean")
    step = steps.jit_step(steps.make_grpo_step(model, self.tx, grpo_cfg))
    # The completion fills the last C target columns (left-padded prompts), so the LM head runs on
    # those only (the batch's layout, checked here on the host).
    batch = sequence_batch(batch_np, shared_prompt_rows, group_size)
    check_layout(batch)
    # Behaviour log-probs of the same parameters: ratios start at exactly the on-policy 1, as the
    # peers' (TRL and Tunix take the detached current log-probs when iterating once per batch).
    self.batch = batch.replace(old_logp_BT=jax.jit(
        lambda p, b: target_logprobs(model, p, b))(self.params, batch))
    if packed:  # the completions as one stream without their padding
      self.batch = pack(self.batch, bucket=batch_np["completion_BC"].shape[1])
    t0 = time.perf_counter()
    # Kept for recompiling with other XLA options (benchmarks/step_xla_options.py).
    self.lowered = step.fn.lower(self.fresh_state(), self.batch)
    self.step = self.lowered.compile()
    self.compile_s = time.perf_counter() - t0
    # XLA's cost analysis of the very executable that is timed (what compiled_flops reports).
    self.flops = executable_flops(self.step)[0]

  def fresh_state(self):
    """A new train state from the loaded weights (copies: the step donates its state)."""
    import jax  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    from smjax.train import state as state_lib  # pylint: disable=import-outside-toplevel
    return state_lib.create_state(jax.tree.map(jnp.copy, self.params), self.tx)


def step_bench(side: Side, *, reps: int, warmup: int) -> dict:
  """Times smjax's compiled GRPO step on the fixed batch (module docstring)."""
  import jax  # pylint: disable=import-outside-toplevel
  holder = {"state": side.fresh_state()}

  def run():
    new_state, metrics = side.step(holder["state"], side.batch)
    jax.block_until_ready((new_state, metrics))
    holder["state"] = new_state
    return metrics

  t0 = time.perf_counter()
  first_metrics = run()
  first = time.perf_counter() - t0
  for _ in range(max(warmup - 1, 0)):
    run()
  faults = []
  out = common.summary(common.timed(run, reps, faults), faults)
  out.update(first_call_s=first, compile_s=side.compile_s, compiled_flops=side.flops,
             gflops_per_s=side.flops / out["median_s"] / 1e9,
             first_loss=float(first_metrics["loss"]),
             first_grad_norm=float(first_metrics["grad_norm"]),
             what="jit_step(make_grpo_step): forward over prompt+completion, LM head on the "
                  "completion positions (Layout.completion_len), GRPO loss from rewards (token_mean), "
                  "backward, global-norm clip 1.0, AdamW"
                  + (f"; each prompt's forward once for its {side.shared_prompt_rows} rows "
                     "(Layout.rows_per_prompt)" if side.shared_prompt_rows > 1 else "")
                  + ("; completions packed without their padding (smjax.batch.pack)"
                     if side.packed else ""))
  return out


def iteration_bench(side: Side, prompts: list[list[int]], *, group_size: int,
                    completion_len: int, prompt_bucket: int, reps: int, warmup: int,
                    seed: int) -> dict:
  """Times a full smjax GRPO iteration: sample, reward, batch, step (module docstring)."""
  import jax  # pylint: disable=import-outside-toplevel
  from smjax.rollout import Sampler  # pylint: disable=import-outside-toplevel
  from smjax.batch import rollout_batch  # pylint: disable=import-outside-toplevel
  sampler = Sampler(side.cfg, max_new_tokens=completion_len, eos_id=None, pad_id=common.PAD_ID,
                    prompt_buckets=(prompt_bucket,))
  holder = {"state": side.fresh_state(), "i": 0}
  rewards_seen = []

  def run():
    holder["i"] += 1
    res = sampler.generate(holder["state"].params, prompts, jax.random.key(seed + holder["i"]),
                           num_samples=group_size, temperature=1.0)
    completion = np.asarray(res.completion_BC)
    mask = np.asarray(res.completion_mask_BC).astype(bool)
    rewards = [common.reward_of_ids(row[m]) for row, m in zip(completion, mask)]
    batch = rollout_batch(res, rewards_B=rewards, share_prompt=side.shared_prompt_rows > 1)
    new_state, metrics = side.step(holder["state"], batch)
    jax.block_until_ready((new_state, metrics))
    holder["state"] = new_state
    rewards_seen.append(float(np.mean(rewards)))

  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  for _ in range(max(warmup - 1, 0)):
    run()
  faults = []
  out = common.summary(common.timed(run, reps, faults), faults)
  out.update(first_call_s=first, mean_reward=rewards_seen,
             what="Sampler.generate (prefill + while_loop decode, G samples per prompt, "
                  f"{completion_len} new tokens, no EOS) + host reward + rollout_batch + the "
                  "same compiled GRPO step")
  return out


# ---------------------------------------------------------------------------------- driver

def parse_args(description: str, peer: str, argv=None):
  import argparse  # pylint: disable=import-outside-toplevel
  ap = argparse.ArgumentParser(description=description)
  ap.add_argument("--size", default="small", choices=sorted(common.SIZES))
  ap.add_argument("--prompts", type=int, default=4, help="distinct prompts a step")
  ap.add_argument("--group-size", type=int, default=4, help="G samples per prompt")
  ap.add_argument("--prompt-len", type=int, nargs=2, default=(16, 32), help="min max")
  ap.add_argument("--completion-len", type=int, default=64)
  ap.add_argument("--reps", type=int, default=5, help="timed steps")
  ap.add_argument("--warmup", type=int, default=2, help="untimed steps (compiled ahead of time)")
  ap.add_argument("--iter-reps", type=int, default=3, help="timed sampling+update iterations")
  ap.add_argument("--iter-warmup", type=int, default=1)
  ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
  ap.add_argument("--lr", type=float, default=1e-6)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--threads", type=int, default=0,
                  help="CPUs for both sides (0: all this process may use)")
  ap.add_argument("--envs-dir", default="bench_results/envs",
                  help=f"where the peer venv ({peer}) is created; bench_results/ is git-ignored")
  ap.add_argument("--peer-timeout", type=float, default=3600.0, help="seconds")
  ap.add_argument("--skip-peer", action="store_true", help="smjax side only (smoke tests)")
  ap.add_argument("--peer-malloc", choices=("both", "default"), default="both",
                  help="both: run the peer as shipped, then again under the glibc malloc "
                       "settings of SMJAX_CPU_MALLOC=tuned (smjax.cpu_malloc.ENV), and print "
                       "both ratios; default: the first run only")
  ap.add_argument("--matmul-size", type=int, default=2048,
                  help="n of the [n, n] @ [n, n] f32 matmul whose rate is this machine's peak")
  ap.add_argument("--matmul-samples", type=int, default=10,
                  help="peak samples after each smjax round (before and after the peer)")
  ap.add_argument("--out", default=f"bench_results/grpo_step_vs_{peer}.json")
  return ap.parse_args(argv)


def roofline(*, step_flops: float, peak_flops_per_s: float, smjax_s: float,
             peer_s: float | None, goal: float,
             variants: dict[str, tuple[float, float]] | None = None) -> dict:
  """Where the step times sit against the machine's matmul peak (all rates of the same work:
  smjax's compiled step FLOPs, which the peer's step also does, the check of the first loss
  and gradient norm says so).

  `floor_s`: the step's FLOPs at the matmul peak, a practical lower bound on any implementation's
  step on this machine (the step's FLOPs are nearly all in matmuls, most of them smaller than the
  peak's, which run slower; elementwise work, the attention softmax and AdamW only add time).
  `goal_fraction_of_peak`: the share of the peak a step `goal` times faster than the peer would
  have to sustain; above 1 the goal cannot be met on this machine.

  `variants` = {name: (FLOPs, seconds)} of steps that do less work for the same update (the
  shared-prompt and packed steps): `<name>_step_flops`, `<name>_fraction_of_peak` (its own rate),
  and `<name>_goal_fraction_of_peak` (what its FLOPs would need at the goal)."""
  out = dict(step_flops=step_flops, peak_flops_per_s=peak_flops_per_s,
             floor_s=step_flops / peak_flops_per_s,
             smjax_fraction_of_peak=step_flops / smjax_s / peak_flops_per_s, goal=goal)
  if peer_s is not None:
    out.update(peer_fraction_of_peak=step_flops / peer_s / peak_flops_per_s,
               goal_step_s=peer_s / goal,
               goal_fraction_of_peak=step_flops * goal / peer_s / peak_flops_per_s)
  for name, (flops, seconds) in (variants or {}).items():
    out[f"{name}_step_flops"] = flops
    out[f"{name}_fraction_of_peak"] = flops / seconds / peak_flops_per_s
    if peer_s is not None:
      out[f"{name}_goal_fraction_of_peak"] = flops * goal / peer_s / peak_flops_per_s
  return out


# smjax's measurements (--modes), and the peer's ("step" or "iteration") each is compared with.
MODES = ("step", "step_shared_prompt", "step_packed", "iteration")
PEER_MODE = {"step": "step", "step_shared_prompt": "step", "step_packed": "step",
             "iteration": "iteration"}
STEP_SIDES = {"step": "plain", "step_shared_prompt": "shared", "step_packed": "packed"}


def _smjax_round(sides: dict, args, prompts, bucket: int, label: str, peak) -> dict:
  """Every smjax measurement of `args.modes` once (`sides`: STEP_SIDES' Sides; the
  compiled steps and the sampler are reused across rounds), then `args.matmul_samples` samples of
  the matmul peak (`peak`, train_mfu.MatmulPeak)."""
  import os  # pylint: disable=import-outside-toplevel
  ours = {"loadavg": os.getloadavg()}
  for mode, side in STEP_SIDES.items():
    if mode in args.modes:
      ours[mode] = s = step_bench(sides[side], reps=args.reps, warmup=args.warmup)
      print(f"  smjax {mode:18s} ({label}): {s['median_s'] * 1e3:8.1f} ms  "
            f"({s['compiled_flops'] / 1e9:.1f} GFLOP, {s['gflops_per_s']:.1f} GFLOP/s; compile "
            f"{s['compile_s']:.1f} s; {s['minor_faults_per_call']:.0f} page faults a step)")
  if "iteration" in args.modes:
    ours["iteration"] = s = iteration_bench(
        sides["shared"], prompts, group_size=args.group_size, completion_len=args.completion_len,
        prompt_bucket=bucket, reps=args.iter_reps, warmup=args.iter_warmup, seed=args.seed)
    print(f"  smjax {'iteration':18s} ({label}): {s['median_s'] * 1e3:8.1f} ms  (first call "
          f"{s['first_call_s']:.1f} s, the first round's incl. the sampler's compile)")
  peak.sample(args.matmul_samples)
  return ours


def compare(args, *, peer: str, requirements: list[str], peer_script: str,
            goal: float) -> dict:
  """Runs both sides on the same weights, batch and settings; prints and writes the ratios.

  smjax is measured before and again after the peer (a machine shared with other jobs drifts);
  each ratio is taken against the slower of smjax's two medians. The same machine's f32 matmul
  peak is sampled after each smjax round, and the step times are placed against it (`roofline`;
  `goal`: the step speedup over the peer the issue asks for). Raises RuntimeError (with the
  reason) when the peer cannot be installed or run."""
  import json  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import platform  # pylint: disable=import-outside-toplevel
  import tempfile  # pylint: disable=import-outside-toplevel
  threads = common.pin_threads(args.threads)  # before jax (and the peer) size their pools
  import jax  # pylint: disable=import-outside-toplevel
  print(f"CPU threads: both sides on the same {threads} cores {sorted(os.sched_getaffinity(0))} "
        f"(process affinity, inherited by the {peer} subprocess, whose torch, if any, runs "
        f"torch.set_num_threads({threads})); jax {jax.__version__}; load average "
        f"{os.getloadavg()[0]:.2f}")
  vocab = common.SIZES[args.size][0]
  G, C = args.group_size, args.completion_len
  results = dict(config=vars(args), threads=threads, platform=platform.platform(),
                 jax=jax.__version__, peer=peer, peer_requirements=requirements,
                 smjax_malloc=cpu_malloc.STATUS)
  print(f"smjax's malloc: {cpu_malloc.STATUS} (smjax.cpu_malloc)")
  with tempfile.TemporaryDirectory() as work:
    model_dir = os.path.join(work, "model")
    results["params"] = n_params = build_hf_model(args.size, model_dir, seed=args.seed)
    bucket = common.prompt_bucket(args.prompt_len[1])
    batch = common.make_step_batch(prompts=args.prompts, group_size=G,
                                   prompt_len=tuple(args.prompt_len), completion_len=C,
                                   vocab=vocab, seed=args.seed, pad_to=bucket)
    batch_npz = os.path.join(work, "batch.npz")
    np.savez(batch_npz, **batch)
    prompts = common.make_prompts(prompts=args.prompts, prompt_len=tuple(args.prompt_len),
                                  vocab=vocab, seed=args.seed)
    B, P = batch["prompt_BP"].shape
    print(f"model: Qwen3-style '{args.size}', {n_params / 1e6:.2f}M params, vocab {vocab}, f32, "
          f"random weights shared (HF save_pretrained -> smjax.models.hf.load_params / {peer})")
    print(f"batch: {args.prompts} prompts x G={G} = {B} rows; prompts {args.prompt_len[0]}-"
          f"{args.prompt_len[1]} tokens (left-padded to {P}), completions {C} tokens "
          f"(step batch: {int(batch['completion_mask_BC'].sum())} real completion tokens)")

    sides = {}
    if "step" in args.modes:
      sides["plain"] = Side(model_dir, batch, group_size=G, lr=args.lr)
    if {"step_shared_prompt", "iteration"} & set(args.modes):
      sides["shared"] = Side(model_dir, batch, group_size=G, lr=args.lr, shared_prompt_rows=G)
    if "step_packed" in args.modes:
      sides["packed"] = Side(model_dir, batch, group_size=G, lr=args.lr, shared_prompt_rows=G,
                             packed=True)
    from train_mfu import MatmulPeak  # pylint: disable=import-outside-toplevel
    peak = MatmulPeak(args.matmul_size)
    results["smjax"] = ours = _smjax_round(sides, args, prompts, bucket, "before", peak)
    if args.skip_peer:
      print(f"--skip-peer: {peer} side not run")
    else:
      python = common.ensure_venv(os.path.join(args.envs_dir, peer), requirements)
      spec = dict(size=args.size, model_dir=model_dir, batch_npz=batch_npz, prompts=prompts,
                  vocab=vocab, group_size=G, completion_len=C, prompt_len=list(args.prompt_len),
                  lr=args.lr, seed=args.seed, reps=args.reps, warmup=args.warmup,
                  iter_reps=args.iter_reps, iter_warmup=args.iter_warmup,
                  modes=sorted({PEER_MODE[m] for m in args.modes}))
      # The peer as users run it (glibc's default malloc), then, with --peer-malloc both, under
      # the settings SMJAX_CPU_MALLOC=tuned gives smjax's own process (cpu_malloc.ENV).
      runs = {peer: None}
      inherited = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
      if inherited:
        print(f"note: this environment sets {inherited}; the peer's first run inherits them")
      if args.peer_malloc == "both":
        runs[f"{peer}_tuned_malloc"] = cpu_malloc.ENV
      for key, extra_env in runs.items():
        load = os.getloadavg()
        results[key] = dict(
            common.run_peer(python, os.path.join(os.path.dirname(__file__), peer_script), spec,
                            work, timeout_s=args.peer_timeout, extra_env=extra_env),
            loadavg=load, malloc=dict(inherited, **(extra_env or {})) or "glibc defaults")
      theirs = results[peer]
      results["smjax_after_peer"] = after = _smjax_round(sides, args, prompts, bucket, "after",
                                                         peak)
      for key in runs:
        speedups = results["speedup" + key[len(peer):]] = {}
        label = peer if key == peer else f"{peer} (tuned malloc)"
        for mode in args.modes:
          t = results[key][PEER_MODE[mode]]["median_s"]
          o = max(ours[mode]["median_s"], after[mode]["median_s"])
          speedups[mode] = t / o
          faults = results[key][PEER_MODE[mode]].get("minor_faults_per_call")
          print(f"  {label} {PEER_MODE[mode]:9s} {t * 1e3:8.1f} ms"
                + ("" if faults is None else f" ({faults:.0f} page faults a call)")
                + f" -> smjax {mode} is {t / o:.2f}x faster (against smjax's slower round, "
                f"{o * 1e3:.1f} ms)"
                + (f"\n      {peer}: {theirs[PEER_MODE[mode]]['what']}" if key == peer else ""))
      # Same weights, batch and advantages, ratio 1 on both sides: the first step's loss and
      # pre-clip gradient norm must agree (to float32 rounding) if both compute the same update.
      for mode in STEP_SIDES:
        if mode not in args.modes:
          continue
        check = {}
        for key in ("first_loss", "first_grad_norm"):
          a, b = ours[mode][key], theirs["step"][key]
          check[key] = dict(smjax=a, peer=b, rel_diff=abs(a - b) / max(abs(b), 1e-30))
        results.setdefault("same_computation_check", {})[mode] = check
        print(f"  same computation check ({mode}), first step: loss "
              f"{check['first_loss']['smjax']:.7g} (smjax) / {check['first_loss']['peer']:.7g} "
              f"({peer}); pre-clip gradient norm {check['first_grad_norm']['smjax']:.7g} / "
              f"{check['first_grad_norm']['peer']:.7g}; relative differences "
              f"{check['first_loss']['rel_diff']:.1e}, {check['first_grad_norm']['rel_diff']:.1e}")
    results["matmul_peak"] = peak.record()
    if "step" in args.modes:
      rounds = (ours, results.get("smjax_after_peer", ours))
      slow = lambda mode: max(r[mode]["median_s"] for r in rounds)
      peer_s = results[peer]["step"]["median_s"] if peer in results else None
      variants = {STEP_SIDES[m]: (sides[STEP_SIDES[m]].flops, slow(m))
                  for m in ("step_shared_prompt", "step_packed") if m in args.modes}
      results["roofline"] = r = roofline(step_flops=sides["plain"].flops,
                                         peak_flops_per_s=results["matmul_peak"]["flops_per_s"],
                                         smjax_s=slow("step"), peer_s=peer_s, goal=goal,
                                         variants=variants)
      print(f"  roofline: matmul peak {r['peak_flops_per_s'] / 1e9:.1f} GFLOP/s "
            f"([{args.matmul_size}]^2 f32, this run); the step's {r['step_flops'] / 1e9:.1f} GFLOP "
            f"at that peak take {r['floor_s'] * 1e3:.1f} ms; smjax runs at "
            f"{r['smjax_fraction_of_peak']:.0%} of it"
            + ("" if peer_s is None else
               f", {peer} at {r['peer_fraction_of_peak']:.0%}; a step {goal:g}x faster than "
               f"{peer} ({r['goal_step_s'] * 1e3:.1f} ms) would need "
               f"{r['goal_fraction_of_peak']:.0%}"))
      for name in variants:
        print(f"  roofline, {name} step: {r[f'{name}_step_flops'] / 1e9:.1f} GFLOP for the same "
              f"update, run at {r[f'{name}_fraction_of_peak']:.0%} of the peak"
              + ("" if peer_s is None else
                 f"; {goal:g}x {peer} would need {r[f'{name}_goal_fraction_of_peak']:.0%}"))
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(results, f, indent=2)
  print(f"wrote {args.out}")
  return results
