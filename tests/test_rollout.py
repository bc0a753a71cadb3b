"""The rollout sampler against `transformers.generate`, a cache-free forward, numpy sampling
references and a chi-square test; stops, group sharing, determinism, meshes and FLOP reporting."""

import functools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.stats
import torch
import jax
import jax.numpy as jnp

from conftest import FAST_XLA_FLAGS
from hf_models import tiny_hf_model
from smjax import decode as dec
from smjax import rollout as ro
from smjax.flops import analytic_flops
from smjax.models import hf
from smjax.models.transformer import ModelConfig, Transformer, init_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ModelConfig(vocab_size=8, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16,
                   d_ff=64, max_seq_len=64, name="vocab8")


# ----------------------------------------------------------------------------- references

@functools.partial(jax.jit, static_argnums=0)
def _apply(cfg, params, toks, pos, mask):
  return Transformer(cfg).apply({"params": params}, toks, pos, mask)[0]


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _full_logits(cfg, params, result):
  """One cache-free forward over prompt ++ completion; positions and mask built here in numpy."""
  toks = np.concatenate([np.asarray(result.prompt_BP), np.asarray(result.completion_BC)], 1)
  mask = np.concatenate([np.asarray(result.prompt_mask_BP), np.asarray(result.completion_mask_BC)], 1)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  logits = _apply(cfg, params, jnp.asarray(toks), jnp.asarray(pos), jnp.asarray(mask))
  return np.asarray(logits, np.float64), toks, mask


def _allowed(logits_v, temperature, top_k, top_p):
  """Tokens HF's temperature -> top-k -> top-p warpers keep, and their renormalised probs."""
  z = logits_v / temperature
  keep = np.ones(len(z), bool)
  if top_k:
    keep &= z >= np.sort(z)[::-1][top_k - 1]
  p = np.where(keep, np.exp(z - z.max()), 0.0)
  p /= p.sum()
  order = np.argsort(-p, kind="stable")
  n = int(np.searchsorted(np.cumsum(p[order]), top_p - 1e-12) + 1)  # smallest prefix with mass >= top_p
  nucleus = np.zeros(len(z), bool)
  nucleus[order[:n]] = True
  keep &= nucleus
  q = np.where(keep, p, 0.0)
  return keep, q / q.sum()


def _chi2_pvalue(counts_list, probs_list):
  """One chi-square test over several independent multinomials (statistics and dofs add up)."""
  stat, dof = 0.0, 0
  for counts, probs in zip(counts_list, probs_list):
    expected = probs * counts.sum()
    big = expected >= 5  # pool the rare categories so the chi-square approximation holds
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
      obs, exp = obs[:-1], exp[:-1]
    stat += float(((obs - exp) ** 2 / exp).sum())
    dof += len(obs) - 1
  return scipy.stats.chi2.sf(stat, dof)


def _prompts(rng, n, lo, hi, vocab, lengths=None):
  lengths = lengths or [int(rng.randint(lo, hi)) for _ in range(n)]
  return [[int(t) for t in rng.randint(3, vocab, L)] for L in lengths]


# ------------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
  out = {}
  for seed, fam in enumerate(("qwen3", "llama")):
    model = tiny_hf_model(fam, seed=seed)
    model.generation_config.eos_token_id = None
    path = str(tmp_path_factory.mktemp(fam))
    model.save_pretrained(path)
    cfg, params = hf.load_params(path)
    out[fam] = (model, cfg, jax.device_put(params))
  return out


def random_params(cfg, seed, scale):
  """N(0, scale^2) matrices and unit norm scales in the model's parameter layout (numpy-filled,
  so no init program has to compile)."""
  rs = np.random.RandomState(seed)
  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
  return jax.tree.map(lambda a: jnp.asarray(rs.normal(0, scale, a.shape) if len(a.shape) >= 2
                                            else np.ones(a.shape), a.dtype), shapes)


@pytest.fixture(scope="module")
def tiny():
  # Large weights, so the 8 token probabilities are far from uniform.
  return TINY, random_params(TINY, 0, 0.3)


