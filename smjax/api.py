"""The short API: GRPO with your own reward, and on-policy distillation, in a few lines.

    import smjax

    data = [{"prompt": "2+3=", "answer": "5"}, ...]          # records, a JSONL file or a Domain
    def reward(prompts, completions, answer, **_):            # one number per completion
      return [float(c.strip() == a) for c, a in zip(completions, answer)]

    run = smjax.grpo("toy-tiny", data, reward, steps=50, learning_rate=3e-3)
    run.curve, run.ledger.by_phase(), run.checkpoint          # accuracy vs FLOPs, FLOPs, files
    student = smjax.distill("toy-tiny", teachers={"data": run}, data=data, reward=reward)

Both run the study's own pieces (docs/design.md#the-short-api): the steps and their optimiser
(smjax.study.shared.grpo_parts / opd_parts), the host loop with its checkpoints and resume
(smjax.train.loop.run_rl_checkpointed, as a study phase runs it), the FLOP ledger and the held-out
evaluator. What the API adds is the translation of plain inputs:

- model: a preset name (the toy char-level presets: a fresh random init), a local Hugging Face
  directory, a `Model` (config, parameters, tokenizer), a previous `Result`, or a parameter tree
  with `arch=` (a preset name or a ModelConfig) saying its architecture.
- data: a list of records ({"prompt": str, any other fields}), a .jsonl/.jsonl.gz/.parquet file
  of them, a Domain, a domain name or `module:attr` path (smjax.domains.get_domain), or a list of
  Domains / names. Records are grouped into domains by their "domain" field (default "data");
  one in five prompts (by a hash of the text) is held out for evaluation unless `eval_data=`
  gives the held-out records.
- reward: `reward(prompts, completions, **fields) -> list[float]`, called once per batch with
  lists (TRL's convention: `fields` are the records' other fields, one list each). Records need
  one; a Domain is its own reward (its `verify`).

Settings are the study's names (config.rl / config.opd, smjax.study.config) plus the loop's, as
keyword arguments or `config=` (an ml_collections ConfigDict or a dict); `grpo_settings()` and
`distill_settings()` list them with their defaults. Every input is checked before anything
compiles, with one-line errors naming the argument: an unknown setting or preset, an empty
dataset, a reward that returns the wrong number of values or something that is not a number
(probed on two records before training), a prompt that leaves no room for `max_new_tokens`.

The held-out accuracy of a curve point is the share of `eval_samples` samples per held-out prompt
whose reward is at least 1 (smjax.train.evaluate.Evaluator): a 0/1 reward reads as accuracy, a
graded one as "fully right".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import numbers
import os
import tempfile
import types
import zlib
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from smjax.domains.base import Domain, Example, check_split
from smjax.ledger import FlopLedger
from smjax.models.transformer import ModelConfig

# The longest completion `max_new_tokens=0` samples (what the model's context leaves, at most).
AUTO_MAX_NEW_TOKENS = 256
# The name of the domain of records that carry no "domain" field.
DEFAULT_DOMAIN = "data"

# Settings a run resumed into the same workdir may change (any other change is refused): none of
# them changes what a step computes. `steps` is here so that a finished run can be continued.
_RUN_NEUTRAL = ("steps", "progress", "log_every", "checkpoint_every", "checkpoint_seconds",
                "eval_every")


# ------------------------------------------------------------------------------------ settings

def _loop_settings() -> dict:
  return dict(
      steps=100,                  # RL iterations
      prompts_per_step=8,
      max_new_tokens=0,           # 0: what the context leaves after the longest prompt, <= 256
      temperature=1.0,
      learning_rate=1e-6,         # TRL's default for a real model; a toy preset wants ~1e-3
      clip_norm=1.0,
      micro_batches=1, impl="auto", shared_prompt=True, pack_completions=True,
      eps_low=0.2, eps_high=0.28,
      eval_every=0,               # steps between evaluations (0: at the start and the end only)
      eval_size=64,               # held-out prompts per domain (at most)
      # Samples per held-out prompt at `temperature` (0: samples_per_prompt) and prompts per
      # sampler call (0: prompts_per_step): by default the rollout's shapes, so evaluation runs
      # the sampler programs the rollouts compiled.
      eval_samples=0, eval_batch_size=0,
      eval_greedy=False,          # also greedy pass@1
      checkpoint_every=0,         # steps between checkpoints (0: the last step only)
      checkpoint_seconds=0.0,     # also one once this much wall time has passed (0: off)
      log_every=10, seed=0, progress=True,
      collapse_window=25)         # smjax.train.guards.Collapse (0: off)


def grpo_settings() -> mlc.ConfigDict:
  """`smjax.grpo`'s settings and their defaults: config.rl's fields (smjax.study.config, the same
  meaning) and the loop's."""
  return mlc.ConfigDict(_loop_settings() | dict(
      samples_per_prompt=8, warmup_steps=0, advantage_mode="grpo", beta=0.0, kl_estimator="k3",
      aggregation="token_mean"))


