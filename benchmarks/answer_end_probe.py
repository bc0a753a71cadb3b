"""Where does each model end an answer? At the end of every gold chain of a study seed's held-out
prompts (prompt, solution, answer), the probability that each model gives the end of sequence and
each other next token: the student's base, the external teacher (verbose style: the problem and
answer restated on a new line after the solution) and the control teacher (plain chains).

  .venv/bin/python benchmarks/answer_end_probe.py runs/regimes/interfering_even --seeds 0 1 2 \
      --prompts 64 --out docs/regimes/interfering_even_answer_end.json

On-policy distillation scores the student's own tokens by the teacher's log-probabilities, so a
teacher that puts no mass where the student ends (EOS) pushes the student's EOS down with nothing
the student already says to move to; this measures that mismatch. Prints, per model and domain,
the median log10 P(EOS) and log10 P(newline) at the answer's end and how often each is the most
likely token; writes the same as JSON with the seed, prompts and models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {"student base": "base", "external teacher": "external_teacher",
          "control teacher": "control_teacher"}


def _seed(workdir: str, config, seed: int, prompts: int) -> dict:
  """{model label: {"phase", "domains": {domain: figures}}} for one seed, printed as it goes."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  import numpy as np
  from smjax.models.presets import get_preset
  from smjax.models.transformer import Transformer, init_params
  from smjax.study import store
  from smjax.study.shared import seed_shared

  shared = seed_shared(config, seed)
  tok = shared.tokenizer
  newline = tok.encode("\n")[0]
  presets = {"base": shared.model_cfg, "control_teacher": shared.model_cfg,
             "external_teacher": get_preset(config.external.teacher_preset)}
  models = {}
  for label, phase in MODELS.items():
    final = os.path.join(workdir, f"seed_{seed}", phase, "final")
    if not os.path.isdir(final):
      raise SystemExit(f"{final}: no finished {phase} phase in seed {seed}")
    cfg = presets[phase]
    template = jax.eval_shape(lambda c=cfg: init_params(c, jax.random.key(0)))
    params = store.load_params(final, template, f"phase {phase!r} of seed {seed}")
    apply = jax.jit(Transformer(cfg).apply)
    rows = {}
    for domain, examples in shared.heldout.items():
      # One call a domain: the chains right-padded (a causal model's last real position does
      # not see the padding), read at each chain's last token.
      seqs = [[tok.bos_id] + tok.encode(ex.prompt + ex.solution) for ex in examples[:prompts]]
      ids = np.full((len(seqs), max(map(len, seqs))), tok.pad_id, np.int32)
      for i, q in enumerate(seqs):
        ids[i, :len(q)] = q
      logits, _ = apply({"params": params}, jnp.asarray(ids),
                        mask_BT=jnp.asarray(ids != tok.pad_id))
      last = np.array([len(q) - 1 for q in seqs])
      lp = np.asarray(jax.nn.log_softmax(logits[np.arange(len(seqs)), last])) / np.log(10)
      top = lp.argmax(-1)
      r = rows[domain] = {"log10_p_eos_median": float(np.median(lp[:, tok.eos_id])),
                          "log10_p_newline_median": float(np.median(lp[:, newline])),
                          "eos_most_likely": float(np.mean(top == tok.eos_id)),
                          "newline_most_likely": float(np.mean(top == newline))}
      print(f"seed {seed} {label:17s} {domain:8s} log10 P(EOS) {r['log10_p_eos_median']:7.2f}  "
            f"log10 P(newline) {r['log10_p_newline_median']:7.2f}  most likely: EOS "
            f"{r['eos_most_likely']:.0%}, newline {r['newline_most_likely']:.0%}")
    models[label] = {"phase": phase, "domains": rows}
  return models


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("workdir", help="a study's workdir (its config.json and seed_<k>/ phases)")
  ap.add_argument("--seeds", type=int, nargs="+", default=[0])
  ap.add_argument("--prompts", type=int, default=64, help="held-out prompts per domain")
  ap.add_argument("--out", default="", help="JSON file to write (default: print only)")
  args = ap.parse_args(argv)
  import ml_collections as mlc  # pylint: disable=import-outside-toplevel
  from smjax.json_io import read_json  # pylint: disable=import-outside-toplevel
  config = mlc.ConfigDict(read_json(os.path.join(args.workdir, "config.json"),
                                    "give a study's workdir", keys=("model",)))
  out = {"workdir": args.workdir, "prompts": args.prompts,
         "seeds": {str(s): _seed(args.workdir, config, s, args.prompts) for s in args.seeds}}
  if args.out:
    with open(args.out, "w") as f:
      json.dump(out, f, indent=1)
    print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
