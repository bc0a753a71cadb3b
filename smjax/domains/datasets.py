"""Readers for published data sets: each maps a file in its own schema to the study's records.

  dataset     its published records                                  the study's records
  gsm8k       {question, answer: "... #### 72"}                       math {question, answer}
  math        {problem, solution: "... \\boxed{..}", level?, type?}    math {question, answer,
                                                                          level?, type?}
  mbpp        {text (or prompt), code, test_list, test_setup_code?,   code {prompt, tests,
               challenge_test_list?, test_imports?, task_id?}           entry_point, code, ...}
  humaneval   {task_id, prompt, canonical_solution, test,             code {prompt, tests,
               entry_point}                                             entry_point, ...}

Files: JSONL (.jsonl, .jsonl.gz, .ndjson), Parquet (the Hugging Face copies), a JSON array
(sanitized-mbpp.json), a JSON file of one record, or a directory of such .json files (the MATH
tarball: one problem per file). A record that is not the data set's schema is one error naming the
file, the record and the missing or ill-typed field (`read`, `smjax.prepare`).

MBPP's task text never names the function its asserts call (`remove_Occ`), so a model that solves
the task under another name scores 0. Its study prompt names it, with the signature of the
reference code's def: "Write a python function `remove_Occ(s, ch)` to remove first and last
occurrence of a given character from the string.", then the first assert as an example (as
MBPP's own prompt shows its asserts) and how to reply; every assert of test_list is run, after
test_setup_code and test_imports. challenge_test_list is kept as `challenge_tests`, not run (MBPP's
scores use test_list). HumanEval's tests define `check(candidate)`, which the sandbox calls with
the entry point (smjax.rewards.sandbox). Why: docs/design.md#chat-templates-and-published-data.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import json
import os
import re
from typing import Any, Callable, Mapping

from smjax.domains.records import _read_raw, location
from smjax.rewards.math import last_boxed


@dataclasses.dataclass(frozen=True)
class Reader:
  """One data set: its study record kind ("math" or "code"), its schema as the errors state it,
  and `convert(record, loc) -> study record` (a ValueError naming `loc` on a bad record)."""
  name: str
  kind: str
  schema: str
  convert: Callable[[Mapping[str, Any], str], dict]


def _has(rec: Mapping, reader: str, field: str, loc: str, *, aliases: tuple[str, ...] = ()
         ) -> str:
  """The name under which `rec` holds `field` (or an alias), or the one-line error."""
  for name in (field,) + aliases:
    if name in rec and rec[name] is not None:
      return name
  alias = f" (or {' / '.join(repr(a) for a in aliases)})" if aliases else ""
  raise ValueError(f"{loc}: missing field {field!r}{alias}: expected {READERS[reader].schema}; the "
                   f"record has {sorted(rec)}; is this a {reader} file?")


def _text(rec: Mapping, reader: str, field: str, loc: str, *, aliases: tuple[str, ...] = (),
          required: bool = True) -> str:
  if not required and not any(n in rec and rec[n] is not None for n in (field,) + aliases):
    return ""
  name = _has(rec, reader, field, loc, aliases=aliases)
  value = rec[name]
  if not isinstance(value, str):
    raise ValueError(f"{loc}: field {name!r} is {type(value).__name__} ({str(value)[:60]!r}); "
                     f"expected a string ({READERS[reader].schema})")
  return value


def _strings(rec: Mapping, reader: str, field: str, loc: str, *, required: bool = True
             ) -> list[str]:
  if not required and rec.get(field) is None:
    return []
  value = rec[_has(rec, reader, field, loc)]
  if (not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value)
      or (required and not value)):
    raise ValueError(f"{loc}: field {field!r} is {type(value).__name__} ({str(value)[:60]!r}); "
                     f"expected a {'non-empty ' if required else ''}list of strings "
                     f"({READERS[reader].schema})")
  return list(value)


def _keep(rec: Mapping, fields: tuple[str, ...]) -> dict:
  return {f: rec[f] for f in fields if rec.get(f) is not None}


# ------------------------------------------------------------------------------------ math

def gsm8k_record(rec: Mapping[str, Any], loc: str) -> dict:
  """GSM8K {question, answer}: the answer's worked solution ends in '#### N' (the gold)."""
  question = _text(rec, "gsm8k", "question", loc)
  answer = _text(rec, "gsm8k", "answer", loc)
  if "####" not in answer or not answer.rsplit("####", 1)[1].strip():
    raise ValueError(f"{loc}: field 'answer' has no final '#### N' ({answer[-60:]!r}); expected "
                     "GSM8K's worked solution ending in '#### <answer>'; is this a gsm8k file?")
  return {"question": question, "answer": answer}