def distill_settings() -> mlc.ConfigDict:
  """`smjax.distill`'s settings and their defaults: config.opd's fields and the loop's. The
  objective defaults to "sampled" (per-token reverse KL of the student's own tokens: the teacher
  returns one log-prob per token, whatever its vocabulary; "full_vocab" and "top_k" read its
  logits, cheap only for small vocabularies)."""
  return mlc.ConfigDict(_loop_settings() | dict(samples_per_prompt=4, objective="sampled",
                                                top_k=16))


def _settings(what: str, defaults: mlc.ConfigDict, config, overrides: dict) -> mlc.ConfigDict:
  """`defaults` updated by `config` (ConfigDict or dict) then `overrides`; one-line errors for an
  unknown setting or a value of the wrong type or range."""
  out = defaults
  if config is not None and not isinstance(config, (mlc.ConfigDict, Mapping)):
    raise TypeError(f"{what}: config= is of type {type(config).__name__}; expected an "
                    "ml_collections ConfigDict or a dict of settings")
  given = dict(config.to_dict() if isinstance(config, mlc.ConfigDict) else (config or {}))
  for key, value in {**given, **overrides}.items():
    if key not in out:
      raise TypeError(f"{what}: unknown setting {key}={value!r}; known: {', '.join(sorted(out))}")
    want = type(out[key])
    ok = (isinstance(value, bool) if want is bool else
          isinstance(value, numbers.Real) and not isinstance(value, bool) if want is float else
          isinstance(value, numbers.Integral) and not isinstance(value, bool) if want is int else
          isinstance(value, want))
    if not ok:
      kind = {bool: "True or False", float: "a number", int: "an integer", str: "a string"}
      raise TypeError(f"{what}: {key}={value!r} is of type {type(value).__name__}; expected "
                      f"{kind.get(want, want.__name__)}")
    out[key] = want(value)
  _check_settings(what, out)
  return out


def _check_settings(what: str, s: mlc.ConfigDict) -> None:
  for key in ("steps", "prompts_per_step", "samples_per_prompt", "eval_size", "log_every",
              "micro_batches"):
    if s[key] < 1:
      raise ValueError(f"{what}: {key}={s[key]} must be >= 1")
  for key in ("max_new_tokens", "eval_every", "eval_samples", "eval_batch_size", "seed",
              "checkpoint_every", "checkpoint_seconds", "collapse_window", "warmup_steps",
              "clip_norm"):
    if key in s and s[key] < 0:
      raise ValueError(f"{what}: {key}={s[key]} must be >= 0")
  for key in ("learning_rate", "temperature"):
    if not s[key] > 0:
      raise ValueError(f"{what}: {key}={s[key]} must be > 0")
  if s.prompts_per_step % s.micro_batches:
    raise ValueError(f"{what}: micro_batches={s.micro_batches} must divide prompts_per_step="
                     f"{s.prompts_per_step} (a micro-batch holds whole prompt groups)")
  from smjax.train import steps as steps_lib  # pylint: disable=import-outside-toplevel
  try:  # the step configs' own checks (choices), with the setting's name in the error
    if "advantage_mode" in s:
      steps_lib.GRPOConfig(advantage_mode=s.advantage_mode, kl_estimator=s.kl_estimator,
                           aggregation=s.aggregation, impl=s.impl)
      if s.samples_per_prompt < 2 and s.advantage_mode in ("grpo", "rloo"):
        raise ValueError(f"{what}: samples_per_prompt={s.samples_per_prompt}: GRPO/RLOO "
                         "advantages need groups of at least 2")
    else:
      steps_lib.OPDConfig(objective=s.objective, impl=s.impl)
  except ValueError as e:
    msg = str(e)
    raise ValueError(msg if msg.startswith(what) else f"{what}: {msg.split('.', 1)[1]}") from None


# --------------------------------------------------------------------------------------- model

@dataclasses.dataclass(frozen=True, eq=False)
class Model:
  """A decoder to train or to distil from: its config, parameters and tokenizer; `source` says
  where it came from (a preset name, a directory, "params")."""
  cfg: ModelConfig
  params: Any
  tokenizer: Any
  source: str = "params"


def _char_tokenizer(what: str, cfg: ModelConfig, name: str):
  # pylint: disable-next=import-outside-toplevel
  from smjax.models.tokenizer import CHAR_VOCAB_SIZE, CharTokenizer
  if cfg.vocab_size != CHAR_VOCAB_SIZE:
    raise ValueError(f"{what}={name!r} is a preset of vocab_size={cfg.vocab_size} without a "
                     "tokenizer here (only the toy presets have one, the char tokenizer); give "
                     "the model's Hugging Face directory instead")
  return CharTokenizer()


