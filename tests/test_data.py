"""grain prompt pipelines: mixture weights, seeded shuffling, per-process sharding, domain tags,
tokenized prompts, and exact resume from a saved iterator state."""

import collections
import itertools
import json

import grain
import numpy as np
import pytest

from errors import one_line_error
from smjax.data import prompt_pipeline
from smjax.domains import get_domain
from smjax.models.tokenizer import CharTokenizer

ONE = grain.sharding.ShardOptions(shard_index=0, shard_count=1)


def _domains():
  return [get_domain("math"), get_domain("logic"), get_domain("strings")]


def _take(ds_or_it, n):
  it = iter(ds_or_it) if not hasattr(ds_or_it, "get_state") else ds_or_it
  return list(itertools.islice(it, n))


def _key(batch):
  return [(int(d), e.prompt, e.metadata["index"]) for d, e in zip(batch["domain_id"],
                                                                   batch["examples"])]


def test_batches_are_tagged_with_their_domain():
  doms = _domains()
  for batch in _take(prompt_pipeline(doms, batch_size=8, shard=ONE), 5):
    assert batch["domain_id"].dtype == np.int32 and batch["domain_id"].shape == (8,)
    for d, e, p in zip(batch["domain_id"], batch["examples"], batch["prompt"]):
      assert e.domain == doms[d].name and p == e.prompt and e.metadata["split"] == "train"


def test_mixture_follows_weights():
  ds = prompt_pipeline(_domains(), batch_size=16, weights=[6, 1, 1], shard=ONE)
  counts = collections.Counter(int(d) for b in _take(ds, 50) for d in b["domain_id"])
  frac = np.array([counts[i] for i in range(3)]) / 800
  np.testing.assert_allclose(frac, [0.75, 0.125, 0.125], atol=0.03)


def test_shuffle_is_deterministic_by_seed():
  a = [_key(b) for b in _take(prompt_pipeline(_domains(), batch_size=8, seed=1, shard=ONE), 4)]
  b = [_key(b) for b in _take(prompt_pipeline(_domains(), batch_size=8, seed=1, shard=ONE), 4)]
  c = [_key(b) for b in _take(prompt_pipeline(_domains(), batch_size=8, seed=2, shard=ONE), 4)]
  assert a == b and a != c
  # Shuffled: the example indices drawn from one domain are not simply 0, 1, 2, ...
  first = [i for batch in a for d, _, i in batch if d == 0][:8]
  assert first != sorted(first)


def test_epochs_cover_the_source_and_reshuffle():
  dom = [get_domain("math")]
  ds = prompt_pipeline(dom, batch_size=5, size=20, shard=ONE)
  epochs = [[i for b in _take_slice(ds, k * 4, 4) for _, _, i in _key(b)] for k in range(2)]
  assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(20))
  assert epochs[0] != epochs[1]


def _take_slice(ds, start, n):
  return list(itertools.islice(iter(ds), start, start + n))


def test_sharding_per_process_is_disjoint_and_complete():
  doms = [get_domain("math"), get_domain("logic")]
  seen = []
  for index in range(2):
    shard = grain.sharding.ShardOptions(shard_index=index, shard_count=2)
    ds = prompt_pipeline(doms, batch_size=4, size=40, shard=shard, num_epochs=1)
    seen.append({(d, i) for b in ds for d, _, i in _key(b)})
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == {(d, i) for d in range(2) for i in range(40)}
  assert {i % 2 for _, i in seen[0]} == {0} and {i % 2 for _, i in seen[1]} == {1}


def test_default_shard_is_this_jax_process():
  a = [_key(b) for b in _take(prompt_pipeline(_domains(), batch_size=4), 2)]
  b = [_key(b) for b in _take(prompt_pipeline(_domains(), batch_size=4, shard=ONE), 2)]
  assert a == b  # one process: shard 0 of 1


def test_resume_mid_epoch_gives_same_following_batches():
  make = lambda: iter(prompt_pipeline(_domains(), batch_size=6, weights=[2, 1, 1], size=30,
                                      seed=7, shard=ONE))
  it = make()
  _take(it, 7)  # part way into the second epoch of the math source
  state = it.get_state()
  state = json.loads(json.dumps(state))  # what a checkpoint stores and reads back
  expected = [_key(b) for b in _take(it, 9)]
  resumed = make()
  resumed.set_state(state)
  assert [_key(b) for b in _take(resumed, 9)] == expected
  fresh = [_key(b) for b in _take(make(), 9)]
  assert fresh != expected  # the state mattered