# ---------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("fam", ["qwen3", "llama"])
def test_greedy_matches_transformers_generate(hf_models, fam):
  model, cfg, params = hf_models[fam]
  prompts = _prompts(np.random.RandomState(0), 3, 0, 0, cfg.vocab_size, lengths=[7, 3, 12])
  sampler = ro.Sampler(cfg, max_new_tokens=32, eos_id=None, pad_id=0, prompt_buckets=(16,))
  res = sampler.generate(params, prompts, jax.random.key(0), greedy=True)
  P = res.prompt_BP.shape[1]
  assert P == 16
  with torch.no_grad():
    ref = model.generate(torch.tensor(np.asarray(res.prompt_BP), dtype=torch.long),
                         attention_mask=torch.tensor(np.asarray(res.prompt_mask_BP),
                                                     dtype=torch.long),
                         max_new_tokens=32, do_sample=False, pad_token_id=0)
  np.testing.assert_array_equal(np.asarray(res.completion_BC), ref[:, P:].numpy())
  assert np.asarray(res.completion_mask_BC).all() and list(np.asarray(res.lengths_B)) == [32] * 3
  assert res.steps_run == 31 and res.program_calls[1].calls == 31
  # Greedy log-probs are still the policy's at the chosen tokens.
  logits, toks, _ = _full_logits(cfg, params, res)
  want = np.take_along_axis(_log_softmax(logits[:, P - 1:-1]), toks[:, P:, None], -1)[..., 0]
  assert np.abs(np.asarray(res.logprobs_BC) - want).max() <= 1e-5


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_logprobs_are_temperature_one_policy(hf_models, temperature, top_p):
  _, cfg, params = hf_models["qwen3"]
  prompts = _prompts(np.random.RandomState(1), 3, 2, 12, cfg.vocab_size)
  # The greedy test's program (3 prompts, bucket 16, 32 new tokens) serves every mode. Four EOS
  # ids, so that some rows stop and have masked tails.
  sampler = ro.Sampler(cfg, max_new_tokens=32, eos_id=(5, 6, 7, 8), pad_id=0,
                       prompt_buckets=(16,))
  res = sampler.generate(params, prompts, jax.random.key(3), temperature=temperature, top_p=top_p)
  logits, toks, mask = _full_logits(cfg, params, res)
  P, m = res.prompt_BP.shape[1], np.asarray(res.completion_mask_BC)
  prev = logits[:, P - 1:-1]  # logits at s predict token s + 1
  policy = np.take_along_axis(_log_softmax(prev), toks[:, P:, None], -1)[..., 0]
  got = np.asarray(res.logprobs_BC)
  assert np.abs(np.where(m, got - policy, 0)).max() <= 1e-5
  assert (got[~m] == 0).all()
  # Every sampled token lies in the warped distribution's support (temperature, then top-p).
  for b, t in zip(*np.nonzero(m)):
    keep, _ = _allowed(prev[b, t], temperature, 0, top_p)
    assert keep[toks[b, P + t]], "sampled a token the nucleus excludes"
  # The full-sequence view the train step consumes.
  fs = ro.full_sequence(res)
  np.testing.assert_array_equal(np.asarray(fs.tokens_BS), toks)
  np.testing.assert_array_equal(np.asarray(fs.mask_BS), mask)
  np.testing.assert_array_equal(np.asarray(fs.positions_BS)[mask],
                                (np.cumsum(mask, 1) - 1)[mask])
  np.testing.assert_array_equal(np.asarray(fs.loss_mask_BS)[:, :P], 0)
  np.testing.assert_array_equal(np.asarray(fs.loss_mask_BS)[:, P:], m)


# The vocabulary-8 tests share one decode program: 4 prompts x 512 samples, bucket 8, 16 new
# tokens (and one more prefill for 2048 single-sample prompts).
TINY_RUN = dict(max_new_tokens=16, pad_id=0, prompt_buckets=(8,))
G = 512


def _tiny_prompts(seed):
  return _prompts(np.random.RandomState(seed), 4, 2, 8, 8)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (1.0, 3, 1.0),
                                                     (1.0, 0, 0.7), (1.5, 4, 0.8)])