def _check_params(what: str, cfg: ModelConfig, params) -> None:
  """One line naming the first leaf whose shape is not `cfg`'s (or a missing/extra leaf)."""
  from smjax.models.transformer import init_params  # pylint: disable=import-outside-toplevel
  want = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  flat_want = dict(jax.tree_util.tree_flatten_with_path(want)[0])
  try:
    flat_have = dict(jax.tree_util.tree_flatten_with_path(params)[0])
  except Exception:  # pylint: disable=broad-except
    flat_have = {}
  name = lambda path: jax.tree_util.keystr(path)  # noqa: E731
  for path, leaf in flat_want.items():
    have = flat_have.get(path)
    if have is None or tuple(np.shape(have)) != tuple(leaf.shape):
      got = "missing" if have is None else f"of shape {tuple(np.shape(have))}"
      raise ValueError(f"{what}: the parameters do not fit {cfg.name or 'the architecture'}: "
                       f"{name(path)} is {got}, expected {tuple(leaf.shape)}; give arch= the "
                       "architecture they were trained with")
  extra = sorted(name(p) for p in flat_have if p not in flat_want)
  if extra:
    raise ValueError(f"{what}: the parameters do not fit {cfg.name or 'the architecture'}: "
                     f"unexpected {extra[0]}")


@functools.lru_cache(maxsize=None)
def _init_program(cfg: ModelConfig):
  """`key -> params` of a preset, jitted once per config: one compile instead of running the
  initialisers' ops one at a time (seconds on a CPU)."""
  from smjax.models.transformer import init_params  # pylint: disable=import-outside-toplevel
  return jax.jit(functools.partial(init_params, cfg))


def load_model(model, *, arch: str | ModelConfig | None = None, seed: int = 0,
               what: str = "model", tokenizer: bool = True) -> Model:
  """A `Model` from what `smjax.grpo` / `smjax.distill` accept as a model (module docstring): a
  preset name (random init from `seed`), a Hugging Face directory, a Model, a Result, or a
  parameter tree of architecture `arch` (a preset name or a ModelConfig; its tokenizer the char
  tokenizer, and none without `tokenizer`: a teacher only scores token ids)."""
  # pylint: disable=import-outside-toplevel
  from smjax.models.presets import PRESETS, get_preset
  if isinstance(model, Result):
    return model.model
  if isinstance(model, Model):
    return model
  if isinstance(model, (str, os.PathLike)):
    name = os.fspath(model)
    if name in PRESETS:
      cfg = get_preset(name)
      tok = _char_tokenizer(what, cfg, name)
      return Model(cfg, _init_program(cfg)(jax.random.key(seed)), tok, name)
    if os.path.isdir(name):
      return _load_hf(what, name)
    from smjax.models.hub import check_model_dir
    check_model_dir(name, what)
    toy = sorted(n for n, c in PRESETS.items() if c.vocab_size == PRESETS["toy-tiny"].vocab_size)
    raise ValueError(f"{what}={name!r} is neither a preset ({', '.join(toy)}) nor a local "
                     "Hugging Face model directory")
  if arch is None:
    raise TypeError(f"{what}: parameters ({type(model).__name__}) need arch= (a preset name "
                    "or a ModelConfig) to say its architecture; or pass a Model, a Result, a "
                    "preset name or a model directory")
  cfg = get_preset(arch) if isinstance(arch, str) else arch
  if not isinstance(cfg, ModelConfig):
    raise TypeError(f"{what}: arch={arch!r}; expected a preset name or a ModelConfig")
  _check_params(what, cfg, model)
  tok = _char_tokenizer(what, cfg, cfg.name) if tokenizer else None
  return Model(cfg, jax.tree.map(jnp.asarray, model), tok)


def _load_hf(what: str, path: str) -> Model:
  # pylint: disable=import-outside-toplevel
  from smjax.models import hf
  from smjax.models.tokenizer import load_tokenizer
  if not os.path.exists(os.path.join(path, "config.json")):
    raise FileNotFoundError(f"{what}={path!r}: a directory without config.json; expected a "
                            "Hugging Face model directory (config.json, safetensors, "
                            "tokenizer.json)")
  cfg, params = hf.load_params(path)
  tok = load_tokenizer(path)
  if tok.vocab_size > cfg.vocab_size:
    raise ValueError(f"{what}={path!r}: the tokenizer has {tok.vocab_size} ids but config.json "
                     f"says vocab_size={cfg.vocab_size}; they must come from the same model")
  return Model(cfg, jax.tree.map(jnp.asarray, params), tok, path)


