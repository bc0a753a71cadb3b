"""Train-step batches: `SequenceBatch`, its static `Layout`, and the functions that build them.

A `SequenceBatch` holds full sequences (left-padded prompt ++ completion, S = P + C columns) and,
aligned to the T = S - 1 *targets* `tokens_BS[:, 1:]` (logits at position s predict token s + 1),
a loss mask and the per-target inputs an objective needs (behaviour, reference or teacher
log-probs). How its rows are laid out is decided once, here, by whoever builds the batch, and
carried as a static `Layout` (part of the treedef, so part of every compiled program's cache key):

- `completion_len` C > 0: the last C columns are the completion, the first P = S - C the prompt.
  Only the C target columns that predict completion tokens are scored (the LM head never runs on
  prompt positions, as TRL's `logits_to_keep`). 0: every target column is scored (SFT rows, whose
  prompts have different lengths).
- `rows_per_prompt` r > 1: each block of r consecutive rows holds one prompt (the sampler's
  [p0 x G, p1 x G, ...] order), so a forward runs each prompt once for its r completions.
- `packed`: the batch carries `pack_plan`, a plan that runs the completion tokens of all rows
  as one stream without their padding (one plan row per micro-batch; `make_pack_plan`).
- `group_size` G: GRPO's reward groups, G consecutive rows per prompt: the rollout's samples per
  prompt, set by `rollout_batch` from the rollout itself, so that the group size reaches the loss
  from the samples that were drawn and from nowhere else (0: not said, for hand-made batches).

`score` (smjax.train.score) reads the layout and runs the matching forward; every layout gives the
same scores up to float rounding. Builders check the layout on the host (`check_layout`) and raise
a ValueError naming the row and field, so a batch that reaches a step is valid by construction.

Legend (the project's one legend, docs/design.md#shape-legend): B rows, G group size, P prompt
length, C completion length, S = P + C sequence length, T = S - 1 target positions, D model dim,
N query heads, K kv heads, H head dim, F mlp dim, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from smjax.models.transformer import positions_from_mask
from smjax.rollout import RolloutResult, full_sequence


@dataclasses.dataclass(frozen=True)
class Layout:
  """How a batch's rows are laid out (module docstring). Static: not a pytree leaf."""
  completion_len: int = 0      # C: scored completion columns at the end of each row (0: all)
  rows_per_prompt: int = 1     # r: consecutive rows sharing one prompt (1: no sharing)
  packed: bool = False         # completions run as one stream (`pack_plan`)
  group_size: int = 0          # G: consecutive rows forming one reward group (0: not said)

  def __post_init__(self):
    if self.completion_len < 0:
      raise ValueError(f"Layout.completion_len={self.completion_len} must be >= 0 (0: every "
                       "target column is scored)")
    if self.rows_per_prompt < 1:
      raise ValueError(f"Layout.rows_per_prompt={self.rows_per_prompt} must be >= 1 (1: no "
                       "sharing)")
    if self.group_size < 0:
      raise ValueError(f"Layout.group_size={self.group_size} must be >= 0 (0: not said)")
    if (self.rows_per_prompt > 1 or self.packed) and not self.completion_len:
      what = (f"rows_per_prompt={self.rows_per_prompt}" if self.rows_per_prompt > 1
              else "packed=True")
      raise ValueError(f"Layout.{what} needs completion_len (the completion width), which tells "
                       "the prompt columns from the completion's")


@flax.struct.dataclass
class SequenceBatch:
  """One train step's rows: full sequences and, aligned to their targets, the loss mask and the
  inputs an objective reads; `layout` (static) says how the rows are laid out (module docstring).
  Build it with `sft_batch` / `rollout_batch` (`pack`), which check the layout."""
  tokens_BS: jax.Array
  positions_BS: jax.Array
  attn_mask_BS: jax.Array           # real (non-pad) tokens
  loss_mask_BT: jax.Array           # completion targets, aligned to tokens_BS[:, 1:]
  old_logp_BT: jax.Array | None = None      # behaviour log-probs (sampler, temperature 1)
  ref_logp_BT: jax.Array | None = None      # reference model (GRPO KL)
  rewards_B: jax.Array | None = None        # GRPO
  teacher_logp_BT: jax.Array | None = None  # OPD "sampled"
  teacher_logits_BTV: jax.Array | None = None  # OPD "full_vocab" / "top_k"
  pack_plan: jax.Array | None = None        # int32 [micro-batches, stream slots] (`pack`)
  layout: Layout = flax.struct.field(pytree_node=False, default=Layout())

  @property
  def window(self) -> int:
    """How many of the T target columns are scored: the last `window` ones."""
    return self.layout.completion_len or self.loss_mask_BT.shape[1]

  def scored(self, x_BT):
    """A per-target array [B, T, ...] cut to the scored columns [B, window, ...] (None stays)."""
    return None if x_BT is None else x_BT[:, x_BT.shape[1] - self.window:]

  def rows(self, idx) -> SequenceBatch:
    """The rows `idx` (host ints) with the same layout, without per-row inputs or a pack plan
    (make one for the new rows with `pack`)."""
    layout = dataclasses.replace(self.layout, packed=False)
    return SequenceBatch(tokens_BS=self.tokens_BS[idx], positions_BS=self.positions_BS[idx],
                         attn_mask_BS=self.attn_mask_BS[idx], loss_mask_BT=self.loss_mask_BT[idx],
                         layout=layout)