def test_sampled_frequencies_match_softmax(tiny, temperature, top_k, top_p):
  """First tokens against the (warped) softmax of an independent forward: chi-square, and zero
  counts outside the top-k / top-p set computed in numpy."""
  cfg, params = tiny
  sampler = ro.Sampler(cfg, eos_id=None, **TINY_RUN)
  res = sampler.generate(params, _tiny_prompts(0), jax.random.key(0), num_samples=G,
                         temperature=temperature, top_k=top_k, top_p=top_p)
  logits, toks, _ = _full_logits(cfg, params, res)
  P = res.prompt_BP.shape[1]
  counts_list, probs_list = [], []
  for b in range(0, 4 * G, G):
    counts = np.bincount(toks[b:b + G, P], minlength=8)
    keep, q = _allowed(logits[b, P - 1], temperature, top_k, top_p)
    assert counts[~keep].sum() == 0, (counts, keep)
    if top_k or top_p < 1:
      assert keep.sum() < 8  # the filter is active for this prompt
    counts_list.append(counts[keep])
    probs_list.append(q[keep])
  assert _chi2_pvalue(counts_list, probs_list) > 1e-4, (counts_list, probs_list)
  if top_k or top_p < 1:  # later tokens, in other contexts, stay inside their sets too
    for b in range(0, 4 * G, 61):
      for t in range(1, 16):
        keep, _ = _allowed(logits[b, P + t - 1], temperature, top_k, top_p)
        assert keep[toks[b, P + t]], (b, t)


def _truncate(tokens, stop_at):
  """Expected (lengths, mask) of rows stopped at the first index where stop_at(row, i) holds."""
  B, T = tokens.shape
  lengths = np.full(B, T)
  for b in range(B):
    for i in range(T):
      if stop_at(tokens[b], i):
        lengths[b] = i + 1
        break
  return lengths, np.arange(T)[None] < lengths[:, None]


def test_eos_stops_rows(tiny):
  cfg, params = tiny
  prompts, key = _tiny_prompts(3), jax.random.key(11)
  a = ro.Sampler(cfg, eos_id=None, **TINY_RUN).generate(params, prompts, key, num_samples=G)
  b = ro.Sampler(cfg, eos_id=(6, 2), **TINY_RUN).generate(params, prompts, key, num_samples=G)
  toks = np.asarray(a.completion_BC)
  lengths, mask = _truncate(toks, lambda row, i: row[i] in (6, 2))
  assert (lengths < 16).mean() > 0.5 and (lengths == 16).any()
  np.testing.assert_array_equal(np.asarray(b.lengths_B), lengths)
  np.testing.assert_array_equal(np.asarray(b.completion_mask_BC), mask)
  np.testing.assert_array_equal(np.asarray(b.completion_BC), np.where(mask, toks, 0))
  np.testing.assert_allclose(np.asarray(b.logprobs_BC),
                             np.where(mask, np.asarray(a.logprobs_BC), 0), atol=1e-6)
  assert a.steps_run == b.steps_run == 15 and b.program_calls[1].calls == 15


def test_loop_ends_when_every_row_is_done_and_steps_are_counted(tiny):
  """Greedy rows of one prompt are identical; EOS := each prompt's greedy token at index 2 or
  earlier, so every row stops by its third token and the loop runs at most 2 decode steps."""
  cfg, params = tiny
  prompts, key = _tiny_prompts(4), jax.random.key(0)
  free = ro.Sampler(cfg, eos_id=None, **TINY_RUN).generate(params, prompts, key, num_samples=G,
                                                            greedy=True)
  toks = np.asarray(free.completion_BC)
  eos = sorted({int(toks[b, 2]) for b in range(0, 4 * G, G)})
  res = ro.Sampler(cfg, eos_id=eos, **TINY_RUN).generate(params, prompts, key, num_samples=G,
                                                          greedy=True)
  lengths, mask = _truncate(toks, lambda row, i: row[i] in eos)
  assert lengths.max() <= 3
  np.testing.assert_array_equal(np.asarray(res.lengths_B), lengths)
  np.testing.assert_array_equal(np.asarray(res.completion_mask_BC), mask)
  assert free.steps_run == 15 and res.steps_run == lengths.max() - 1
  pre, step = res.program_calls
  assert (pre.phase, pre.calls, step.phase, step.calls) == ("rollout/prefill", 1, "rollout/decode",
                                                          res.steps_run)