# ---------------------------------------------------------------------------------------- data

def _held_out(prompt: str) -> bool:
  """One prompt in five, by a hash of its text (identical prompts share a split), as
  smjax.domains.real splits a data file."""
  return zlib.crc32(prompt.encode()) % 5 == 0


class RecordsDomain(Domain):
  """Records ({"prompt": str, other fields}) as a domain scored by a reward callable.

  `reward(prompts=..., completions=..., **fields)` gets each field of the batch's records as a
  list (None where a record lacks it) and must return one real number per completion (checked:
  a ValueError naming what came back). The rewards are used as they are (not clipped to [0, 1]:
  GRPO's advantages are standardised per group). Without a reward every completion scores 0
  (a distillation that is not evaluated)."""

  def __init__(self, name: str, train: Sequence[dict], test: Sequence[dict],
               reward: Callable | None):
    self.name = name
    self.reward = reward
    self._examples = {split: [self._example(r) for r in recs]
                      for split, recs in (("train", train), ("test", test))}
    self._fields = sorted({k for recs in (train, test) for r in recs for k in r} - {"prompt"})

  def _example(self, rec: dict) -> Example:
    meta = {"where": rec.get("_where", "")}
    if isinstance(rec.get("system"), str):   # a chat model's system message (smjax.models.chat)
      meta["system"] = rec["system"]
    return Example(prompt=rec["prompt"], reference=rec, solution=str(rec.get("solution", "")),
                   domain=self.name, metadata=meta)

  def records(self, split: str) -> list[Example]:
    """The split's examples in record order (smjax.data sizes a source by their number)."""
    return self._examples[check_split(split)]

  def generate(self, split: str, n: int, seed: int, difficulty: int | None = None
               ) -> list[Example]:
    """n examples of the split: its records shuffled by `seed`, reshuffled per pass."""
    del difficulty
    recs = self.records(split)
    if not recs:
      raise ValueError(f"domain {self.name!r}: the {split} split is empty")
    out, rnd = [], 0
    while len(out) < n:
      order = np.random.default_rng([seed, rnd, zlib.crc32(self.name.encode())]).permutation(
          len(recs))
      out += [recs[i] for i in order[:n - len(out)]]
      rnd += 1
    return out

  def score(self, example: Example, completion: str) -> float:
    return self.verify_many([example], [completion])[0]

  def verify(self, example: Example, completion: str) -> float:
    return self.verify_many([example], [completion])[0]

  def verify_many(self, examples: Sequence[Example], completions: Sequence[str], *,
                  pool: Any = None) -> list[float]:
    del pool
    if self.reward is None:
      return [0.0] * len(completions)
    fields = {k: [e.reference.get(k) for e in examples] for k in self._fields
              if not k.startswith("_")}
    out = self.reward(prompts=[e.prompt for e in examples], completions=list(completions),
                      **fields)
    return check_rewards(out, len(completions))


def check_rewards(out, n: int, what: str = "reward") -> list[float]:
  """`out` as n floats; a one-line ValueError when it is not a sequence of n finite real
  numbers (naming the first bad value and its index)."""
  if isinstance(out, np.ndarray):
    out = out.tolist()
  if isinstance(out, (str, bytes, Mapping)) or not isinstance(out, Sequence):
    raise ValueError(f"{what} returned {type(out).__name__} {str(out)[:40]!r}; expected a list "
                     f"of {n} numbers, one per completion")
  if len(out) != n:
    raise ValueError(f"{what} returned {len(out)} values for {n} completions; expected one "
                     "number per completion")
  vals = []
  for i, v in enumerate(out):
    if (not isinstance(v, (numbers.Real, np.number, np.bool_))
        or isinstance(v, np.complexfloating)):
      raise ValueError(f"{what} returned {v!r} ({type(v).__name__}) at index {i}; expected a "
                       "number per completion")
    if not math.isfinite(float(v)):
      raise ValueError(f"{what} returned {float(v)} at index {i}; expected finite numbers")
    vals.append(float(v))
  return vals


