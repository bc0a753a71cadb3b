"""`smjax eval MODEL_DIR --data FILE`: a Hugging Face model directory (one `smjax export` wrote, or
any Qwen2/2.5, Qwen3 or Llama 3 checkpoint smjax.models.hf reads) scored on a data file of the
study's real-data domains, with a 95 % interval.

  smjax eval /tmp/student --data /data/gsm8k_test.jsonl
  smjax eval /tmp/student --data mbpp.jsonl --domain code --samples 8 --json /tmp/mbpp.json

The data is every record of FILE (.jsonl, .jsonl.gz or .parquet; smjax.domains.records):
`{question, answer}` math records, verified with math-verify, or `{prompt, tests, entry_point}`
code records, run in the sandbox (smjax.domains.real), or a published GSM8K, MATH, MBPP or
HumanEval file in its own schema (smjax.domains.datasets); `--domain` (math or code) says which,
else the first record's fields do. Prompts are fed as the study fed them (smjax.batch.
encode_prompt): as chat messages through the directory's chat template where it has one (an
instruct model, or the export of a study on one), else BOS where the tokenizer has one and the
domain's prompt text; `--chat-template none` feeds raw text (the export of a study run with
config.model.chat_template="none"), so an exported student is scored as it was trained. Each
prompt gets `--samples` completions at `--temperature` (0: one greedy
completion) of up to `--max-new-tokens` tokens (smjax.train.evaluate.Evaluator, the study's
evaluation, with its fixed sampling keys). The accuracy is the mean over prompts of the share of
a prompt's samples that are right; its interval is Wilson's over prompts
(smjax.study.stats.wilson_interval: conservative with several samples per prompt, and not a
point when every prompt scored alike). The model's context is raised to fit the longest prompt
plus the token cap where its config.json says less (RoPE: the context is the cache's size, not a
parameter), as the study does for its teachers. Why: docs/design.md#export-and-evaluation.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys

CONFIDENCE = 0.95
KINDS = {"math": "jsonl_math", "code": "jsonl_code", "jsonl_math": "jsonl_math",
         "jsonl_code": "jsonl_code"}


def _kind(data: str, domain: str | None) -> str:
  """The record kind of `data`: `domain` (math or code), else read off its first record."""
  if domain is not None:
    if domain not in KINDS:
      raise ValueError(f"--domain {domain}: expected math ({{question, answer}} records) or code "
                       "({prompt, tests, entry_point} records)")
    return KINDS[domain]
  from smjax.domains.records import _read_raw  # pylint: disable=import-outside-toplevel
  raw = _read_raw(os.path.abspath(os.path.expanduser(data)))
  first = raw[0][1] if raw else {}
  fields = sorted(first) if isinstance(first, dict) else []
  if "entry_point" in fields or "test_list" in fields:   # test_list: MBPP's own schema
    return "jsonl_code"
  if "question" in fields or "problem" in fields:
    return "jsonl_math"
  raise ValueError(f"{data}: cannot tell the domain from its first record's fields {fields}; "
                   "give --domain math ({question, answer}) or --domain code ({prompt, tests, "
                   "entry_point})")


def load_model(model_dir: str, *, min_seq_len: int = 0, chat_template: str = "auto"):
  """(ModelConfig, params as jax arrays, tokenizer) of a Hugging Face directory, its context at
  least `min_seq_len`. The weights keep the dtype config.json names (float32 otherwise);
  `chat_template`: "auto" (the directory's, where it has one) or "none"."""
  # pylint: disable=import-outside-toplevel
  import jax
  import jax.numpy as jnp
  from smjax.models import hf
  cfg, tokenizer = _config_and_tokenizer(model_dir, chat_template)
  cfg = cfg.replace(max_seq_len=max(cfg.max_seq_len, min_seq_len))
  _, params = hf.load_params(model_dir, cfg)
  return cfg, jax.tree.map(jnp.asarray, params), tokenizer


def _config_and_tokenizer(model_dir: str, chat_template: str = "auto"):
  # pylint: disable=import-outside-toplevel
  from smjax.json_io import read_json
  from smjax.models import hf
  from smjax.models.tokenizer import load_tokenizer
  cfg = hf.config_from_hf(model_dir)   # names config.json when the directory has none
  stored = read_json(os.path.join(model_dir, "config.json"), "fix the model directory")
  dtype = stored.get("torch_dtype") or stored.get("dtype")
  if dtype in ("float32", "bfloat16", "float16"):
    cfg = cfg.replace(param_dtype=dtype, dtype=dtype)
  tokenizer = load_tokenizer(model_dir, chat_template)
  if tokenizer.vocab_size > cfg.vocab_size:
    raise ValueError(f"{model_dir}: the tokenizer has {tokenizer.vocab_size} ids but config.json "
                     f"says vocab_size={cfg.vocab_size}; the tokenizer files and config.json must "
                     "come from the same model")
  return cfg, tokenizer


def evaluate(model_dir: str, data: str, *, domain: str | None = None, samples: int = 4,
             max_new_tokens: int = 256, temperature: float = 1.0, batch_size: int = 16,
             chat_template: str = "auto") -> dict:
  """Scores the model in `model_dir` on every record of `data` (module docstring). Returns
  {"model", "data", "domain", "prompts", "samples", "temperature", "max_new_tokens", "accuracy",
  "lo", "hi", "confidence", "interval", "pass_at_k", "mean_length", "at_cap", "per_prompt": [{
  "where", "correct" (of `samples`)}], "completions" (the first prompts' first samples)}."""
  if not os.path.exists(data):
    raise FileNotFoundError(f"--data {data}: no such file (expected a .jsonl, .jsonl.gz or "
                            ".parquet file of math or code records)")
  for flag, value, least in (("--samples", samples, 1), ("--max-new-tokens", max_new_tokens, 1),
                             ("--batch-size", batch_size, 1)):
    if value < least:
      raise ValueError(f"{flag} {value}: expected an integer >= {least}")
  if not temperature >= 0:
    raise ValueError(f"--temperature {temperature}: expected a number >= 0 (0: greedy)")
  if temperature == 0 and samples != 1:
    raise ValueError(f"--samples {samples} with --temperature 0: greedy decoding gives one "
                     "completion per prompt; give --samples 1 or a temperature above 0")
  # pylint: disable=import-outside-toplevel
  from smjax.batch import encode_prompt
  from smjax.domains import get_domain
  from smjax.rewards.verify import verify_batch
  from smjax.rollout import Sampler
  from smjax.study.stats import wilson_interval
  from smjax.train.evaluate import Evaluator
  cfg, tokenizer = _config_and_tokenizer(model_dir, chat_template)
  dom = get_domain(f"{_kind(data, domain)}:{os.path.abspath(os.path.expanduser(data))}")
  examples = dom.all_examples()
  longest = 0
  for e in examples:
    try:
      longest = max(longest, len(encode_prompt(tokenizer, e)))
    except ValueError as err:   # the char tokenizer: a character outside its table
      raise ValueError(f"{e.metadata['where']}: {err}") from None
  cfg, params, tokenizer = load_model(model_dir, min_seq_len=longest + max_new_tokens,
                                      chat_template=chat_template)
  sampler = Sampler(cfg, max_new_tokens=max_new_tokens, eos_id=tokenizer.eos_id,
                    pad_id=tokenizer.pad_id)
  verify = functools.partial(verify_batch, domains={dom.name: dom})
  evaluator = Evaluator(sampler, tokenizer, {dom.name: examples}, verify,
                        batch_size=min(batch_size, len(examples)), samples=samples,
                        temperature=temperature, greedy=False, phase="eval/model")
  fields, _ = evaluator(params)
  correct = fields["correct"][dom.name]
  acc = fields["accuracy"][dom.name]
  lo, hi = wilson_interval(acc, len(examples), CONFIDENCE)
  return {"model": os.path.abspath(model_dir), "data": os.path.abspath(data), "domain": dom.name,
          "prompts": len(examples), "samples": samples, "temperature": temperature,
          "max_new_tokens": max_new_tokens, "accuracy": acc, "lo": lo, "hi": hi,
          "confidence": CONFIDENCE, "interval": "wilson over prompts",
          "pass_at_k": fields["pass_at_k"][dom.name], "mean_length": fields["length"][dom.name],
          "at_cap": fields["at_cap"][dom.name],
          "per_prompt": [{"where": e.metadata["where"], "correct": c}
                         for e, c in zip(examples, correct)],
          "completions": fields["completions"][dom.name]}


def summary(r: dict) -> str:
  """The result as the two lines `smjax eval` prints."""
  how = ("1 greedy completion each" if r["temperature"] == 0 else
         f"{r['samples']} sample{'s' if r['samples'] > 1 else ''} each at temperature "
         f"{r['temperature']:g}")
  pct = lambda x: "nan" if math.isnan(x) else f"{100 * x:.1f}%"
  return (f"{r['model']} on {r['data']} ({r['domain'].split(':')[0]}, {r['prompts']} prompts, "
          f"{how}, up to {r['max_new_tokens']} new tokens):\n"
          f"accuracy {pct(r['accuracy'])} ({100 * r['confidence']:g}% interval {pct(r['lo'])} to "
          f"{pct(r['hi'])}, Wilson over prompts), pass@{r['samples']} {pct(r['pass_at_k'])}, "
          f"mean length {r['mean_length']:.1f} tokens, {pct(r['at_cap'])} at the token cap")


def main(argv: list[str] | None = None) -> int:
  """`smjax eval` (module docstring): prints the accuracy and its interval; `--json FILE` writes
  the whole result (local or gs://)."""
  from smjax import paths  # pylint: disable=import-outside-toplevel
  from smjax.main import OneLineParser  # pylint: disable=import-outside-toplevel
  p = OneLineParser(prog="smjax eval", description=__doc__.split("\n\n")[0])
  p.add_argument("model_dir", help="a Hugging Face model directory (config.json, safetensors, "
                 "tokenizer files), e.g. one `smjax export` wrote")
  p.add_argument("--data", required=True, metavar="FILE",
                 help="math {question, answer} or code {prompt, tests, entry_point} records: "
                 ".jsonl, .jsonl.gz or .parquet")
  p.add_argument("--domain", default=None, metavar="NAME",
                 help="math or code (default: from the first record's fields)")
  p.add_argument("--samples", type=int, default=None, metavar="K",
                 help="completions per prompt (default 4; 1 with --temperature 0)")
  p.add_argument("--max-new-tokens", type=int, default=256, metavar="N",
                 help="token cap per completion (default 256)")
  p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                 help="sampling temperature, the study's default 1.0 (0: greedy, --samples 1)")
  p.add_argument("--batch-size", type=int, default=16, metavar="B",
                 help="prompts per sampler call (default 16)")
  p.add_argument("--chat-template", default="auto", choices=("auto", "none"),
                 help="auto: prompts as chat through the directory's chat template where it has "
                 "one (as the study does by default); none: raw text")
  p.add_argument("--json", default=None, metavar="FILE", help="also write the result as JSON")
  a = p.parse_args(argv)
  if a.json:
    paths.check_workdir(a.json, checkpoints=False)
  samples = a.samples if a.samples is not None else 1 if a.temperature == 0 else 4
  r = evaluate(a.model_dir, a.data, domain=a.domain, samples=samples,
               max_new_tokens=a.max_new_tokens, temperature=a.temperature,
               batch_size=a.batch_size, chat_template=a.chat_template)
  print(summary(r))
  if a.json:
    parent = os.path.dirname(a.json) if not paths.is_url(a.json) else None
    if parent:
      paths.makedirs(parent)
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
    paths.write_atomic(a.json, json.dumps(clean, indent=1))
    print(f"json:   {a.json}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
