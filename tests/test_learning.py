"""Learning tests of GRPO and OPD on a real toy domain (fixed seeds, bounded steps).

Toy `math` at difficulty 0 (single-digit a+b, scored numerically by the domain's verifier; the
held-out operand pairs are never trained on). A tiny char model is weakly warmed up with 60 SFT
steps (~40% held-out greedy pass@1 on this CPU). Then:
- GRPO (150 steps, 16 prompts x 8) must raise the held-out *sampled* accuracy by at least 5 points;
- full-vocabulary OPD (200 steps) from that GRPO expert into the warmed-up base student must
  bring the student's reverse KL to the expert (on the student's own held-out samples) below two
  thirds of where it started, recover at least half of the expert's sampled-accuracy gain, and
  count its teacher FLOPs.

Sampled accuracy: the fraction correct of 64 temperature-1 samples of each of the 20 distinct
held-out prompts (1,280 samples; what GRPO optimises). Greedy pass@1 on so few distinct prompts
moves in 5-point steps and swings with the trajectory (a one-ulp change in AdamW's rounding once
moved it from 60% to 47% after 150 GRPO steps). With 16 samples a prompt (320 samples) the
student's gain over the base was itself within about two standard errors, and the recovered share
of this test's seed read 44% where 64 samples read 66% (another loop seed: 82% and 68%); at 64
samples the experts gain 12 and 16 points. After 100 OPD steps the recovered share still moved
with the trajectory (41% to 95% between loop seeds, expert seeds and CPUs: a threshold of one
half cannot be held there); after 200 it read 99% to 112% on four expert/loop seed pairs, with
the reverse KL at 20% to 51% of its start. A learning rate of 1e-3 was worse, not faster: the KL
rose above its start on one seed.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from smjax.domains import get_domain
from smjax.ledger import FlopLedger
from smjax.models.presets import get_preset
from smjax.models.tokenizer import CharTokenizer
from smjax.models.transformer import Transformer, init_params
from smjax.rewards.verify import verify_batch
from smjax.batch import decode_completions, encode_prompt
from smjax.rl.opd import full_vocab_kl
from smjax.rollout import Sampler, full_sequence
from smjax.train import state as state_lib
from smjax.train import steps as steps_lib
from smjax.train.evaluate import Evaluator
from smjax.train.loop import RLLoopConfig, grpo_batch, opd_batch, run_rl, run_sft
from smjax.train.teachers import Teacher, TeacherRouter

TOK = CharTokenizer()
CFG = get_preset("toy-tiny")
MODEL = Transformer(CFG)
MATH = get_domain("math", difficulty=0)
MAX_NEW = 5


HELDOUT = MATH.generate("test", 128, seed=3)
DISTINCT = list({e.prompt: e for e in HELDOUT}.values())  # 20 distinct operand pairs
SAMPLES = 64


def verify(rows, texts):
  return verify_batch(rows, texts, domains={"math": MATH})


def reverse_kl_to(sampler, student, teacher) -> float:
  """Mean per-token full-vocabulary KL(student || teacher) over 16 temperature-1 samples of the
  student on each distinct held-out prompt (what OPD minimises, on prompts it never trained on)."""
  prompts = [encode_prompt(TOK, e.prompt) for e in DISTINCT]
  seq = full_sequence(sampler.generate(student, prompts, jax.random.key(5), num_samples=16,
                                       temperature=1.0))
  return float(_mean_kl(student, teacher, seq))


@jax.jit
def _mean_kl(student, teacher, seq):
  logits = [MODEL.apply({"params": p}, seq.tokens_BS, seq.positions_BS, seq.mask_BS)[0]
            for p in (student, teacher)]
  kl_BT = full_vocab_kl(logits[0][:, :-1], logits[1][:, :-1])
  mask_BT = seq.loss_mask_BS[:, 1:]
  return jnp.sum(kl_BT * mask_BT) / jnp.sum(mask_BT)


def sampled_accuracy(sampler, params) -> float:
  """Fraction correct of SAMPLES temperature-1 completions of each distinct held-out prompt."""
  prompts = [encode_prompt(TOK, e.prompt) for e in DISTINCT]
  res = sampler.generate(params, prompts, jax.random.key(0), num_samples=SAMPLES,
                         temperature=1.0)
  rows = [e for e in DISTINCT for _ in range(SAMPLES)]
  return float(np.mean(np.asarray(verify(rows, decode_completions(TOK, res))) >= 1.0))


def _stream(seed, n):
  for i in itertools.count():
    yield MATH.generate("train", n, seed=seed * 100_000 + i)


@pytest.fixture(scope="module")
def setup():
  sampler = Sampler(CFG, max_new_tokens=MAX_NEW, eos_id=TOK.eos_id, pad_id=TOK.pad_id)
  # Greedy pass@1 (one sample at temperature 0), the measure these thresholds were set on.
  evaluator = Evaluator(sampler, TOK, {"math": HELDOUT}, verify, batch_size=128, samples=1,
                        temperature=0.0, greedy=False)
  return sampler, evaluator


@pytest.fixture(scope="module")
def base(setup):
  """The weakly warmed-up student: 60 SFT steps on gold solutions."""
  _, evaluator = setup
  tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=3e-3, warmup_steps=10))
  step = steps_lib.jit_step(steps_lib.make_sft_step(MODEL, tx))
  state = state_lib.create_state(init_params(CFG, jax.random.key(0)), tx)
  state, _ = run_sft(phase="base/sft", state=state, step=step, examples_iter=_stream(1, 64),
                     tokenizer=TOK, seq_len=16, num_steps=60, ledger=FlopLedger(), progress=False)
  fields, _ = evaluator(state.params)
  return state.params, fields["accuracy"]["math"]


def _run(algo, params, sampler, evaluator, *, steps, router=None):
  tx = state_lib.make_optimizer(state_lib.OptimizerConfig(learning_rate=3e-4))
  if algo == "grpo":
    step = steps_lib.jit_step(steps_lib.make_grpo_step(
        MODEL, tx, steps_lib.GRPOConfig(group_size=8, impl="xla")))
  else:
    step = steps_lib.jit_step(steps_lib.make_opd_step(
        MODEL, tx, steps_lib.OPDConfig(objective="full_vocab", impl="xla")))
  loop = RLLoopConfig(steps=steps, samples_per_prompt=8 if algo == "grpo" else 4,
                      eval_every_steps=steps, progress=False, seed=1 if algo == "grpo" else 2)
  make_batch = grpo_batch if algo == "grpo" else functools.partial(opd_batch, router=router)
  return run_rl(state_lib.create_state(jax.tree.map(jnp.copy, params), tx), name=algo,
                loop=loop, step=step, make_batch=make_batch, sampler=sampler, tokenizer=TOK,
                prompts=_stream(7 if algo == "grpo" else 8, 16), verify=verify,
                evaluator=evaluator)


@pytest.fixture(scope="module")
def expert(setup, base):
  sampler, evaluator = setup
  return _run("grpo", base[0], sampler, evaluator, steps=150)


def test_grpo_raises_heldout_accuracy_on_toy_math(setup, base, expert):
  sampler, _ = setup
  base_acc = base[1]
  before, after = expert.curve[0]["mean"], expert.curve[-1]["mean"]
  assert before == base_acc
  assert 0.1 <= before <= 0.7, f"the warmed-up base should be partly right, got {before}"
  gain = sampled_accuracy(sampler, expert.state.params) - sampled_accuracy(sampler, base[0])
  assert gain >= 0.05, gain
  assert after >= before - 0.05, (before, after)  # greedy: noisy (module docstring), not worse
  assert expert.ledger.by_phase()["train/policy"] > 0


def test_opd_from_grpo_expert_recovers_most_of_its_gain(setup, base, expert):
  sampler, evaluator = setup
  params = base[0]
  router = TeacherRouter(CFG, [Teacher("expert", CFG, expert.state.params, ("math",))],
                         want_logits=True)
  result = _run("opd", params, sampler, evaluator, steps=200, router=router)
  base_s = sampled_accuracy(sampler, params)
  teacher_s = sampled_accuracy(sampler, expert.state.params)
  student_s = sampled_accuracy(sampler, result.state.params)
  assert teacher_s - base_s >= 0.05, (base_s, teacher_s)
  kl_before = reverse_kl_to(sampler, params, expert.state.params)
  kl_after = reverse_kl_to(sampler, result.state.params, expert.state.params)
  assert kl_after <= 2 / 3 * kl_before, (kl_before, kl_after)
  assert student_s - base_s >= 0.5 * (teacher_s - base_s), (base_s, student_s, teacher_s)
  phases = result.ledger.by_phase()
  assert phases["train/teacher"] > 0 and phases["train/policy"] > 0