def _read_records(what: str, data) -> list[dict]:
  """Records from a list or a file, each a dict with a non-empty "prompt" string and, where it
  has one, a "domain" string; one-line errors naming the record."""
  if isinstance(data, (str, os.PathLike)):
    from smjax.domains.records import _read_raw  # pylint: disable=import-outside-toplevel
    path = os.fspath(data)
    located = [(f"{path}:{where.split()[1]}" if where.startswith("line") else f"{path}: {where}",
                r) for where, r in _read_raw(path)]
  else:
    located = [(f"{what}[{i}]", r) for i, r in enumerate(data)]
  if not located:
    raise ValueError(f"{what} is empty; expected at least one record {{'prompt': str, ...}}")
  out = []
  for where, rec in located:
    if not isinstance(rec, Mapping):
      raise ValueError(f"{where}: {str(rec)[:40]!r} ({type(rec).__name__}); expected a record "
                       "(a dict with a 'prompt' string)")
    prompt = rec.get("prompt")
    if not isinstance(prompt, str) or not prompt:
      got = "missing" if "prompt" not in rec else f"{prompt!r}"
      raise ValueError(f"{where}: 'prompt' is {got}; expected a non-empty string (the record "
                       f"has {sorted(rec)})")
    if not isinstance(rec.get("domain", DEFAULT_DOMAIN), str):
      raise ValueError(f"{where}: 'domain' is {rec['domain']!r}; expected a string (the name "
                       "its rows are routed and reported by)")
    out.append(dict(rec, _where=where))
  return out


def _is_records(data) -> bool:
  if isinstance(data, (str, os.PathLike)):
    path = os.fspath(data)
    return os.path.isfile(path) or path.endswith((".jsonl", ".jsonl.gz", ".json", ".ndjson",
                                                  ".parquet"))
  return isinstance(data, Sequence) and bool(data) and all(isinstance(r, Mapping) for r in data)


def make_domains(data, reward: Callable | None = None, eval_data=None, *, what: str = "data",
                 need_reward: bool = True) -> dict[str, Domain]:
  """{name: Domain} from what `smjax.grpo` / `smjax.distill` accept as data (module
  docstring); every error one line naming the argument."""
  from smjax.domains import get_domain  # pylint: disable=import-outside-toplevel
  if isinstance(data, (list, tuple)) and not data:
    raise ValueError(f"{what} is empty; expected records ({{'prompt': str, ...}}), a data file "
                     "or domains")
  if reward is not None and not callable(reward):
    raise TypeError(f"reward is of type {type(reward).__name__}; expected a callable "
                    "reward(prompts, completions, **fields) -> list of numbers")
  if _is_records(data):
    if reward is None and need_reward:
      raise TypeError(f"{what}: records need reward= (a callable reward(prompts, completions, "
                      "**fields) -> list of numbers); a Domain brings its own")
    return _records_domains(what, _read_records(what, data),
                            None if eval_data is None else _read_records("eval_data", eval_data),
                            reward)
  if eval_data is not None:
    raise TypeError(f"eval_data= goes with records; a Domain holds its own held-out split "
                    f"({what} is of type {type(data).__name__})")
  if reward is not None:
    raise TypeError(f"reward= goes with records; {what} is of type {type(data).__name__}, a domain "
                    "scored by its own verify (wrap it in records to score it your way)")
  items = list(data) if isinstance(data, (list, tuple)) else [data]
  if not items:
    raise ValueError(f"{what} is empty; expected records, a data file or domains")
  out: dict[str, Domain] = {}
  for item in items:
    if isinstance(item, str):
      dom = get_domain(item)
    elif isinstance(item, Domain):
      dom = item
    else:
      raise TypeError(f"{what}: {str(item)[:40]!r} is of type {type(item).__name__}; expected "
                      "records (dicts with a 'prompt'), a data file, a Domain or a domain name")
    if not getattr(dom, "name", ""):
      raise ValueError(f"{what}: {dom!r} has no name; a domain's name keys its examples")
    if dom.name in out:
      raise ValueError(f"{what}: two domains are named {dom.name!r}; each needs its own name")
    out[dom.name] = dom
  return out


def _records_domains(what: str, train: list[dict], test: list[dict] | None,
                     reward) -> dict[str, Domain]:
  def by_domain(recs):
    groups: dict[str, list[dict]] = {}
    for r in recs:
      groups.setdefault(r.get("domain", DEFAULT_DOMAIN), []).append(r)
    return groups

  if test is None:
    split = [r for r in train if not _held_out(r["prompt"])], [r for r in train
                                                               if _held_out(r["prompt"])]
    train, test = split
    if not test or not train:
      side = "held out" if not test else "left to train on"
      raise ValueError(f"{what}: with {len(train) + len(test)} records none is {side} (one "
                       "prompt in five is held out, by a hash of its text); pass eval_data= "
                       "(the records to evaluate on) or more records")
  train_by, test_by = by_domain(train), by_domain(test)
  for name in sorted(set(train_by) ^ set(test_by)):
    side = "eval_data" if name not in test_by else what
    raise ValueError(f"{what}: domain {name!r} has no records in {side}; every domain needs "
                     "prompts to train on and held-out ones")
  return {name: RecordsDomain(name, train_by[name], test_by[name], reward) for name in train_by}


