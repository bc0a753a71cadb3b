"""Instruct models and published data: chat templates rendered as transformers renders them, the
Hub-id hint, the GSM8K / MATH / MBPP / HumanEval readers, and `python -m smjax.prepare`.

The chat tokenizer is a char-level `tokenizers` WordLevel model with Qwen's special tokens, built
offline, beside Qwen2.5's real chat template (tests/data/qwen2.5_chat_template.jinja, as its
tokenizer_config.json ships it) or a small template that uses every global transformers gives
templates; `transformers.AutoTokenizer` loads the same directory as the reference.
"""

import json
import os
import subprocess
import sys

import pytest
import transformers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from smjax.batch import encode_prompt, sft_batch
from smjax.domains import datasets, get_domain, real
from smjax.models import hf
from smjax.models.chat import prompt_messages
from smjax.models.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer
from smjax.prepare import main as prepare_main
from smjax.rewards.sandbox import SandboxPool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
QWEN_TEMPLATE = open(os.path.join(DATA, "qwen2.5_chat_template.jinja")).read()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "<unk>"]
# bos_token, namespace, loop controls, raise_exception, tojson (no HTML escaping), trim, and a
# {% generation %} block: what a template may use beyond Qwen's.
GLOBALS_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}{% for m in messages %}"
    "{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must come first') }}{% endif %}"
    "{% if m.content == 'skip' %}{% continue %}{% endif %}{% set ns.n = ns.n + 1 %}"
    "[{{ ns.n }}|{{ m.role }}] {{ m.content | trim }}{{ eos_token }}\n"
    "{% endfor %}{{ {'turns': ns.n, 'tag': '<b>'} | tojson }}\n"
    "{% if add_generation_prompt %}{% generation %}[assistant]{% endgeneration %}{% endif %}")
HUB_ID = "Qwen/Qwen2.5-1.5B-Instruct"