# ----------------------------------------------------------------------------- host checks

def check_layout(batch: SequenceBatch, *, micro_batches: int = 1) -> None:
  """ValueError, naming the row and field, unless `batch` is laid out as its `layout` says:
  shapes agree, no loss-mask token before the completion columns, each block of rows_per_prompt
  rows shares its prompt columns, and a packed batch's plan covers every scored target of its
  rows exactly once (`micro_batches`: the step's, which the plan must have been made with)."""
  lay = batch.layout
  B, S = batch.tokens_BS.shape
  T = S - 1
  for name in ("positions_BS", "attn_mask_BS"):
    if getattr(batch, name).shape != (B, S):
      raise ValueError(f"SequenceBatch.{name} has shape {getattr(batch, name).shape}; expected "
                       f"tokens_BS's {(B, S)}")
  for name in ("loss_mask_BT", "old_logp_BT", "ref_logp_BT", "teacher_logp_BT",
               "teacher_logits_BTV"):
    x = getattr(batch, name)
    if x is not None and x.shape[:2] != (B, T):
      raise ValueError(f"SequenceBatch.{name} has shape {x.shape}; expected {(B, T)} leading "
                       f"(the targets tokens_BS[:, 1:] of S={S} tokens)")
  if micro_batches < 1 or B % micro_batches:
    raise ValueError(f"micro_batches={micro_batches} must divide the batch's {B} rows")
  if not lay.completion_len:
    if lay.packed or batch.pack_plan is not None:
      raise ValueError("SequenceBatch.pack_plan needs a layout with completion_len")
    return
  C = lay.completion_len
  if not 0 < C < S:
    raise ValueError(f"Layout.completion_len={C} must be in [1, S - 1 = {S - 1}] (sequences of "
                     f"S={S} tokens with at least one prompt column)")
  mask = np.asarray(batch.loss_mask_BT).astype(bool)
  outside = np.nonzero(mask[:, :T - C].any(axis=1))[0]
  if outside.size:
    raise ValueError(f"SequenceBatch.loss_mask_BT: row {outside[0]} scores a target in the prompt "
                     f"columns (the first {T - C} of T={T}); Layout.completion_len={C} must cover "
                     "every scored target")
  r = lay.rows_per_prompt
  if r > 1:
    if B % (r * micro_batches):
      raise ValueError(f"Layout.rows_per_prompt={r} must divide the {B // micro_batches} rows of "
                       f"each of the {micro_batches} micro-batch(es): each block of {r} "
                       "consecutive rows holds one prompt")
    P = S - C
    for name in ("tokens_BS", "positions_BS", "attn_mask_BS"):
      x = np.asarray(getattr(batch, name))[:, :P].reshape(B // r, r, P)
      bad = np.nonzero((x != x[:, :1]).any(axis=2).ravel())[0]
      if bad.size:
        raise ValueError(f"SequenceBatch.{name}: row {bad[0]} does not repeat the prompt columns "
                         f"of row {bad[0] // r * r} (Layout.rows_per_prompt={r}: each block of "
                         f"{r} consecutive rows holds one prompt)")
  if lay.packed != (batch.pack_plan is not None):
    raise ValueError(f"SequenceBatch: layout.packed={lay.packed} but pack_plan is "
                     f"{'missing' if lay.packed else 'set'}; build packed batches with `pack`")
  if lay.packed:
    _check_plan(np.asarray(batch.pack_plan), mask[:, T - C:], micro_batches)


def _check_plan(plan, win_mask_BC, micro_batches: int) -> None:
  """A packed stream must hold, per micro-batch, exactly the completion columns its scored
  targets need (`make_pack_plan`), each once."""
  B, C = win_mask_BC.shape
  if plan.ndim != 2 or plan.shape[0] != micro_batches:
    raise ValueError(f"SequenceBatch.pack_plan has shape {plan.shape}; expected "
                     f"[micro_batches={micro_batches}, stream slots]: make the plan with the "
                     "step's micro_batches (`pack`)")
  rows = B // micro_batches
  need = _needed_columns(win_mask_BC)
  for m in range(micro_batches):
    got = plan[m][plan[m] >= 0]
    want = np.concatenate([b * C + np.arange(need[m * rows + b]) for b in range(rows)])
    if got.shape != want.shape or (got != want).any():
      bad = sorted(set(got.tolist()) ^ set(want.tolist()))
      row = m * rows + (bad[0] // C if bad else 0)
      raise ValueError(f"SequenceBatch.pack_plan: micro-batch {m}'s stream does not hold row "
                       f"{row}'s needed completion columns exactly once, in order (the plan must "
                       "be `make_pack_plan` of the batch's loss mask)")


# ------------------------------------------------------------------------------- packing

def _needed_columns(win_mask_BC) -> np.ndarray:
  """Per row, how many leading completion columns its scored targets need: window column j >= 1
  reads the hidden state of completion column j - 1, so a row scoring up to window column J - 1
  needs columns 0 .. J - 2 (nothing when no target is scored: column 0 is the prompt's)."""
  C = win_mask_BC.shape[1]
  return np.where(win_mask_BC.any(1), C - 1 - np.argmax(win_mask_BC[:, ::-1], axis=1), 0)


def make_pack_plan(loss_mask_BT, completion_len: int, *, micro_batches: int = 1,
              bucket: int | None = None) -> np.ndarray:
  """The packed stream of a batch (host, numpy): int32 [micro_batches, stream slots], row m
  listing, for micro-batch m's rows in order, the flat index b * C + c (b the row within the
  micro-batch) of every completion column c that a scored target needs, -1 after the end. The
  length, the longest micro-batch's count, is rounded up to a multiple of `bucket` (default: C),
  so batches of similar lengths share one compiled step."""
  mask = np.asarray(loss_mask_BT).astype(bool)
  B, T = mask.shape
  C = completion_len
  if not 0 < C <= T:
    raise ValueError(f"make_pack_plan: completion_len={C} must be in [1, T={T}]")
  if micro_batches < 1 or B % micro_batches:
    raise ValueError(f"make_pack_plan: micro_batches={micro_batches} must divide the {B} rows")
  bucket = C if bucket is None else bucket
  if bucket < 1:
    raise ValueError(f"make_pack_plan: bucket={bucket} must be >= 1")
  need = _needed_columns(mask[:, T - C:])
  rows = B // micro_batches
  plans = [np.concatenate([b * C + np.arange(need[m * rows + b], dtype=np.int64)
                           for b in range(rows)]) for m in range(micro_batches)]
  longest = max(len(p) for p in plans)
  width = max(bucket, -(-longest // bucket) * bucket)
  out = np.full((micro_batches, width), -1, np.int32)
  for m, p in enumerate(plans):
    out[m, :len(p)] = p
  return out


def eighth_bucket(rows: int, completion_len: int) -> int:
  """A `make_pack_plan` bucket of an eighth of `rows` x C completion columns (at least C): a loop
  over batches of varying lengths compiles its step for at most 8 stream lengths."""
  return max(completion_len, rows * completion_len // 8)


def pack(batch: SequenceBatch, *, micro_batches: int = 1, bucket: int | None = None,
         check: bool = True) -> SequenceBatch:
  """`batch` with its completions packed (`make_pack_plan` of its loss mask, one plan row per
  micro-batch of the step; the stream rounded up to `bucket`, default an eighth of a
  micro-batch's completion columns). Needs a layout with completion_len. `check`: check the rows'
  layout first (off for rows taken from a checked batch); the plan is right by construction, so
  only a plan from elsewhere needs `check_layout`'s plan check."""
  C = batch.layout.completion_len
  if not C:
    raise ValueError("pack: the batch's layout has no completion_len (the completion width), "
                     "which tells the prompt columns from the completion's")
  B = batch.tokens_BS.shape[0]
  if micro_batches < 1 or B % micro_batches:
    raise ValueError(f"pack: micro_batches={micro_batches} must divide the batch's {B} rows")
  if check:
    check_layout(batch, micro_batches=micro_batches)
  if bucket is None:
    bucket = eighth_bucket(B // micro_batches, C)
  plan = make_pack_plan(batch.loss_mask_BT, C, micro_batches=micro_batches, bucket=bucket)
  return batch.replace(pack_plan=jnp.asarray(plan),
                       layout=dataclasses.replace(batch.layout, packed=True))


# ------------------------------------------------------------------------------- builders

def encode_prompt(tokenizer, prompt) -> list[int]:
  """Prompt ids of `prompt`, a text or an Example. With the tokenizer's chat template (an
  instruct model's, smjax.models.chat): the prompt as chat messages (`prompt_messages`: the
  Example's user message, and its system message where its domain gives one), rendered with the
  assistant's turn opened and encoded without added special tokens, as transformers'
  `apply_chat_template` does. Without one (the char tokenizer, config.model.chat_template="none"):
  BOS first when the tokenizer has one, then the prompt text."""
  template = getattr(tokenizer, "chat_template", None)
  if template is not None:
    from smjax.models.chat import prompt_messages  # pylint: disable=import-outside-toplevel
    return tokenizer.encode(template.render(prompt_messages(prompt)))
  ids = tokenizer.encode(prompt if isinstance(prompt, str) else prompt.prompt)
  return ([tokenizer.bos_id] if tokenizer.bos_id is not None else []) + ids


def decode_completions(tokenizer, result: RolloutResult) -> list[str]:
  """Completion texts (up to and excluding EOS) of every row."""
  toks = np.asarray(result.completion_BC)
  mask = np.asarray(result.completion_mask_BC, bool)
  return [tokenizer.decode(row[mrow].tolist()) for row, mrow in zip(toks, mask)]


def sft_batch(tokenizer, prompts: Sequence, targets: Sequence[str], *,
              seq_len: int) -> SequenceBatch:
  """Left-padded `prompt + target + EOS` rows (prompts: texts or Examples, `encode_prompt`); the
  loss covers target and EOS tokens only. Every target column is scored (prompts differ in
  length: Layout())."""
  if len(prompts) != len(targets):
    raise ValueError(f"sft_batch: {len(prompts)} prompts but {len(targets)} targets")
  B = len(prompts)
  tokens = np.full((B, seq_len), tokenizer.pad_id, np.int32)
  attn = np.zeros((B, seq_len), bool)
  loss = np.zeros((B, seq_len), bool)
  for i, (p, t) in enumerate(zip(prompts, targets)):
    p_ids = encode_prompt(tokenizer, p)
    t_ids = tokenizer.encode(t) + [tokenizer.eos_id]
    n = len(p_ids) + len(t_ids)
    if n > seq_len:
      raise ValueError(f"sft_batch: example {i} needs {n} tokens "
                       f"({p if isinstance(p, str) else p.prompt!r} -> {t!r}); "
                       f"seq_len={seq_len}")
    tokens[i, seq_len - n:] = p_ids + t_ids
    attn[i, seq_len - n:] = True
    loss[i, seq_len - len(t_ids):] = True
  return SequenceBatch(tokens_BS=jnp.asarray(tokens), positions_BS=positions_from_mask(attn),
                       attn_mask_BS=jnp.asarray(attn), loss_mask_BT=jnp.asarray(loss[:, 1:]))


def rollout_batch(result: RolloutResult, *, rewards_B=None, share_prompt: bool = True,
                  packed: bool = False, micro_batches: int = 1,
                  bucket: int | None = None) -> SequenceBatch:
  """The train-step view of a rollout: full sequences, target-aligned loss mask and behaviour
  log-probs (the sampler's temperature-1 log-probs; 0 on prompt targets).

  The layout is the sampler's: completions fill the last C = max_new_tokens columns, and with
  `share_prompt` each prompt's G samples are one block of rows whose prompt runs once. `packed`:
  the completions run as one stream (`pack`, one plan row per micro-batch of the step)."""
  seq = full_sequence(result)
  B, P = result.prompt_BP.shape
  C = result.completion_BC.shape[1]
  old_logp = jnp.concatenate([jnp.zeros((B, P - 1), jnp.float32),
                              result.logprobs_BC.astype(jnp.float32)], axis=1)
  layout = Layout(completion_len=C, rows_per_prompt=result.num_samples if share_prompt else 1,
                  group_size=result.num_samples)
  batch = SequenceBatch(
      tokens_BS=seq.tokens_BS, positions_BS=seq.positions_BS, attn_mask_BS=seq.mask_BS,
      loss_mask_BT=seq.loss_mask_BS[:, 1:], old_logp_BT=old_logp,
      rewards_B=None if rewards_B is None else jnp.asarray(rewards_B, jnp.float32),
      layout=layout)
  if packed:
    return pack(batch, micro_batches=micro_batches, bucket=bucket)
  check_layout(batch, micro_batches=micro_batches)
  return batch