def _probe_rewards(domains: Mapping[str, Domain]) -> None:
  """Calls each records domain's reward once on two of its prompts with empty completions, so a
  reward that returns the wrong number of values, or no numbers, fails before anything
  compiles."""
  for dom in domains.values():
    if isinstance(dom, RecordsDomain) and dom.reward is not None:
      examples = dom.records("train")[:2]
      try:
        dom.verify_many(examples, [""] * len(examples))
      except ValueError as e:
        if str(e).startswith("reward returned"):
          raise ValueError(f"{e} (a probe on {len(examples)} prompts of domain {dom.name!r}, "
                           "with empty completions, before training)") from None
        raise


# ------------------------------------------------------------------------------------- results

@dataclasses.dataclass(eq=False)
class Result:
  """What `smjax.grpo` and `smjax.distill` return.

  model: the trained Model (`params` is its parameters). ledger: the run's FLOP ledger
  (smjax.ledger: `by_phase()`, `total(training_only=True)`). curve: the accuracy-vs-FLOPs curve,
  one point per evaluation ({"step", "flops" (training FLOPs so far), "mean", "accuracy":
  {domain: acc}, ...}; smjax.train.loop.run_rl). checkpoint: the last saved train state's
  directory (smjax.checkpoint; a run into the same workdir resumes from it). workdir: the run's
  files (checkpoints/, logs/ with metrics.jsonl and TensorBoard events). metrics: the last step's
  training metrics. stopped: a SIGTERM stopped the run at a checkpoint."""
  model: Model
  ledger: FlopLedger
  curve: list[dict]
  checkpoint: str | None
  workdir: str
  metrics: dict
  stopped: bool = False

  @property
  def params(self):
    return self.model.params

  @property
  def flops(self) -> int:
    """Training FLOPs (rollouts, updates, reference and teacher forwards; not evaluation)."""
    return self.ledger.total(training_only=True)

  @property
  def accuracy(self) -> float | None:
    """The last evaluation's held-out accuracy, mean over domains (None: not evaluated)."""
    return self.curve[-1]["mean"] if self.curve else None

  def __repr__(self) -> str:
    curve = ", ".join(f"{p['mean']:.2f}@{p['flops']:.2g}" for p in self.curve)
    return (f"Result(accuracy over training FLOPs: [{curve}]; training FLOPs {self.flops:.3g}; "
            f"checkpoint {self.checkpoint})")


# ------------------------------------------------------------------------------------ the runs

@functools.lru_cache(maxsize=8)
def _parts(kind: str, items: tuple, cfg: ModelConfig):
  """The optimiser, jitted step and layout of `kind` for these settings, built once per process
  (the study's wiring, smjax.study.shared): a second run with the same settings and model
  reuses the compiled step."""
  # pylint: disable=import-outside-toplevel
  from smjax.models.transformer import Transformer
  from smjax.study.shared import grpo_parts, opd_parts
  s = types.SimpleNamespace(**dict(items))
  if kind == "grpo":
    return grpo_parts(s, Transformer(cfg), cfg)
  return opd_parts(s, s.clip_norm, Transformer(cfg), cfg)


def _step_items(s: mlc.ConfigDict, kind: str) -> tuple:
  keys = (("learning_rate", "warmup_steps", "clip_norm", "advantage_mode", "eps_low",
           "eps_high", "beta", "kl_estimator", "aggregation") if kind == "grpo" else
          ("learning_rate", "clip_norm", "objective", "eps_low", "eps_high", "top_k"))
  return tuple((k, s[k]) for k in keys + ("micro_batches", "impl", "shared_prompt",
                                          "pack_completions"))


def _max_new_tokens(what: str, s: mlc.ConfigDict, model: Model, domains, heldout) -> int:
  """The token cap: `max_new_tokens`, or what the context leaves after the longest prompt;
  one line when a prompt leaves no room for it."""
  from smjax.batch import encode_prompt  # pylint: disable=import-outside-toplevel
  examples = [e for ex in heldout.values() for e in ex]
  for dom in domains.values():
    examples += (dom.records("train") if isinstance(dom, RecordsDomain)
                 else dom.generate("train", 64, seed=s.seed))
  longest, worst = 0, None
  for e in examples:
    n = len(encode_prompt(model.tokenizer, e))
    if n > longest:
      longest, worst = n, e
  room = model.cfg.max_seq_len - longest
  want = s.max_new_tokens or min(AUTO_MAX_NEW_TOKENS, room)
  if want > room or want < 1:
    where = (worst.metadata or {}).get("where") or repr(worst.prompt[:40])
    fix = f"use max_new_tokens <= {room}" if room >= 1 else "shorten that prompt"
    raise ValueError(f"{what}: max_new_tokens={want} does not fit: the prompt at {where} has "
                     f"{longest} tokens and the model's max_seq_len is {model.cfg.max_seq_len}; "
                     f"{fix}")
  return want