def _model_dir(path, template, *, bos=None, in_jinja=False):
  """A tokenizer directory transformers and smjax both load; the template in
  tokenizer_config.json or (in_jinja) chat_template.jinja; None: no template."""
  os.makedirs(path, exist_ok=True)
  chars = ["\n"] + [chr(c) for c in range(32, 127)]
  tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(SPECIALS + chars)},
                                   unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens(SPECIALS)
  tok.save(os.path.join(path, "tokenizer.json"))
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>", "bos_token": bos}
  if template is not None and not in_jinja:
    config["chat_template"] = template
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump(config, f)
  if in_jinja:
    with open(os.path.join(path, "chat_template.jinja"), "w") as f:
      f.write(template)
  return str(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
  root = tmp_path_factory.mktemp("chat")
  return {"qwen": _model_dir(root / "qwen", QWEN_TEMPLATE),
          "globals": _model_dir(root / "globals", GLOBALS_TEMPLATE, bos="<s>", in_jinja=True),
          "plain": _model_dir(root / "plain", None)}


def _examples():
  """A GSM8K, a HumanEval and an MBPP example as the study builds them, one with a system
  message."""
  math = real.JsonlMathDomain(os.path.join(DATA, "gsm8k_sample.jsonl"),
                              system="Reason step by step.")
  return (math.all_examples()[:1]
          + get_domain(f"jsonl_code:{DATA}/humaneval_sample.jsonl").all_examples()[:1]
          + get_domain(f"jsonl_code:{DATA}/mbpp_sample.jsonl").all_examples()[:1])


# ------------------------------------------------------------------------------ chat templates

@pytest.mark.parametrize("which", ["qwen", "globals"])
def test_chat_prompts_match_transformers_apply_chat_template(dirs, which):
  ours = HFTokenizer(dirs[which])
  ref = transformers.AutoTokenizer.from_pretrained(dirs[which])
  assert ref.chat_template == (QWEN_TEMPLATE if which == "qwen" else GLOBALS_TEMPLATE)
  convos = [[{"role": "user", "content": "What is 2+2?"}],
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " hi "}],
            [{"role": "user", "content": "skip"}, {"role": "user", "content": "<|im_end|>x"}]]
  convos += [prompt_messages(e) for e in _examples()]
  assert convos[3][0] == {"role": "system", "content": "Reason step by step."}
  for msgs in convos:
    want = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert ours.chat_template.render(msgs) == want, msgs
    ids = ref.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                  return_dict=False)
    assert ours.encode(want) == list(ids), msgs
  for e, msgs in zip(_examples(), convos[3:]):   # the study's one way in (smjax.batch)
    assert encode_prompt(ours, e) == list(ref.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
  if which == "qwen":
    text = ours.chat_template.render(convos[0])
    assert text == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                    "helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert encode_prompt(ours, "What is 2+2?") == ours.encode(text)   # a text: one user message
  else:
    assert encode_prompt(ours, "x")[0] == ours.bos_id == 3   # the template's BOS, added once


def test_chat_prompt_contents_per_domain():
  gsm8k, humaneval, mbpp = _examples()
  assert [m["role"] for m in prompt_messages(gsm8k)] == ["system", "user"]
  assert prompt_messages(gsm8k)[1]["content"] == gsm8k.prompt   # the question + boxed instruction
  user = prompt_messages(humaneval)[0]["content"]   # HumanEval's code prompt, with an instruction
  assert user.startswith("Complete the following Python function.") and humaneval.prompt in user
  assert prompt_messages(mbpp) == [{"role": "user", "content": mbpp.prompt}]


def test_template_errors_and_off_switch(dirs):
  ours = HFTokenizer(dirs["globals"])
  with pytest.raises(ValueError) as e:
    ours.chat_template.render([{"role": "user", "content": "a"},
                               {"role": "system", "content": "b"}])
  msg = str(e.value)
  assert "\n" not in msg and "chat_template.jinja" in msg and "must come first" in msg, msg
  assert "chat_template='none'" in msg
  off = HFTokenizer(dirs["globals"], chat_template="none")
  assert off.chat_template is None
  assert encode_prompt(off, "ab") == [off.bos_id] + off.encode("ab")   # BOS, then the raw text
  assert HFTokenizer(dirs["plain"]).chat_template is None   # no template: raw text as before
  assert load_tokenizer(dirs["qwen"], "none").chat_template is None
  with pytest.raises(ValueError, match="chat_template='auto'|expected one of"):
    HFTokenizer(dirs["qwen"], chat_template="yes")


def test_bad_template_is_one_line(tmp_path):
  path = _model_dir(tmp_path / "bad", "{% for m in messages %}{{ m.content }")
  with pytest.raises(ValueError) as e:
    HFTokenizer(path)
  msg = str(e.value)
  assert "\n" not in msg and "tokenizer_config.json" in msg and "not valid jinja2" in msg, msg


def test_char_tokenizer_prompts_are_unchanged():
  tok, e = CharTokenizer(), _examples()[0]
  assert encode_prompt(tok, e) == encode_prompt(tok, e.prompt) == [tok.bos_id] + tok.encode(
      e.prompt)
  b = sft_batch(tok, [e], ["ok"], seq_len=256)
  assert b.tokens_BS[0, -len(e.prompt) - 4:].tolist() == (
      [tok.bos_id] + tok.encode(e.prompt) + tok.encode("ok") + [tok.eos_id])


def test_sft_rows_use_the_chat_template(dirs):
  ours, e = HFTokenizer(dirs["qwen"]), _examples()[2]
  b = sft_batch(ours, [e], ["done"], seq_len=512)
  want = encode_prompt(ours, e) + ours.encode("done") + [ours.eos_id]
  assert b.tokens_BS[0, -len(want):].tolist() == want


def test_config_field_is_checked():
  from smjax.study.config import study_defaults, validate  # pylint: disable=import-outside-toplevel
  c = study_defaults()
  assert c.model.chat_template == "auto"
  c.model.chat_template = "off"
  with pytest.raises(ValueError, match=r"config.model.chat_template='off' must be 'auto'"):
    validate(c)


# --------------------------------------------------------------------------------- hub ids

def test_hub_id_gives_the_download_command(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  for call in (lambda: HFTokenizer(HUB_ID), lambda: hf.config_from_hf(HUB_ID),
               lambda: load_tokenizer(HUB_ID)):
    with pytest.raises(FileNotFoundError) as e:
      call()
    msg = str(e.value)
    assert "\n" not in msg and f"{HUB_ID!r} is not a local directory" in msg, msg
    assert f"hf download {HUB_ID} --local-dir DIR" in msg, msg
    assert f"huggingface-cli download {HUB_ID} --local-dir DIR" in msg, msg
  from smjax.study import shared  # pylint: disable=import-outside-toplevel
  from smjax.study.config import study_defaults  # pylint: disable=import-outside-toplevel
  c = study_defaults()
  c.model.hf_path = HUB_ID
  with pytest.raises(FileNotFoundError, match=r"config.model.hf_path 'Qwen/Qwen2.5-1.5B-Instruct'"
                     r" is not a local directory"):
    shared._model_and_tokenizer(c.model)   # pylint: disable=protected-access
  # A local path is named as before: a directory that exists, an absolute or ./ path.
  os.makedirs("Qwen/Qwen2.5-1.5B-Instruct")
  for path in (HUB_ID, "/no/such/model", "./nope/model"):
    with pytest.raises(FileNotFoundError) as e:
      hf.config_from_hf(path)
    assert "Hub id" not in str(e.value) and "config.json does not exist" in str(e.value)


# -------------------------------------------------------------------------------- readers

def test_gsm8k_and_math_readers():
  recs = datasets.read("gsm8k", os.path.join(DATA, "gsm8k_sample.jsonl"))
  assert len(recs) == 3 and recs[0]["answer"].endswith("#### 72") and set(recs[0]) == {
      "question", "answer"}
  recs = datasets.read("math", os.path.join(DATA, "math_sample.jsonl"))
  assert [(r["level"], r["type"]) for r in recs] == [
      ("Level 3", "Algebra"), ("Level 1", "Algebra"), ("Level 3", "Intermediate Algebra")]
  assert recs[0]["question"].startswith("How many vertical asymptotes")
  dom = get_domain(f"jsonl_math:{DATA}/math_sample.jsonl")   # MATH as published, in the study
  exs = dom.all_examples()
  assert [e.reference for e in exs] == ["2", "10", "20\\sqrt3"]
  assert exs[2].metadata["type"] == "Intermediate Algebra"
  assert dom.verify(exs[2], "so the distance is $\\boxed{20\\sqrt{3}}$") == 1.0
  assert dom.verify(exs[2], "\\boxed{20}") == 0.0


def test_mbpp_prompt_names_the_function_and_the_reference_passes():
  recs = datasets.read("mbpp", os.path.join(DATA, "mbpp_sample.jsonl"))
  assert recs[0]["prompt"].startswith(
      "Write a python function `remove_Occ(s, ch)` to remove first and last occurrence of a "
      "given character from the string.\n")
  assert 'assert remove_Occ("hello","l") == "heo"' in recs[0]["prompt"]
  assert recs[0]["challenge_tests"][1] == 'assert remove_Occ("","l") == ""'
  assert [r["entry_point"] for r in recs] == ["remove_Occ", "sort_matrix", "circle_area"]
  assert recs[1]["prompt"].startswith("Write a function `sort_matrix(M)` to sort")
  # Not "Write a function ...": the name is said after the text; a builtin's or math.isclose's
  # call is not the function under test; test_setup_code runs before the asserts.
  assert "Name the function `circle_area(r)`." in recs[2]["prompt"]
  assert recs[2]["tests"].startswith("import math\nassert math.isclose(circle_area(1)")
  # The study reads MBPP's own schema through the same reader, and runs every assert.
  dom = get_domain(f"jsonl_code:{DATA}/mbpp_sample.jsonl")
  exs = dom.all_examples()
  assert [e.prompt for e in exs] == [r["prompt"] for r in recs]
  wrong = "def remove_Occ(s, ch):\n    return s.replace(ch, '', 1)\n"   # the first one only
  with SandboxPool(1) as pool:
    got = dom.verify_many([exs[0], exs[0], exs[2]],
                          [f"Here:\n```python\n{exs[0].solution}\n```", wrong, exs[2].solution],
                          pool=pool)
  assert got == [1.0, 0.0, 1.0]


def test_mbpp_function_from_the_asserts():
  code = "def helper(x):\n  return x\ndef f(a, b=2):\n  return helper(a) + b\n"
  assert datasets.mbpp_function(code, ["assert set(f(1)) == {3}"], "x") == ("f", "a, b=2")
  assert datasets.mbpp_function("print 'py2'\ndef g(a,b):\n  pass", ["assert g(1,2)"], "x") == (
      "g", "a, b")   # not Python 3: the def is read off the text
  assert datasets.mbpp_function("", ["assert h(1) == 2"], "x") == ("h", None)
  with pytest.raises(ValueError, match=r"^f.jsonl:3: field 'test_list' calls no function"):
    datasets.mbpp_function("", ["assert len([1]) == 1"], "f.jsonl:3")


def test_humaneval_reader():
  recs = datasets.read("humaneval", os.path.join(DATA, "humaneval_sample.jsonl"))
  assert [r["entry_point"] for r in recs] == ["has_close_elements", "truncate_number"]
  assert recs[0]["tests"].lstrip().startswith("METADATA") and "def check(candidate)" in recs[0][
      "tests"]
  assert recs[0]["task_id"] == "HumanEval/0" and recs[0]["canonical_solution"].startswith("    ")
  bad = {k: v for k, v in recs[0].items() if k != "tests"}
  bad["test"] = "assert True"
  with pytest.raises(ValueError, match=r"^x:1: field 'test' defines no check\(candidate\)"):
    datasets.humaneval_record(bad, "x:1")


def test_published_json_array_and_directory(tmp_path):
  recs = [json.loads(line) for line in open(os.path.join(DATA, "math_sample.jsonl"))]
  (tmp_path / "arr.json").write_text(json.dumps(recs[:2], indent=1))
  assert len(datasets.read("math", str(tmp_path / "arr.json"))) == 2
  for i, r in enumerate(recs):   # the MATH tarball: one pretty-printed problem per file
    (tmp_path / "MATH" / r["type"]).mkdir(parents=True, exist_ok=True)
    (tmp_path / "MATH" / r["type"] / f"{i}.json").write_text(json.dumps(r, indent=4))
  got = datasets.read("math", str(tmp_path / "MATH"))
  assert sorted(r["answer"] for r in got) == sorted(r["solution"] for r in recs)


# -------------------------------------------------------------------------------- prepare

def test_prepare_writes_the_study_records_and_splits(tmp_path, capsys):
  out, test = str(tmp_path / "mbpp_train.jsonl"), str(tmp_path / "mbpp_test.jsonl")
  assert prepare_main(["mbpp", os.path.join(DATA, "mbpp_sample.jsonl"), out, "--test", test,
                       "--test-fraction", "0.25"]) == 0
  printed = capsys.readouterr().out
  assert f"study domain: jsonl_code:train={out},test={test}" in printed, printed
  # By the CRC-32 of each prompt (0.034, 0.011 and 0.277 of 2**32): the same on every machine.
  assert [json.loads(line)["entry_point"] for line in open(test)] == ["remove_Occ", "sort_matrix"]
  assert [json.loads(line)["entry_point"] for line in open(out)] == ["circle_area"]
  dom = get_domain(f"jsonl_code:train={out},test={test}")
  assert {e.reference["entry_point"] for e in dom.all_examples()} == {
      "remove_Occ", "sort_matrix", "circle_area"}
  # Without --test every record goes to OUT; the file is the study's as is.
  out2 = str(tmp_path / "gsm8k.jsonl.gz")
  assert prepare_main(["gsm8k", os.path.join(DATA, "gsm8k_sample.jsonl"), out2]) == 0
  assert len(get_domain(f"jsonl_math:{out2}").all_examples()) == 3
  with pytest.raises(ValueError, match=r"^--test-fraction 0.3 without --test FILE"):
    prepare_main(["gsm8k", os.path.join(DATA, "gsm8k_sample.jsonl"), out2, "--test-fraction",
                  "0.3"])


def test_prepare_bad_schema_is_one_line(tmp_path):
  src = os.path.join(DATA, "mbpp_sample.jsonl")
  out = tmp_path / "o.jsonl"
  with pytest.raises(ValueError) as e:
    prepare_main(["gsm8k", src, str(out)])
  msg = str(e.value)
  assert msg.startswith(f"{src}:1: missing field 'question'") and "\n" not in msg, msg
  assert "is this a gsm8k file?" in msg and not out.exists()
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n"
                 + json.dumps({"question": "q2", "answer": "no final answer"}) + "\n")
  with pytest.raises(ValueError, match=rf"^{bad}:2: field 'answer' has no final '#### N'"):
    prepare_main(["gsm8k", str(bad), str(out)])
  # As a command: one line on stderr, exit 2.
  p = subprocess.run([sys.executable, "-m", "smjax.prepare", "humaneval", src, str(out)],
                     cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
  assert p.stderr.startswith(f"smjax: error: {src}:1: missing field 'prompt'"), \
      p.stderr
