"""Multi-teacher routing for on-policy distillation: each row is scored by the teacher of its domain.

A `Teacher` is any decoder sharing the student's vocabulary: an expert restored from our checkpoints,
a model imported from HF files (smjax.models.hf), or the student's own earlier checkpoint (the
self-GRPO teacher); it may be larger than the student. `TeacherRouter.score` gathers the rows routed
to each teacher, pads them to a row bucket (so few shapes compile), runs that teacher's forward on
those rows only and scatters the results back. No teacher runs on rows not routed to it, and the
FLOPs it spent (padded rows included: that is what ran) are reported as `train/teacher` calls.

A teacher scores its rows in the student batch's layout (smjax.batch): only the completion
columns, each prompt once per block of rows, and packed (its own rows' plan) when the student's
batch is. Routed rows are whole prompt blocks (rows of one prompt share its domain) and are padded
by whole blocks.

Legend (docs/design.md#shape-legend): B rows, S sequence length, T = S - 1 target positions,
V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from smjax.batch import SequenceBatch, eighth_bucket, pack
from smjax.flops import ProgramCall, analytic_flops, shape_struct
from smjax.models.transformer import ModelConfig, Transformer
from smjax.train.score import target_logits, target_logprobs


@dataclasses.dataclass
class Teacher:
  name: str
  cfg: ModelConfig
  params: Any
  domains: tuple[str, ...]   # the domain tags routed to this teacher


def check_vocabularies(student_cfg: ModelConfig, teachers: Sequence[Teacher],
                       student_vocab: dict | None = None, teacher_vocabs: dict | None = None):
  """Start-up check: every teacher's vocabulary is the student's (sizes, and token tables if given)."""
  for t in teachers:
    if t.cfg.vocab_size != student_cfg.vocab_size:
      raise ValueError(
          f"teacher {t.name!r} has vocab_size={t.cfg.vocab_size} but the student has "
          f"{student_cfg.vocab_size}: on-policy distillation needs a shared vocabulary (same "
          "tokenizer); pick a teacher from the student's model family")
    if student_vocab is not None and teacher_vocabs is not None:
      tv = teacher_vocabs.get(t.name)
      if tv is not None and tv != student_vocab:
        diff = sorted(set(tv.items()) ^ set(student_vocab.items()))[:5]
        raise ValueError(f"teacher {t.name!r}: tokenizer differs from the student's, e.g. {diff}")


def _bucket_rows(n: int, total: int, block: int = 1) -> int:
  """Rows padded to a power of two (at least 8, at most the batch; rounded up to whole `block`s):
  few shapes, bounded waste."""
  b = 8
  while b < n:
    b *= 2
  return min(-(-b // block) * block, max(total, block))


@functools.lru_cache(maxsize=None)
def teacher_program(cfg: ModelConfig, want_logits: bool):
  """A teacher's `(params, batch) -> scores` (logits or the sampled tokens' log-probs), jitted
  once per model config: every router over teachers of one architecture (a study's MOPD arms,
  successive smjax.api runs) shares its compiled programs."""
  fn = target_logits if want_logits else target_logprobs
  return jax.jit(functools.partial(fn, Transformer(cfg)))


class TeacherRouter:
  """Routes rows to teachers by domain and runs each teacher on its rows only.

  `want_logits`: teacher logits [B, T, V] (the full-vocab / top-k objectives) instead of the
  sampled tokens' log-probs [B, T]."""

  def __init__(self, student_cfg: ModelConfig, teachers: Sequence[Teacher], *,
               want_logits: bool = False):
    if not teachers:
      raise ValueError("TeacherRouter needs at least one teacher")
    check_vocabularies(student_cfg, teachers)
    self.teachers = list(teachers)
    self.want_logits = want_logits
    self._route: dict[str, int] = {}
    for i, t in enumerate(self.teachers):
      for d in t.domains:
        if d in self._route:
          raise ValueError(f"domain {d!r} is routed to both {self.teachers[self._route[d]].name!r} "
                           f"and {t.name!r}")
        self._route[d] = i
    self._fns = [teacher_program(t.cfg, want_logits) for t in self.teachers]

  def teacher_of(self, domain: str) -> int:
    if domain not in self._route:
      raise ValueError(f"no teacher is routed domain {domain!r}; routed domains: "
                       f"{sorted(self._route)}")
    return self._route[domain]

  def score(self, batch: SequenceBatch, domains: Sequence[str]):
    """Teacher log-probs [B, T] (or logits [B, T, V]) of each row under its own teacher.

    Returns (scores, program_calls, rows_per_teacher).
    """
    B = batch.tokens_BS.shape[0]
    if len(domains) != B:
      raise ValueError(f"{len(domains)} domain tags for a batch of {B} rows")
    owner = np.array([self.teacher_of(d) for d in domains])
    block = batch.layout.rows_per_prompt
    if (owner.reshape(-1, block) != owner[::block, None]).any():
      raise ValueError(f"TeacherRouter.score: the batch's prompt blocks of {block} rows "
                       "(Layout.rows_per_prompt) must each be of one domain (one prompt each)")
    T = batch.tokens_BS.shape[1] - 1
    out_shape = (B, T, self.teachers[0].cfg.vocab_size) if self.want_logits else (B, T)
    out = jnp.zeros(out_shape, jnp.float32)
    attn_BS = np.asarray(batch.attn_mask_BS)
    calls, rows_per = [], {}
    for i, t in enumerate(self.teachers):
      rows = np.nonzero(owner == i)[0]
      rows_per[t.name] = int(rows.size)
      if rows.size == 0:
        continue
      R = _bucket_rows(rows.size, B, block)
      # Padded with copies of the first block (real rows, whole blocks).
      idx = np.concatenate([rows, np.tile(rows[:block], (R - rows.size) // block)])
      sub = batch.rows(idx)
      if batch.layout.packed:   # whole blocks of a checked batch: laid out as it is
        sub = pack(sub, bucket=eighth_bucket(R, batch.layout.completion_len), check=False)
      scores = self._fns[i](t.params, sub)
      out = out.at[rows].set(scores[:rows.size].astype(jnp.float32))
      attn = attn_BS[rows]
      # A shared prompt runs once per block: its tokens count once (as in the sampler's prefill).
      prompt_cols = attn.shape[1] - batch.layout.completion_len if block > 1 else 0
      real_tokens = float(attn.sum() - attn[:, :prompt_cols].sum() * (1 - 1 / block))
      useful = float(analytic_flops(t.cfg, tokens=real_tokens,
                                    context_len=(batch.tokens_BS.shape[1] + 1) / 2,
                                    backward=False))
      calls.append(ProgramCall("train/teacher", self._fns[i],
                               (jax.tree.map(shape_struct, t.params),
                                jax.tree.map(shape_struct, sub)), calls=1, useful=useful))
    return out, calls, rows_per
