"""smjax domains as seqio Tasks, for T5X / seqio users (`pip install smjax[seqio]`).

    import smjax.domains.seqio_tasks  # registers smjax_math, _code, _logic, _strings
    task = seqio.get_mixture_or_task("smjax_math")

Each task has "inputs" (the prompt) and "targets" (the gold solution), tokenized with a byte
vocabulary by default (the char-level models' alphabet is ASCII), splits "train" and "test"
("validation" is an alias of "test"), and a "reward" metric: the mean of the domain's `verify`
over the predictions. Other domains (rg:..., jsonl_...:...) register with `register_tasks`.
seqio and TensorFlow are imported only inside these functions; importing this module registers
the toy tasks when seqio is installed and does nothing otherwise.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any, Sequence

from smjax.domains import TOY_DOMAINS, Example, get_domain

DEFAULT_SIZE = 4096
_SPLITS = {"train": "train", "test": "test", "validation": "test"}


def task_name(domain_name: str, prefix: str = "smjax_") -> str:
  """seqio-safe task name for a registry name ("rg:chain_sum" -> "smjax_rg_chain_sum")."""
  safe = "".join(ch if ch.isalnum() else "_" for ch in domain_name)
  return prefix + safe


def register_tasks(domains: Sequence[str] = TOY_DOMAINS, *, prefix: str = "smjax_",
                   size: int = DEFAULT_SIZE, difficulty: int | None = None,
                   vocabulary: Any = None, domain_kwargs: dict | None = None,
                   overwrite: bool = True) -> list[str]:
  """Registers one seqio Task per domain name; returns the task names."""
  import seqio  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  vocabulary = vocabulary or seqio.ByteVocabulary()
  names = []
  for name in domains:
    dom = get_domain(name, **(domain_kwargs or {}).get(name, {}))
    tname = task_name(name, prefix)
    if tname in seqio.TaskRegistry.names():
      if not overwrite:
        raise ValueError(f"seqio task {tname!r} is already registered")
      seqio.TaskRegistry.remove(tname)

    def dataset_fn(split, shuffle_files=False, seed=None, _dom=dom):
      del shuffle_files  # examples are generated, not read from files
      if split not in _SPLITS:
        raise ValueError(f"split={split!r} must be one of {sorted(_SPLITS)}")
      exs = _dom.generate(_SPLITS[split], size, seed or 0, difficulty)

      def gen():
        for e in exs:
          yield {"inputs": e.prompt, "targets": e.solution,
                 "reference": json.dumps(e.reference, sort_keys=True)}
      spec = tf.TensorSpec((), tf.string)
      return tf.data.Dataset.from_generator(
          gen, output_signature={"inputs": spec, "targets": spec, "reference": spec})

    def postprocess(output, example=None, is_target=False, _dom=dom):
      if not is_target:
        return output
      ref = example["reference"]
      return {"prompt": example["inputs_pretokenized"],
              "reference": ref.decode() if isinstance(ref, bytes) else ref}

    def reward(targets, predictions, _dom=dom):
      exs = [Example(prompt=_b2s(t["prompt"]), reference=json.loads(t["reference"]),
                     solution="", domain=_dom.name) for t in targets]
      rewards = _dom.verify_many(exs, [_b2s(p) for p in predictions])
      return {"reward": sum(rewards) / max(len(rewards), 1)}

    seqio.TaskRegistry.add(
        tname,
        source=seqio.FunctionDataSource(dataset_fn, splits=tuple(_SPLITS)),
        output_features={"inputs": seqio.Feature(vocabulary, add_eos=False),
                         "targets": seqio.Feature(vocabulary, add_eos=True)},
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
        postprocess_fn=postprocess,
        metric_fns=[reward])
    names.append(tname)
  return names


def _b2s(x: Any) -> str:
  return x.decode() if isinstance(x, bytes) else str(x)


if importlib.util.find_spec("seqio") is not None:
  register_tasks()
