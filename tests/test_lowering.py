"""The study's programs lowered for CUDA and TPU on a CPU machine, with the kernels they run there.

Lowering (`jit(f).trace(...).lower(lowering_platforms=(p,))`) emits the module that the platform's
compiler would receive; it is not compilation, which needs the hardware. It still catches, without
a GPU or TPU, part of what fails on one: a Pallas kernel that does not lower for the platform
(Mosaic on TPU, Triton on GPU) at the shapes and dtypes a step gives it, a dtype path that only
an accelerator takes, and a step that falls back to the XLA loss where the kernel should run.

The programs are the study's own: `smjax.study.shared.seed_shared` builds the GRPO and OPD steps
(impl="auto") and the sampler from a small study config, a real rollout of two held-out prompts
gives the step batches as the study's phases make them (`grpo_batch`, `opd_batch`: each prompt
once per group, completions packed), and the programs lowered are the ones the FLOP ledger
records (`step_program_calls`, the rollout's and the scorers' program calls) plus the decode loop.
The OPD batch reuses the GRPO rollout's samples per prompt (the step depends on it only through
shapes).

"Auto" becomes "pallas" (kernels/dispatch.py) and each kernel picks its platform's variant without
interpret mode (kernels/reverse_kl.py, kernels/group_advantage.py) by `jax.default_backend()`, read
when a step is traced. The library has no other way to target a platform for lowering (smjax.aot
and smjax.precheck compile the XLA losses), so `jax.default_backend` is patched around the trace
(`as_backend`). jax caches traces without the backend in their keys: the caches are cleared before
and after, or a step traced for one platform would be lowered for the other.

The kernels' own lowering, at awkward shapes and block sizes, is tested in
test_reverse_kl_kernel.py and test_group_advantage_kernel.py.
"""

import functools
from unittest import mock

import jax
import pytest

from smjax import rollout as rollout_lib
from smjax.flops import ProgramCall, shape_struct
from smjax.study.config import study_defaults
from smjax.study.shared import seed_shared
from smjax.train import loop
from smjax.train import steps as steps_lib
from smjax.train.teachers import Teacher

# backend jax.default_backend() names -> (lowering platform, the kernels' custom call there)
TARGETS = {"gpu": ("cuda", "xla.gpu.triton"), "tpu": ("tpu", "tpu_custom_call")}
MARKERS = tuple(marker for _, marker in TARGETS.values())

# Study configs (dotted overrides of smjax.study.config.study_defaults).
CASES = {
    # the defaults: float32, GRPO without the KL term, OPD "full_vocab"
    "study": {},
    # bfloat16 compute and micro-batched steps (configs/qwen25_1p5b_v5e8.py); the KL term on
    "bf16": {"model.dtype": "bfloat16", "rl.beta": 0.04, "rl.micro_batches": 2,
             "opd.micro_batches": 2},
    "top_k": {"opd.objective": "top_k"},
    "sampled": {"opd.objective": "sampled"},
    "xla": {"rl.impl": "xla", "opd.impl": "xla"},
}


def _config(case):
  c = study_defaults()
  c.heldout_size, c.stop_size = 4, 0
  for key, value in CASES[case].items():
    section, name = key.split(".")
    c[section][name] = value
  return c


@functools.lru_cache(maxsize=None)
def _shared(case):
  return seed_shared(_config(case), 0)


def _rollout(case):
  """(the base phase's parameters, a rollout of one held-out prompt of each domain run on the CPU
  as a phase runs it, the sampler's programs: the ledger's (prefill, decode step) and the decode
  loop it called). Cases with the same model config share the first one's."""
  model = lambda c: {k: v for k, v in CASES[c].items() if k.startswith("model.")}  # noqa: E731
  return _rollout_of(next(c for c in CASES if model(c) == model(case)))


@functools.lru_cache(maxsize=None)
def _rollout_of(case):
  ctx = _shared(case)
  params = ctx.initial_params()
  loops = []

  def recorder(fn):
    def record(*args, **kwargs):
      loops.append(ProgramCall("rollout/decode_loop", fn, jax.tree.map(shape_struct, args),
                               kwargs))
      return fn(*args, **kwargs)
    return record

  examples = [ctx.heldout[d][0] for d in ctx.domains]
  with (mock.patch.object(rollout_lib, "decode_loop", recorder(rollout_lib.decode_loop)),
        mock.patch.object(rollout_lib, "decode_loop_growing",
                          recorder(rollout_lib.decode_loop_growing))):
    ro, calls = loop.rollout(ctx.sampler, params, examples, tokenizer=ctx.tokenizer,
                             verify=ctx.verify, rng=jax.random.key(0),
                             samples_per_prompt=ctx.config.rl.samples_per_prompt,
                             temperature=ctx.config.rl.temperature)
  assert len(loops) == 1
  return params, ro, list(calls) + loops


