"""grain pipelines of prompt batches for RL and distillation.

    ds = prompt_pipeline([get_domain("math"), get_domain("code")], weights=[3, 1],
                         split="train", seed=0, batch_size=16)
    it = iter(ds)
    batch = next(it)          # {"prompt", "domain_id", "examples"[, "prompt_tokens", ...]}
    state = it.get_state()    # save it with the checkpoint; it.set_state(state) resumes exactly

Each domain is a random-access grain source: toy domains generate example i on demand from a
virtual range (`size` indices, default 2**16), other domains are materialised once (reasoning-gym:
`size` examples, default 4096; files: every record of the split). Each source is sharded per JAX
process (a strided slice, so processes see disjoint examples), shuffled with a seed derived from
`seed` and the domain's position, repeated with a reshuffle per epoch, and the sources are mixed
with the given weights (grain's deterministic weighted interleave). Batches are tagged with the
position of each example's domain in `domains` (`domain_id`), which is how the RL loop routes
rewards and teachers. The iterator state is an index, so a resumed run yields the same batches.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import grain
import numpy as np

from smjax.domains.base import Domain, Example, ToyDomain, check_split, stable_seed

TOY_SOURCE_SIZE = 1 << 16
OTHER_SOURCE_SIZE = 4096


@dataclasses.dataclass(frozen=True)
class _ToyExample:
  """Picklable `index -> Example` for one toy domain and split."""
  domain: ToyDomain
  split: str
  seed: int
  difficulty: int | None

  def __call__(self, index: int) -> Example:
    return self.domain.example(self.split, int(index), self.seed, self.difficulty)


def domain_source(domain: Domain, *, split: str, seed: int, difficulty: int | None = None,
                  size: int | None = None) -> grain.MapDataset:
  """A random-access grain dataset of `domain`'s examples of `split` (unshuffled)."""
  check_split(split)
  if isinstance(domain, ToyDomain):
    return grain.MapDataset.range(size or TOY_SOURCE_SIZE).map(
        _ToyExample(domain, split, seed, difficulty))
  records = getattr(domain, "records", None)
  if size is None:
    size = len(records(split)) if callable(records) else OTHER_SOURCE_SIZE
  return grain.MapDataset.source(domain.generate(split, size, seed, difficulty))


@dataclasses.dataclass(frozen=True)
class _Collate:
  """[(domain_id, Example)] -> a batch dict (see prompt_pipeline)."""
  tokenizer: Any = None
  max_prompt_len: int | None = None

  def __call__(self, items: Sequence[tuple[int, Example]]) -> dict[str, Any]:
    ids = np.asarray([d for d, _ in items], np.int32)
    examples = [e for _, e in items]
    batch = {"prompt": np.asarray([e.prompt for e in examples], dtype=object),
             "domain_id": ids, "examples": examples}
    if self.tokenizer is not None:
      from smjax.batch import encode_prompt  # pylint: disable=import-outside-toplevel
      tok, width = self.tokenizer, self.max_prompt_len
      tokens = np.full((len(items), width), tok.pad_id, np.int32)
      for row, e in enumerate(examples):
        ids_ = encode_prompt(tok, e)   # as the sampler is fed it: BOS or the chat template
        if len(ids_) > width:
          raise ValueError(f"prompt of {len(ids_)} tokens (with BOS or chat template) > "
                           f"max_prompt_len={width}: "
                           f"{e.prompt[:60]!r} (domain {e.domain})")
        tokens[row, width - len(ids_):] = ids_  # left-padded: every prompt ends at column width-1
      batch["prompt_tokens"] = tokens
      batch["prompt_mask"] = tokens != tok.pad_id
    return batch


def _tag(domain_id: int):
  return lambda ex: (domain_id, ex)


def prompt_pipeline(domains: Sequence[Domain], *, batch_size: int, split: str = "train",
                    seed: int = 0, weights: Sequence[float] | None = None,
                    difficulty: int | None = None, size: int | None = None,
                    shard: grain.sharding.ShardOptions | None = None,
                    num_epochs: int | None = None, tokenizer: Any = None,
                    max_prompt_len: int | None = None,
                    read_options: grain.ReadOptions | None = None) -> grain.IterDataset:
  """A weighted mixture of `domains` as batches of prompts tagged with their domain id.

  Batches are dicts: "prompt" (object array of str [B]), "domain_id" (int32 [B], the index into
  `domains`), "examples" (list of Example, for the verifiers); with a tokenizer also
  "prompt_tokens" (int32 [B, max_prompt_len], `encode_prompt` of each prompt: BOS + prompt, or
  its chat template's rendering; left-padded) and "prompt_mask".
  shard: this process's share (default: grain.sharding.ShardByJaxProcess()); num_epochs: None
  repeats forever; a final partial batch is dropped. read_options: grain's prefetching (default:
  2 threads, 4 batches ahead; grain's own default of 500 batches makes every restore slow).
  """
  if not domains:
    raise ValueError("prompt_pipeline needs at least one domain")
  if batch_size <= 0:
    raise ValueError(f"{batch_size=} must be positive")
  if weights is None:
    weights = [1.0] * len(domains)
  if len(weights) != len(domains) or any(not w > 0 for w in weights):
    raise ValueError(f"weights={list(weights)} must be {len(domains)} positive numbers, one per "
                     f"domain {[d.name for d in domains]}")
  if tokenizer is not None and not max_prompt_len:
    raise ValueError("a tokenizer needs max_prompt_len")
  if shard is None:
    shard = grain.sharding.ShardByJaxProcess(drop_remainder=True)
  sources = []
  for domain_id, domain in enumerate(domains):
    src = domain_source(domain, split=split, seed=seed, difficulty=difficulty, size=size)
    src = src[shard.shard_index::shard.shard_count]
    if len(src) == 0:
      raise ValueError(f"domain {domain.name!r} has no {split} examples for shard "
                       f"{shard.shard_index} of {shard.shard_count}")
    src = src.shuffle(seed=stable_seed("shuffle", seed, domain_id) % 2**31)
    sources.append(src.repeat(num_epochs).map(_tag(domain_id)))
  mixed = sources[0] if len(sources) == 1 else grain.MapDataset.mix(sources, list(weights))
  batched = mixed.batch(batch_size, drop_remainder=True,
                        batch_fn=_Collate(tokenizer, max_prompt_len))
  return batched.to_iter_dataset(
      read_options or grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))


class PromptStream:
  """Batches of `Example`s from a grain iterator, with its checkpointable state."""

  def __init__(self, it, transform=None):
    self._it, self._transform = it, transform

  def __iter__(self):
    return self

  def __next__(self):
    examples = next(self._it)["examples"]
    return [self._transform(e) for e in examples] if self._transform else examples

  def get_state(self):
    return self._it.get_state()

  def set_state(self, state) -> None:
    self._it.set_state(state)