def _heldout(domains: Mapping[str, Domain], s: mlc.ConfigDict) -> dict[str, list[Example]]:
  """Up to eval_size distinct held-out prompts per domain (a repeated prompt would only cost
  samples): a records domain's held-out records, another domain's test split drawn with a fixed
  seed."""
  out = {}
  for name, dom in domains.items():
    examples = (dom.records("test") if isinstance(dom, RecordsDomain)
                else dom.generate("test", s.eval_size, seed=10_000 + s.seed))
    out[name] = list({e.prompt: e for e in examples}.values())[:s.eval_size]
  return out


def _run(what: str, kind: str, s: mlc.ConfigDict, model: Model, domains: dict[str, Domain],
         workdir: str | None, router=None, evaluate: bool = True) -> Result:
  """One GRPO or OPD run (the study's wiring, module docstring) from `model` on `domains`."""
  # pylint: disable=import-outside-toplevel
  from smjax import checkpoint as ckpt_lib
  from smjax import data as data_lib
  from smjax import paths
  from smjax.rewards.verify import verify_batch
  from smjax.rollout import Sampler
  from smjax.study.shared import new_train_state
  from smjax.train.evaluate import Evaluator
  from smjax.train.loop import (Reference, RLLoopConfig, grpo_batch, opd_batch,
                                run_rl_checkpointed)
  from smjax.train.metrics import MetricsWriter
  heldout = _heldout(domains, s)
  max_new = _max_new_tokens(what, s, model, domains, heldout)
  tok, cfg = model.tokenizer, model.cfg
  if not workdir:   # said, not silent: a real model's checkpoints fill a temp directory fast
    workdir = tempfile.mkdtemp(prefix=f"smjax-{kind}-")
    logging.getLogger(__name__).warning(
        "%s: no workdir= given; checkpoints and logs go to %s (not deleted)", what, workdir)
  workdir = paths.resolve(workdir)
  tx, step, layout = _parts(kind, _step_items(s, kind), cfg)
  sampler = Sampler(cfg, max_new_tokens=max_new, eos_id=tok.eos_id, pad_id=tok.pad_id)
  verify = functools.partial(verify_batch, domains=domains)
  evaluator = None
  if evaluate:
    evaluator = Evaluator(sampler, tok, heldout, verify,
                          batch_size=s.eval_batch_size or s.prompts_per_step,
                          samples=s.eval_samples or s.samples_per_prompt,
                          temperature=s.temperature,
                          greedy=s.eval_greedy, phase="eval/heldout")
  if kind == "grpo":
    ref = Reference(cfg, model.params) if s.beta else None
    make_batch = functools.partial(grpo_batch, layout=layout, reference=ref)
  else:
    make_batch = functools.partial(opd_batch, router=router, layout=layout)
  stream = data_lib.prompt_pipeline(list(domains.values()), batch_size=s.prompts_per_step,
                                    split="train", seed=s.seed)
  state = new_train_state(jax.tree.map(jnp.copy, model.params), tx, None, cfg)
  loop = RLLoopConfig(steps=s.steps, samples_per_prompt=s.samples_per_prompt,
                      temperature=s.temperature, eval_every_steps=s.eval_every,
                      log_every=s.log_every, checkpoint_every=s.checkpoint_every,
                      checkpoint_seconds=s.checkpoint_seconds, seed=s.seed,
                      progress=s.progress, collapse_window=s.collapse_window)
  run_config = {"run": kind, "settings": s.to_dict(), "model": model.source,
                "max_new_tokens": max_new, "domains": sorted(domains)}
  checkpointer = ckpt_lib.Checkpointer(
      workdir, max_to_keep=2, keep_best=False, async_save=True, config=run_config,
      ignore_fields=ckpt_lib.DEFAULT_RUN_NEUTRAL_FIELDS + _RUN_NEUTRAL)
  try:
    result = run_rl_checkpointed(
        state, checkpointer=checkpointer, prompts=data_lib.PromptStream(iter(stream)),
        open_writer=lambda: MetricsWriter(paths.join(workdir, "logs")),
        name=kind, loop=loop, step=step, make_batch=make_batch, sampler=sampler, tokenizer=tok,
        verify=verify, evaluator=evaluator,
        collapse_advice=f"learning_rate={s.learning_rate} too high for this model, or a reward "
        "no sample earns (collapse_window=0 runs on regardless)")
  except ckpt_lib.ConfigMismatchError as e:   # its lines "  field: checkpoint -> now", as one
    diff = "; ".join(l.strip() for l in str(e).splitlines() if l.startswith("  "))
    raise ckpt_lib.ConfigMismatchError(
        f"{what}: workdir={workdir} holds a checkpoint of another run ({diff}); give a fresh "
        "workdir= or delete that one") from None
  where = str(checkpointer.directory)
  saved = sorted(int(d) for d in paths.listdir(where) if d.isdigit()) if paths.exists(where) else []
  return Result(dataclasses.replace(model, params=result.state.params), result.ledger,
                result.curve, paths.join(where, str(saved[-1])) if saved else None, workdir,
                result.last_metrics, result.stopped)