@functools.lru_cache(maxsize=None)
def _grpo(case):
  """(the GRPO step's program calls, the reference's) on the study's batch of the rollout."""
  ctx = _shared(case)
  params, ro, _ = _rollout(case)
  ref = loop.Reference(ctx.model_cfg, params) if ctx.config.rl.beta else None
  batch, calls, _ = loop.grpo_batch(ro, layout=ctx.grpo_layout, reference=ref)
  state = ctx.new_state(params, ctx.rl_tx)
  return steps_lib.step_program_calls(ctx.grpo_step, state, batch), calls


@functools.lru_cache(maxsize=None)
def _opd(case):
  """(the OPD step's program calls, the teacher's) on the study's batch of the rollout, scored by
  the student's own parameters as a teacher of every domain."""
  ctx = _shared(case)
  params, ro, _ = _rollout(case)
  router = ctx.teacher_router([Teacher("self", ctx.model_cfg, params, tuple(ctx.domains))])
  batch, calls, _ = loop.opd_batch(ro, router=router, layout=ctx.opd_layout)
  state = ctx.new_state(params, ctx.opd_tx)
  return steps_lib.step_program_calls(ctx.opd_step, state, batch), calls


@pytest.fixture
def as_backend(monkeypatch):
  """`as_backend("gpu")`: from here on jax.default_backend() answers "gpu" (the dispatcher and
  the kernels read it when a step is traced). Build everything that runs on the CPU first."""
  def set_backend(name):
    jax.clear_caches()
    monkeypatch.setattr(jax, "default_backend", lambda: name)
  yield set_backend
  monkeypatch.undo()
  jax.clear_caches()


def _lower(call: ProgramCall, backend: str) -> str:
  platform = TARGETS[backend][0]
  return call.fn.trace(*call.args, **call.kwargs).lower(
      lowering_platforms=(platform,)).as_text()


def _kernels(text: str) -> dict:
  """{custom call: count} of the Pallas kernels in a lowered module."""
  return {m: text.count(m) for m in MARKERS if m in text}


# ------------------------------------------------------------------------------ train steps

@pytest.mark.parametrize("backend", TARGETS)
@pytest.mark.parametrize("case", ["study", "bf16"])
def test_grpo_step_runs_the_group_advantage_kernel(case, backend, as_backend):
  calls, _ = _grpo(case)
  assert len(calls) == CASES[case].get("rl.micro_batches", 1)   # + the micro-batch program
  as_backend(backend)
  for call in calls:
    # the loss's forward and backward kernel, of this platform's variant
    assert _kernels(_lower(call, backend)) == {TARGETS[backend][1]: 2}, call.fn


@pytest.mark.parametrize("backend", TARGETS)
@pytest.mark.parametrize("case,kernels", [
    ("study", 2),   # full_vocab: the reverse-KL kernel forward and backward
    ("bf16", 2),
    ("top_k", 1),   # the exact KL is a metric only: its forward
    ("sampled", 0),  # the KL of the sampled tokens needs no kernel
])
def test_opd_step_runs_the_reverse_kl_kernel(case, kernels, backend, as_backend):
  calls, _ = _opd(case)
  assert len(calls) == CASES[case].get("opd.micro_batches", 1)
  as_backend(backend)
  want = {TARGETS[backend][1]: kernels} if kernels else {}
  for call in calls:
    assert _kernels(_lower(call, backend)) == want, call.fn


@pytest.mark.parametrize("backend", TARGETS)
def test_impl_xla_runs_no_kernel(backend, as_backend):
  """Not vacuous: with impl="xla" forced the same steps lower without a kernel."""
  calls = _grpo("xla")[0] + _opd("xla")[0]
  as_backend(backend)
  for call in calls:
    assert _kernels(_lower(call, backend)) == {}, call.fn


# --------------------------------------------------------------- rollout and scoring programs

@pytest.mark.parametrize("backend", TARGETS)
@pytest.mark.parametrize("case", ["study", "bf16"])
def test_rollout_and_scoring_programs_lower(case, backend, as_backend):
  """The sampler's prefill, decode step and decode loop, the GRPO reference's and the OPD
  teacher's scoring: no kernel in them, but they must lower."""
  sampler = _rollout(case)[2]
  calls = sampler + _grpo(case)[1] + _opd(case)[1]
  names = sorted({c.phase for c in calls})
  assert names == sorted({"rollout/prefill", "rollout/decode", "rollout/decode_loop",
                          "train/teacher"} | ({"train/reference"} if case == "bf16" else set()))
  as_backend(backend)
  for call in calls:
    text = _lower(call, backend)
    assert "func.func public @main" in text and _kernels(text) == {}, call.phase
