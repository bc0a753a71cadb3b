"""A small checkpointed SFT run for the preemption tests: run it, interrupt it, resume it.

    python tests/ckpt_train_script.py --workdir DIR --steps 40 --checkpoint_every 5

Trains the toy-tiny model with the real SFT step on a grain pipeline of `a+b=c` examples. Every
source of state a resumed run needs is exercised: the TrainState (AdamW moments, schedule count),
a jax PRNG key (token dropout on the loss mask), a numpy Generator (row order in each batch), the
grain iterator state, a FLOP ledger and the metric history (the accuracy-vs-FLOPs curve so far).

Protocol (what tests/test_checkpoint.py relies on; a GRPO/OPD script that follows it can reuse the
same tests): stdout lines `fresh start` or `resumed from step S`, then `step I ...` after each
step (flushed), and `preempted at step I` before a clean exit 0 on SIGTERM; a finished run writes
`<workdir>/final.json` (step, history, ledger) and `<workdir>/final_state.npz` (every state leaf).

`--compile_cache DIR` turns on jax's persistent compilation cache so repeated runs in the tests
load the same executables instead of recompiling (a resumed run then uses the very same programs).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import numpy as np

from smjax.checkpoint import Checkpointer
from smjax.preemption import PreemptionGuard
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer
from smjax.models.transformer import Transformer
from smjax.train import state as state_lib
from smjax.batch import SequenceBatch
from smjax.train.steps import jit_step, make_sft_step


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--checkpoint_every", type=int, default=5)
  p.add_argument("--max_to_keep", type=int, default=2)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--seq_len", type=int, default=12)
  p.add_argument("--learning_rate", type=float, default=3e-3)
  p.add_argument("--sync_save", action="store_true", help="synchronous orbax saves")
  p.add_argument("--step_sleep", type=float, default=0.0,
                 help="seconds to sleep after each step (gives a test time to interrupt)")
  p.add_argument("--compile_cache", default=None)
  return p.parse_args(argv)


def run_config(args) -> dict:
  """The run's config as saved in every checkpoint (workdir etc. are run-neutral)."""
  return {"model": "toy-tiny", "seed": args.seed, "batch_size": args.batch_size,
          "seq_len": args.seq_len, "total_steps": args.steps,
          "optimizer": {"learning_rate": args.learning_rate, "warmup_steps": 5,
                        "schedule": "cosine"},
          "token_dropout": 0.1, "workdir": args.workdir,
          "checkpoint_every": args.checkpoint_every}