def test_stop_sequences_stop_rows(tiny):
  cfg, params = tiny
  sampler = ro.Sampler(cfg, eos_id=None, **TINY_RUN)
  prompts, key = _tiny_prompts(5), jax.random.key(5)
  stops = [[6, 2], [1, 3, 3]]
  a = sampler.generate(params, prompts, key, num_samples=G)
  b = sampler.generate(params, prompts, key, num_samples=G, stop_sequences=stops)
  toks = np.asarray(a.completion_BC)
  ends = lambda row, i: any(i + 1 >= len(s) and list(row[i + 1 - len(s):i + 1]) == s for s in stops)
  lengths, mask = _truncate(toks, ends)
  assert (lengths < 16).mean() > 0.05 and (lengths == 16).any()
  assert any(lengths[r] >= 3 and list(toks[r, lengths[r] - 3:lengths[r]]) == [1, 3, 3]
             for r in range(4 * G))  # the 3-token sequence fired somewhere
  np.testing.assert_array_equal(np.asarray(b.lengths_B), lengths)
  np.testing.assert_array_equal(np.asarray(b.completion_BC), np.where(mask, toks, 0))


def test_shared_prefill_equals_separate_copies(tiny):
  cfg, params = tiny
  sampler = ro.Sampler(cfg, eos_id=None, **TINY_RUN)
  prompts, key = _tiny_prompts(6), jax.random.key(9)
  grouped = sampler.generate(params, prompts, key, num_samples=G)
  copies = sampler.generate(params, [p for p in prompts for _ in range(G)], key, num_samples=1)
  np.testing.assert_array_equal(np.asarray(grouped.prompt_BP), np.asarray(copies.prompt_BP))
  np.testing.assert_array_equal(np.asarray(grouped.completion_BC), np.asarray(copies.completion_BC))
  # Prefill over 4 vs 2048 rows may round differently in the last bits.
  np.testing.assert_allclose(np.asarray(grouped.logprobs_BC), np.asarray(copies.logprobs_BC),
                             atol=1e-5)
  assert len({tuple(r) for r in np.asarray(grouped.completion_BC)[:G]}) > G // 2  # samples differ