def test_tokenized_prompts_are_left_padded_with_bos():
  tok = CharTokenizer()
  batch = _take(prompt_pipeline(_domains(), batch_size=8, tokenizer=tok, max_prompt_len=24,
                                shard=ONE), 1)[0]
  tokens, mask = batch["prompt_tokens"], batch["prompt_mask"]
  assert tokens.shape == (8, 24) and tokens.dtype == np.int32
  for row, prompt in enumerate(batch["prompt"]):
    n = len(prompt) + 1
    assert (tokens[row, :24 - n] == tok.pad_id).all() and not mask[row, :24 - n].any()
    assert tokens[row, 24 - n] == tok.bos_id and mask[row, 24 - n:].all()
    # ids: pad 0, bos 1, eos 2, newline 3, then ASCII 32.. from 4
    assert "".join(chr(t - 4 + 32) if t > 3 else "\n" for t in tokens[row, 25 - n:]) == prompt
  with pytest.raises(ValueError, match="max_prompt_len=4"):
    _take(prompt_pipeline(_domains(), batch_size=2, tokenizer=tok, max_prompt_len=4, shard=ONE),
          1)


def test_file_domain_in_a_mixture(tmp_path):
  path = tmp_path / "q.jsonl"
  path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n"
                          for i in range(50)))
  file_dom = get_domain(f"jsonl_math:{path}")
  doms = [get_domain("math"), file_dom]
  batches = _take(prompt_pipeline(doms, batch_size=6, size=64, shard=ONE), 4)
  by_domain = collections.defaultdict(set)
  for b in batches:
    for d, e in zip(b["domain_id"], b["examples"]):
      by_domain[int(d)].add(e.prompt)
  assert set(by_domain) == {0, 1}
  train_q = {file_dom.format_prompt(r["question"]) for r in file_dom.records("train")}
  assert by_domain[1] <= train_q


def test_bad_arguments():
  with pytest.raises(ValueError, match=r"weights=\[1\] must be 3 positive numbers"):
    prompt_pipeline(_domains(), batch_size=4, weights=[1], shard=ONE)
  with pytest.raises(ValueError, match="batch_size=0 must be positive"):
    prompt_pipeline(_domains(), batch_size=0, shard=ONE)
  with pytest.raises(ValueError, match="split='dev' must be one of"):
    prompt_pipeline(_domains(), batch_size=4, split="dev", shard=ONE)


# ------------------------------------------------------------------ unreadable record files
# Each fault is one line naming the file (and the line), what was expected and what to do, and
# is raised before any record is used.

def _q(i):
  return json.dumps({"question": f"q{i}", "answer": str(i)}).encode() + b"\n"


def test_non_utf8_jsonl_names_file_and_line(tmp_path):
  path = tmp_path / "latin1.jsonl"
  path.write_bytes(_q(1) + _q(2) + b'{"question": "caf\xe9", "answer": "1"}\n' + _q(4))
  with pytest.raises(ValueError) as e:
    get_domain(f"jsonl_math:{path}").all_examples()
  one_line_error(e, f"{path}:3: not UTF-8 (byte 0xe9 at column 18)", "re-encode")


def test_jsonl_line_that_is_not_json_names_file_and_line(tmp_path):
  path = tmp_path / "broken.jsonl"
  path.write_bytes(_q(1) + b"\n" + b'{"question": "q", "answer": \n' + _q(4))
  with pytest.raises(ValueError) as e:
    get_domain(f"jsonl_math:{path}").all_examples()
  one_line_error(e, f"{path}:3: not valid JSON (Expecting value, column", "fix or remove")


def test_jsonl_record_missing_a_field_names_file_line_and_field(tmp_path):
  path = tmp_path / "partial.jsonl"
  path.write_bytes(_q(1) + b'{"question": "q2"}\n')
  with pytest.raises(ValueError) as e:
    get_domain(f"jsonl_math:{path}").all_examples()
  one_line_error(e, f"{path}:2: missing field 'answer' (or 'solution')",
                  "expected a string or a number", "add the field or remove the record")


def test_truncated_gzip_jsonl_is_named(tmp_path):
  import gzip
  blob = gzip.compress(b"".join(_q(i) for i in range(2000)))
  path = tmp_path / "cut.jsonl.gz"
  path.write_bytes(blob[:len(blob) // 2])
  with pytest.raises(ValueError) as e:
    get_domain(f"jsonl_math:{path}").all_examples()
  one_line_error(e, f"{path}: the gzip stream is truncated or corrupt after line", "EOFError",
                  "re-download or re-compress")
  not_gz = tmp_path / "plain.jsonl.gz"
  not_gz.write_bytes(_q(1))
  with pytest.raises(ValueError) as e:
    get_domain(f"jsonl_math:{not_gz}").all_examples()
  one_line_error(e, f"{not_gz}: the gzip stream is truncated or corrupt after line 0",
                  "BadGzipFile")


def test_parquet_that_is_not_parquet_is_named(tmp_path):
  path = tmp_path / "fake.parquet"
  path.write_bytes(_q(1) * 10)
  with pytest.raises(ValueError) as e:
    get_domain(f"jsonl_math:{path}").all_examples()
  one_line_error(e, f"{path}: not a readable Parquet file (", "re-export or re-download")


def test_empty_record_file_is_named(tmp_path):
  path = tmp_path / "empty.jsonl"
  path.write_bytes(b"\n\n")
  with pytest.raises(ValueError) as e:
    get_domain(f"jsonl_math:{path}").all_examples()
  one_line_error(e, f"{path}: no records", "expected at least one math record")