def grpo(model, data, reward: Callable | None = None, *, config=None, eval_data=None,
         workdir: str | None = None, arch: str | ModelConfig | None = None,
         **settings) -> Result:
  """GRPO of `model` on `data` scored by `reward` (module docstring for what each accepts).

  config / settings: `grpo_settings()`'s fields (kwargs win over config=). workdir: where the
  checkpoints and logs go (default: a fresh temporary directory, named in a logged warning and
  not deleted); a workdir that holds a checkpoint of the same run resumes from it (a larger
  `steps` continues a finished run).
  Returns a Result: the trained parameters, the FLOP ledger, the accuracy-vs-FLOPs curve
  (evaluated at the start, every `eval_every` steps and at the end) and the checkpoint."""
  s = _settings("smjax.grpo", grpo_settings(), config, settings)
  domains = make_domains(data, reward, eval_data)
  _probe_rewards(domains)
  return _run("smjax.grpo", "grpo", s, load_model(model, arch=arch, seed=s.seed), domains,
              workdir)


def distill(student, teachers: Mapping[str, Any], data, reward: Callable | None = None, *,
            config=None, eval_data=None, workdir: str | None = None,
            arch: str | ModelConfig | None = None, **settings) -> Result:
  """On-policy distillation of `student` from `teachers` ({domain name: teacher}) on `data`:
  the student samples, each row's domain's teacher scores the student's tokens, and the student
  minimises its reverse KL to that teacher (smjax.train.steps.opd_loss), as the study's MOPD
  does. A teacher is what `model` may be (a Result, a Model, a directory, a preset name), or a
  parameter tree of the student's architecture; one teacher may serve several domains. Every
  domain of `data` needs a teacher, and every teacher a domain. `reward` (records) or the
  domains' own verify give the held-out accuracy curve; records without a reward are not
  evaluated. Settings: `distill_settings()`'s fields. Returns a Result, as `grpo`."""
  s = _settings("smjax.distill", distill_settings(), config, settings)
  domains = make_domains(data, reward, eval_data, need_reward=False)
  _probe_rewards(domains)
  student_model = load_model(student, arch=arch, seed=s.seed, what="student")
  router = _router(teachers, domains, student_model, s)
  evaluate = not any(isinstance(d, RecordsDomain) and d.reward is None for d in domains.values())
  return _run("smjax.distill", "distill", s, student_model, domains, workdir, router=router,
              evaluate=evaluate)


def _router(teachers, domains: Mapping[str, Domain], student: Model, s: mlc.ConfigDict):
  """A TeacherRouter over `teachers` ({domain: teacher}), one Teacher per distinct teacher
  object (its domains routed to it); one-line errors for a domain without a teacher, a teacher
  without a domain, or a teacher that is not a model."""
  # pylint: disable=import-outside-toplevel
  from smjax.train.teachers import Teacher, TeacherRouter
  if not isinstance(teachers, Mapping) or not teachers:
    raise TypeError(f"teachers= is {teachers!r}; expected {{domain name: teacher}} with at least "
                    f"one teacher (the domains: {sorted(domains)})")
  missing = sorted(set(domains) - set(teachers))
  if missing:
    raise ValueError(f"teachers: no teacher for domain(s) {missing}; teachers= has "
                     f"{sorted(teachers)} (a domain is named by its records' 'domain' field, "
                     f"default {DEFAULT_DOMAIN!r}, or by the Domain's name)")
  extra = sorted(set(teachers) - set(domains))
  if extra:
    raise ValueError(f"teachers: {extra} name(s) no domain of the data {sorted(domains)}")
  groups: dict[int, tuple[Any, list[str]]] = {}
  for d, t in teachers.items():
    groups.setdefault(id(t), (t, []))[1].append(d)
  built = []
  for t, ds in groups.values():
    what = f"teachers[{ds[0]!r}]"
    if isinstance(t, (Result, Model, str, os.PathLike)):
      m = load_model(t, seed=s.seed, what=what)
    else:
      m = load_model(t, arch=student.cfg, what=what, tokenizer=False)
    built.append(Teacher("+".join(ds), m.cfg, m.params, tuple(ds)))
  return TeacherRouter(student.cfg, built, want_logits=s.objective != "sampled")


__all__ = ["Model", "RecordsDomain", "Result", "check_rewards", "distill", "distill_settings",
           "grpo", "grpo_settings", "load_model", "make_domains"]