def test_deterministic_per_key_and_no_recompile(tiny):
  cfg, params = tiny
  sampler = ro.Sampler(cfg, eos_id=None, **TINY_RUN)
  prompts = _tiny_prompts(7)
  a = sampler.generate(params, prompts, jax.random.key(1), num_samples=G)
  sizes = (dec.prefill._cache_size(), dec.decode_loop._cache_size())
  b = sampler.generate(params, prompts, jax.random.key(1), num_samples=G)
  c = sampler.generate(params, prompts, jax.random.key(2), num_samples=G)
  np.testing.assert_array_equal(np.asarray(a.completion_BC), np.asarray(b.completion_BC))
  np.testing.assert_array_equal(np.asarray(a.logprobs_BC), np.asarray(b.logprobs_BC))
  assert (np.asarray(a.completion_BC) != np.asarray(c.completion_BC)).mean() > 0.5
  # Other prompts of the same bucket, greedy, other temperatures, top-k/p, EOS ids and stop
  # sequences all reuse the compiled programs.
  other = _tiny_prompts(8)
  sampler.generate(params, other, jax.random.key(3), num_samples=G, temperature=0.5, top_k=3)
  sampler.generate(params, other, jax.random.key(3), num_samples=G, greedy=True,
                   stop_sequences=[[1, 2, 3]])
  ro.Sampler(cfg, eos_id=3, **TINY_RUN).generate(params, other, jax.random.key(3), num_samples=G)
  assert (dec.prefill._cache_size(), dec.decode_loop._cache_size()) == sizes
  # The ledger's abstract decode arguments, traced once per argument shapes (Sampler._eval_shape),
  # are those a fresh sampler traces, at this batch and at another.
  shapes = lambda r: [jax.tree.map(lambda x: (x.shape, x.dtype), c.args)  # noqa: E731
                      for c in r.program_calls]
  fresh = lambda g: ro.Sampler(cfg, eos_id=None, **TINY_RUN).generate(  # noqa: E731
      params, prompts, jax.random.key(1), num_samples=g)
  assert shapes(a) == shapes(b) == shapes(fresh(G))
  kept = len(sampler._shapes)   # pylint: disable=protected-access
  half = sampler.generate(params, prompts, jax.random.key(1), num_samples=G // 2)
  assert shapes(half) == shapes(fresh(G // 2)) != shapes(a)
  assert len(sampler._shapes) > kept   # pylint: disable=protected-access


def _hand_forward_flops(cfg, *, tokens, context, logit_tokens=None):
  """Forward FLOPs written out from the dims: 2 per weight of q, k, v, o and the 3 MLP matrices a
  token multiplies, 2·D·V per token whose logits are computed, 4·N·H per layer and attended key."""
  d, n, k, h, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
  logit_tokens = tokens if logit_tokens is None else logit_tokens
  layer = d * n * h + d * k * h + d * k * h + n * h * d + 3 * d * f
  return (2 * cfg.n_layers * layer * tokens + 2 * d * cfg.vocab_size * logit_tokens
          + 4 * cfg.n_layers * n * h * context * tokens)


def test_program_flops_match_analytic(tiny):
  cfg, params = tiny
  prompts = _tiny_prompts(9)
  res = ro.Sampler(cfg, eos_id=None, **TINY_RUN).generate(params, prompts, jax.random.key(0),
                                                          num_samples=G)
  pre, step = res.program_calls
  rows, slots = 4 * G, 8 + 16 - 1
  padded = _hand_forward_flops(cfg, tokens=rows, context=slots)
  assert 0.8 * padded < step.flops_per_call() < 2.0 * padded, (step.flops_per_call(), padded)
  assert step.calls == 15 and step.flops() == step.flops_per_call() * 15
  # The prefill call's arguments lower as recorded; HLO-level cost (no compile needed here).
  pre_flops = pre.fn.lower(*pre.args, **pre.kwargs).cost_analysis()["flops"]
  prefill_padded = _hand_forward_flops(cfg, tokens=4 * 8, context=4.5, logit_tokens=4)
  assert 0.8 * prefill_padded < pre_flops, (pre_flops, prefill_padded)
  # useful: real tokens only; each row forwards 15 decode tokens, token j attending to L + j + 1.
  L = np.repeat([len(p) for p in prompts], G).astype(float)
  ctx = (15 * L + 15 * 16 / 2).sum()
  assert step.useful == pytest.approx(_hand_forward_flops(cfg, tokens=rows * 15,
                                                         context=ctx / (rows * 15)))
  assert pre.useful == pytest.approx(_hand_forward_flops(
      cfg, tokens=sum(map(len, prompts)),
      context=sum(len(p) * (len(p) + 1) / 2 for p in prompts) / sum(map(len, prompts)),
      logit_tokens=4))


def test_forward_flops_count_used_by_rollout_and_teachers():
  # rollout's and the teachers' useful FLOPs: smjax.flops.analytic_flops(backward=False).
  cfg = ModelConfig(vocab_size=100, d_model=8, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=4,
                    d_ff=20, qkv_bias=True, qk_norm=True)
  # per layer: q 8*16 + k,v 2*8*8 + o 16*8 + mlp 3*8*20 = 864 weights (biases, norms not counted)
  want = 2 * 3 * 864 * 10 + 2 * 8 * 100 * 2 + 4 * 3 * 16 * 10 * 5.5
  assert analytic_flops(cfg, tokens=10, context_len=5.5, backward=False, logit_tokens=2) == want
  assert _hand_forward_flops(cfg, tokens=10, context=5.5, logit_tokens=2) == want


_MESH_SCRIPT = r"""
import json
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from smjax import rollout as ro, sharding
from smjax.models.transformer import ModelConfig, init_params
cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2, head_dim=8,
                  d_ff=64, max_seq_len=64)
rs = np.random.RandomState(0)
params = jax.tree.map(lambda a: np.asarray(rs.normal(0, 0.1, a.shape) if len(a.shape) >= 2 else
                                           np.ones(a.shape), a.dtype),
                      jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))
rs = np.random.RandomState(0)
prompts = [[int(t) for t in rs.randint(3, 64, rs.randint(2, 12))] for _ in range(3)]
mesh = sharding.make_mesh(data=8)
# Parameters arrive sharded (each matrix's last dim split over the 8 devices).
sharded = jax.tree.map(lambda x: jax.device_put(x, NamedSharding(
    mesh, P(*([None] * (x.ndim - 1)), "data") if x.ndim >= 2 and x.shape[-1] % 8 == 0 else P())),
    params)
out = {"param_shards": len(sharded["embed"].sharding.device_set)}
for name, m, p in [("single", None, params), ("data8", mesh, sharded)]:
  s = ro.Sampler(cfg, max_new_tokens=8, eos_id=None, pad_id=0, prompt_buckets=(16,), mesh=m)
  # 3 prompts x 2 samples = 6 rows: on the mesh, padded to 8 with dummy rows and cut back.
  g = s.generate(p, prompts, jax.random.key(0), num_samples=2, greedy=True)
  r = s.generate(p, prompts, jax.random.key(0), num_samples=2, temperature=1.5)
  out[name] = dict(greedy=np.asarray(g.completion_BC).tolist(),
                   sampled=np.asarray(r.completion_BC).tolist(),
                   lp=np.asarray(r.logprobs_BC).tolist(),
                   devices=len(r.completion_BC.sharding.device_set))
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module", autouse=True)
def mesh_run(request):
  """Starts the 8-device subprocess when the module starts (if its test is selected), so that its
  compiles overlap the other tests' on a second core."""
  if not any(item.name == "test_mesh_matches_single_device" for item in request.session.items):
    yield None
    return
  # The suite's fast-compile flags (conftest.py): compiles are the cost here, and both sides of
  # each comparison run in the same process under the same flags.
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count=8 {FAST_XLA_FLAGS}",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.Popen([sys.executable, "-c", _MESH_SCRIPT], env=env, cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  yield proc
  if proc.poll() is None:
    proc.kill()
    proc.communicate()


def test_mesh_matches_single_device(mesh_run):
  stdout, stderr = mesh_run.communicate(timeout=300)
  assert mesh_run.returncode == 0, stderr[-3000:]
  out = json.loads(stdout.split("RESULT", 1)[1])
  single, data8 = out["single"], out["data8"]
  assert out["param_shards"] == 8 and single["devices"] == 1 and data8["devices"] == 8
  assert len(single["greedy"]) == 6 and len(single["greedy"][0]) == 8
  assert data8["greedy"] == single["greedy"]
  assert data8["sampled"] == single["sampled"] and single["sampled"] != single["greedy"]
  np.testing.assert_allclose(data8["lp"], single["lp"], atol=1e-5)


def test_bad_inputs_raise_naming_the_field(tiny):
  cfg, params = tiny
  sampler = ro.Sampler(cfg, eos_id=None, **TINY_RUN)
  key = jax.random.key(0)
  for prompts, kw, words in [([[1, 2], []], {}, "prompts[1] is empty"),
                             ([[1, 9]], {}, "outside [0, 8)"),
                             ([[1] * 9], {}, "largest prompt bucket 8"),
                             ([[1]], dict(top_p=0.0), "top_p"),
                             ([[1]], dict(num_samples=0), "num_samples"),
                             ([[1]], dict(stop_sequences=[[]]), "stop_sequences")]:
    with pytest.raises(ValueError) as err:
      sampler.generate(params, prompts, key, **kw)
    assert words in str(err.value), (words, str(err.value))
  with pytest.raises(ValueError, match="max_new_tokens"):
    ro.Sampler(cfg, max_new_tokens=0, eos_id=None, pad_id=0)
