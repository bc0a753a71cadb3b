"""seqio Tasks for the domains. Runs only where the optional extra is installed
(`pip install smjax[seqio]`); it is skipped otherwise, and only this test may be."""

import pytest

seqio = pytest.importorskip("seqio")

from smjax.domains import get_domain  # pylint: disable=wrong-import-position
from smjax.domains import seqio_tasks  # pylint: disable=wrong-import-position


def test_toy_tasks_registered_on_import():
  for name in ("math", "code", "logic", "strings"):
    assert seqio_tasks.task_name(name) in seqio.TaskRegistry.names()
  assert seqio_tasks.task_name("rg:chain_sum") == "smjax_rg_chain_sum"


def test_task_yields_domain_examples_and_scores_rewards():
  (name,) = seqio_tasks.register_tasks(["math"], prefix="t_", size=8, difficulty=1)
  task = seqio.get_mixture_or_task(name)
  vocab = task.output_features["inputs"].vocabulary
  ds = task.get_dataset({"inputs": 16, "targets": 8}, split="validation", shuffle=False)
  got = [(vocab.decode(list(x["inputs"])), vocab.decode(list(x["targets"]))) for x in
         ds.as_numpy_iterator()]
  want = [(e.prompt, e.solution) for e in get_domain("math", difficulty=1).generate("test", 8, 0)]
  assert got == want
  raw = list(task.source.get_dataset(split="test", shuffle=False).as_numpy_iterator())
  targets = [task.postprocess_fn(x["targets"], example={**x, "inputs_pretokenized": x["inputs"]},
                                 is_target=True) for x in raw]
  (metric,) = task.metric_fns
  assert metric(targets, [s for _, s in want]) == {"reward": 1.0}
  assert metric(targets, ["x"] * 8) == {"reward": 0.0}


def test_code_task_metric_runs_sandbox():
  (name,) = seqio_tasks.register_tasks(["code"], prefix="t_", size=4)
  task = seqio.get_mixture_or_task(name)
  raw = list(task.source.get_dataset(split="train", shuffle=False).as_numpy_iterator())
  targets = [task.postprocess_fn(x["targets"], example={**x, "inputs_pretokenized": x["inputs"]},
                                 is_target=True) for x in raw]
  (metric,) = task.metric_fns
  assert metric(targets, [x["targets"].decode() for x in raw]) == {"reward": 1.0}