def math_record(rec: Mapping[str, Any], loc: str) -> dict:
  """MATH {problem, solution}: the solution's last \\boxed{...} is the gold; level, type (and
  MATH-500's subject, unique_id) are kept."""
  problem = _text(rec, "math", "problem", loc)
  solution = _text(rec, "math", "solution", loc)
  if last_boxed(solution) is None:
    raise ValueError(f"{loc}: field 'solution' has no \\boxed{{...}} final answer "
                     f"({solution[-60:]!r}); expected MATH's solution with its answer boxed; is "
                     "this a math file?")
  return {"question": problem, "answer": solution,
          **_keep(rec, ("level", "type", "subject", "unique_id"))}


# ------------------------------------------------------------------------------------ code

_BUILTIN_NAMES = frozenset(dir(builtins))
_DEF = re.compile(r"^[ \t]*def\s+([A-Za-z_]\w*)\s*\(([^)]*)\)", re.M)
_WRITE = re.compile(r"^(write\s+an?\s+(?:python\s+|python3\s+)?function)\b", re.I)
CODE_REPLY = "Reply with the complete function, with any imports it needs, in one ```python block."


def _called_names(tests: list[str]) -> list[str]:
  """Names called as plain functions in the asserts, in order (outer calls first)."""
  out = []
  for t in tests:
    try:
      tree = ast.parse(t)
    except SyntaxError:
      out += re.findall(r"([A-Za-z_]\w*)\s*\(", t)
      continue
    out += [n.func.id for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
  return list(dict.fromkeys(out))


def _defined(code: str) -> dict[str, str]:
  """{function name: its parameters as written} of the top-level defs of the reference code."""
  try:
    tree = ast.parse(code)
  except SyntaxError:   # a few MBPP solutions are not Python 3: read the defs off the text
    return {m.group(1): ", ".join(a.strip() for a in m.group(2).split(",") if a.strip())
            for m in _DEF.finditer(code)}
  return {n.name: ast.unparse(n.args) for n in tree.body
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def mbpp_function(code: str, tests: list[str], loc: str) -> tuple[str, str | None]:
  """(the function the asserts call, its parameters from the reference code's def or None): the
  first called name that the code defines, else the first that is not a builtin."""
  called, defs = _called_names(tests), _defined(code)
  for name in called:
    if name in defs:
      return name, defs[name]
  for name in called:
    if name not in _BUILTIN_NAMES:
      return name, None
  raise ValueError(f"{loc}: field 'test_list' calls no function ({tests[0][:80]!r}); expected "
                   "asserts that call the function under test, e.g. assert f(1) == 2")


def mbpp_prompt(text: str, name: str, params: str | None, example: str) -> str:
  """The study prompt of an MBPP task: its text with the function named (module docstring)."""
  text = " ".join(text.split())
  sig = f"`{name}({params})`" if params is not None else f"`{name}`"
  m = _WRITE.match(text)
  body = f"{m.group(1)} {sig}{text[m.end():]}" if m else f"{text} Name the function {sig}."
  return f"{body}\nYour code should pass this test, among others:\n{example}\n{CODE_REPLY}"


def mbpp_record(rec: Mapping[str, Any], loc: str) -> dict:
  """MBPP (full or sanitized) as a study code record (module docstring)."""
  text = _text(rec, "mbpp", "text", loc, aliases=("prompt",))
  code = _text(rec, "mbpp", "code", loc)
  tests = _strings(rec, "mbpp", "test_list", loc)
  setup = _text(rec, "mbpp", "test_setup_code", loc, required=False)
  imports = _strings(rec, "mbpp", "test_imports", loc, required=False)
  challenge = _strings(rec, "mbpp", "challenge_test_list", loc, required=False)
  name, params = mbpp_function(code, tests, loc)
  out = {"prompt": mbpp_prompt(text, name, params, tests[0]),
         "tests": "\n".join(x for x in (*imports, setup, *tests) if x.strip()),
         "entry_point": name, "code": code, "text": text}
  if rec.get("task_id") is not None:
    out["task_id"] = str(rec["task_id"])
  if challenge:
    out["challenge_tests"] = challenge
  return out


def humaneval_record(rec: Mapping[str, Any], loc: str) -> dict:
  """HumanEval: the prompt (a signature and docstring) is completed by the model and is trusted
  prelude for the tests, which define check(candidate) (smjax.domains.real)."""
  prompt = _text(rec, "humaneval", "prompt", loc)
  solution = _text(rec, "humaneval", "canonical_solution", loc)
  test = _text(rec, "humaneval", "test", loc)
  entry = _text(rec, "humaneval", "entry_point", loc)
  if not re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", prompt, re.M):
    raise ValueError(f"{loc}: field 'prompt' does not define entry_point {entry!r}; expected "
                     "HumanEval's prompt: the function's signature and docstring")
  if not re.search(r"^\s*def\s+check\s*\(", test, re.M):
    raise ValueError(f"{loc}: field 'test' defines no check(candidate) ({test.strip()[:60]!r}); "
                     "expected HumanEval's test code, which the sandbox runs as "
                     f"check({entry})")
  out = {"prompt": prompt, "tests": test, "entry_point": entry, "canonical_solution": solution}
  if rec.get("task_id") is not None:
    out["task_id"] = str(rec["task_id"])
  return out


READERS: dict[str, Reader] = {r.name: r for r in (
    Reader("gsm8k", "math", "GSM8K's {question, answer} with the answer ending in '#### N'",
           gsm8k_record),
    Reader("math", "math", "MATH's {problem, solution} with a \\boxed{} answer (level, type "
           "kept)", math_record),
    Reader("mbpp", "code", "MBPP's {text, code, test_list} (test_setup_code, "
           "challenge_test_list optional; sanitized MBPP: prompt for text)", mbpp_record),
    Reader("humaneval", "code", "HumanEval's {task_id, prompt, canonical_solution, test, "
           "entry_point}", humaneval_record),
)}
DATASETS = tuple(READERS)


def is_mbpp(rec: Any) -> bool:
  """Whether a raw record is in MBPP's own schema (no entry_point; code and test_list), which the
  study's code domain reads through `mbpp_record` (smjax.domains.records)."""
  return (isinstance(rec, dict) and "entry_point" not in rec and "test_list" in rec
          and "code" in rec and ("text" in rec or "prompt" in rec))


def code_record(rec: Any, loc: str) -> Any:
  """The study's code domain's `load_records(adapt=)`: an MBPP record in its own schema through
  `mbpp_record`, any other as it is."""
  return mbpp_record(rec, loc) if is_mbpp(rec) else rec


# ----------------------------------------------------------------------------------- files

def _json_file(path: str) -> list[tuple[str, Any]]:
  """A .json file: an array of records, one record, or JSON lines."""
  with open(path, "rb") as f:
    head = f.read(4096).lstrip()
  if head[:1] in (b"[", b"{"):
    try:
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
    except ValueError:
      data = None   # JSON lines, whose first line is an object: read line by line below
    if isinstance(data, list):
      return [(f"{path}: record {i + 1}", r) for i, r in enumerate(data)]
    if isinstance(data, dict):
      return [(path, data)]
  return [(location(path, w), r) for w, r in _read_raw(path)]


def read_published(path: str) -> list[tuple[str, Any]]:
  """[(location, raw record)] of a published file or directory (module docstring): the location
  names the file and the line, row or record."""
  if os.path.isdir(path):
    files = sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                   if n.endswith((".json", ".jsonl", ".jsonl.gz", ".parquet")))
    if not files:
      raise ValueError(f"{path}: a directory without .json, .jsonl or .parquet files; expected "
                       "a data set's file, or a directory of them (MATH's one JSON per problem)")
    return [x for f in files for x in read_published(f)]
  if path.endswith(".json") and os.path.exists(path):
    return _json_file(path)
  return [(location(path, w), r) for w, r in _read_raw(path)]


def read(dataset: str, path: str) -> list[dict]:
  """The study records of a published file of `dataset` (one of DATASETS), in file order."""
  if dataset not in READERS:
    raise ValueError(f"dataset {dataset!r}: expected one of {list(DATASETS)}")
  reader, out = READERS[dataset], []
  for loc, rec in read_published(path):
    if not isinstance(rec, dict):
      raise ValueError(f"{loc}: record is {type(rec).__name__}; expected a JSON object, "
                       f"{reader.schema}")
    out.append(reader.convert(rec, loc))
  if not out:
    raise ValueError(f"{path}: no records (the file is empty); expected {reader.schema}")
  return out