def make_dataset(seed: int, batch_size: int, seq_len: int):
  """Shuffled `a+b=c` examples as a grain iterator with get_state()/set_state()."""
  tok = CharTokenizer()

  def example(index):
    a, b = np.random.default_rng([seed, int(index)]).integers(0, 100, size=2)
    prompt, answer = tok.encode(f"{a}+{b}="), tok.encode(f"{a + b}")
    ids = [tok.bos_id] + prompt + answer + [tok.eos_id]
    tokens = np.full((seq_len,), tok.pad_id, np.int32)
    tokens[:len(ids)] = ids
    loss_mask = np.zeros((seq_len - 1,), bool)
    loss_mask[len(prompt):len(ids) - 1] = True  # targets tokens[1:]: the answer and the eos
    return {"tokens": tokens, "loss_mask": loss_mask}

  ds = grain.MapDataset.range(1 << 20).shuffle(seed=seed).map(example).batch(
      batch_size, drop_remainder=True)
  return iter(ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.compile_cache:  # set before the first compile
    jax.config.update("jax_compilation_cache_dir", args.compile_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

  cfg = run_config(args)
  B, S = args.batch_size, args.seq_len
  model = Transformer(get_preset("toy-tiny"))
  opt_cfg = state_lib.OptimizerConfig(total_steps=args.steps, **cfg["optimizer"])
  tx = state_lib.make_optimizer(opt_cfg)
  # Parameters drawn on the host from the seed (spares compiling model.init: ~40% of a cold start).
  abstract = jax.eval_shape(lambda: nn.unbox(model.init(
      jax.random.key(0), jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32))["params"]))
  init_rng = np.random.default_rng(args.seed)
  params = jax.tree_util.tree_map_with_path(
      lambda path, a: np.ones(a.shape, a.dtype) if "scale" in jax.tree_util.keystr(path)
      else (init_rng.standard_normal(a.shape) / np.sqrt(a.shape[0])).astype(a.dtype), abstract)
  state = jax.jit(lambda p: state_lib.create_state(p, tx))(params)

  @jax.jit
  def make_batch(key, tokens_BS, loss_mask_BT):
    key, sub = jax.random.split(key)
    keep_BT = jax.random.bernoulli(sub, 1.0 - cfg["token_dropout"], loss_mask_BT.shape)
    positions_BS = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    return key, SequenceBatch(tokens_BS, positions_BS, tokens_BS != CharTokenizer.pad_id,
                              loss_mask_BT & keep_BT)

  key = jax.random.key(args.seed + 1)
  _, batch_shape = jax.eval_shape(make_batch, key, jax.ShapeDtypeStruct((B, S), jnp.int32),
                                  jax.ShapeDtypeStruct((B, S - 1), jnp.bool_))
  step_fn = jit_step(make_sft_step(model, tx)).fn.lower(state, batch_shape).compile()
  cost = step_fn.cost_analysis()
  flops_per_step = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])

  ckpt = Checkpointer(args.workdir, max_to_keep=args.max_to_keep, keep_best=True,
                      async_save=not args.sync_save, config=cfg)
  it = make_dataset(args.seed, B, S)
  host_rng = np.random.default_rng(args.seed + 2)
  ledger = {"train/policy": {"flops": 0.0, "calls": 0}}
  history: list[list[float]] = []
  step = 0
  restored = ckpt.restore_latest(state)
  if restored is None:
    print("fresh start", flush=True)
  else:
    state, key, host_rng, step = restored.state, restored.rng, restored.host_rng, restored.step
    it.set_state(restored.data_state)
    ledger, history = restored.ledger, restored.extra["history"]
    print(f"resumed from step {step}", flush=True)

  with PreemptionGuard() as guard:
    while step < args.steps:
      batch_np = next(it)
      rows = host_rng.permutation(B)
      key, batch = make_batch(key, batch_np["tokens"][rows], batch_np["loss_mask"][rows])
      state, metrics = step_fn(state, batch)
      step += 1
      metrics = jax.device_get(metrics)
      ledger["train/policy"]["flops"] += flops_per_step
      ledger["train/policy"]["calls"] += 1
      history.append([step, float(metrics["loss"]), float(metrics["token_accuracy"]),
                      ledger["train/policy"]["flops"]])
      stop = guard.should_stop()
      if stop or step % args.checkpoint_every == 0 or step == args.steps:
        recent = [h[2] for h in history[-args.checkpoint_every:]]
        ckpt.save(step, state, rng=key, host_rng=host_rng, data_state=it.get_state(),
                  ledger=ledger, extra={"history": history}, metric=float(np.mean(recent)))
      # Printed after an (async) save returned: a kill right after it can land mid-write.
      print(f"step {step} loss {float(metrics['loss']):.4f}", flush=True)
      if args.step_sleep:
        time.sleep(args.step_sleep)
      if stop:
        ckpt.close()
        print(f"preempted at step {step}", flush=True)
        return 0
  ckpt.close()

  leaves = jax.tree_util.tree_flatten_with_path(jax.device_get(state))[0]
  np.savez(os.path.join(args.workdir, "final_state.npz"),
           **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves})
  with open(os.path.join(args.workdir, "final.json"), "w") as f:
    json.dump({"step": step, "history": history, "ledger": ledger}, f)
  print(f"done step {step}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
