"""Learning tests of the GRPO and OPD machinery (fixed seeds, bounded steps).

The target behaviour is deliberately simple — "the completion starts with the digit 7", rewarded by
a verifier — so that a randomly initialised toy model can learn it in tens of steps on a CPU:
GRPO must raise its held-out reward from ~0 to a stated margin, then OPD from that GRPO-improved
expert into a fresh student must recover most of the expert's held-out accuracy. (On the real toy
domains the study's short RL runs do not yet improve held-out accuracy; see README.)
"""

import jax
import jax.numpy as jnp
import pytest

from smjax.domains import get_domain
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer
from smjax.models.transformer import Transformer, init_params
from smjax.rl.teachers import Teacher, TeacherRouter
from smjax.rollout import Sampler
from smjax.train import state as state_lib
from smjax.train import steps as steps_lib
from smjax.train.evaluate import Evaluator
from smjax.train.loop import RLLoopConfig, RLRun

TOK = CharTokenizer()
CFG = get_preset("toy-tiny")
MODEL = Transformer(CFG)
MATH = get_domain("math")


def starts_with_7(rows, texts):
  return [float(t.startswith("7")) for t in texts]


def _prompts(seed):
  i = 0
  while True:
    yield MATH.generate("train", 16, seed=seed * 100_000 + i)
    i += 1


@pytest.fixture(scope="module")
def setup():
  sampler = Sampler(CFG, max_new_tokens=4, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
  heldout = {"math": MATH.generate("test", 64, seed=3)}
  evaluator = Evaluator(sampler, TOK, heldout, starts_with_7, batch_size=64)
  return sampler, evaluator


def _run(algo, params, sampler, evaluator, steps, lr, router=None):
  tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=lr))
  if algo == "grpo":
    step = steps_lib.jit_step(steps_lib.make_grpo_step(
        MODEL, tx, steps_lib.GRPOConfig(group_size=8, impl="xla")))
  else:
    step = steps_lib.jit_step(steps_lib.make_opd_step(
        MODEL, tx, steps_lib.OPDConfig(objective="sampled", impl="xla")))
  loop = RLLoopConfig(steps=steps, prompts_per_step=16, samples_per_prompt=8 if algo == "grpo" else 4,
                      max_new_tokens=4, eval_every_steps=steps, progress=False, seed=1)
  run = RLRun(name=algo, algo=algo, loop=loop, step=step, sampler=sampler, tokenizer=TOK,
              prompts_iter=_prompts(7 if algo == "grpo" else 8), verify=starts_with_7,
              evaluator=evaluator, router=router)
  state = state_lib.create_state(jax.tree.map(jnp.copy, params), tx)
  return run.run(state)


@pytest.fixture(scope="module")
def expert(setup):
  sampler, evaluator = setup
  base = init_params(CFG, jax.random.key(0))
  return base, _run("grpo", base, sampler, evaluator, steps=60, lr=3e-3)


def test_grpo_raises_heldout_reward(expert):
  _, result = expert
  before, after = result.curve[0]["mean"], result.curve[-1]["mean"]
  assert before < 0.1, before
  assert after >= 0.8, (before, after)  # the margin this test states: from < 10 % to >= 80 %
  assert result.ledger.by_phase()["train/policy"] > 0


def test_opd_from_grpo_expert_recovers_most_of_its_accuracy(setup, expert):
  sampler, evaluator = setup
  base, grpo_result = expert
  teacher_acc = grpo_result.curve[-1]["mean"]
  student = init_params(CFG, jax.random.key(1))
  router = TeacherRouter(CFG, [Teacher("expert", CFG, grpo_result.state.params, ("math",))])
  result = _run("opd", student, sampler, evaluator, steps=60, lr=3e-3, router=router)
  before, after = result.curve[0]["mean"], result.curve[-1]["mean"]
  assert before < 0.1 and after >= 0.8 * teacher_acc, (before, after, teacher_acc)
  assert result.ledger.by_phase()["train/teacher"] > 0
