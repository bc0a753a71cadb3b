"""Domains with verifiable rewards, and their registry.

Names understood by `get_domain(name, **kwargs)`:
  "math", "code", "logic", "strings"   toy domains for tiny char-level models (kwarg difficulty=)
  "rg:<dataset>"                        any reasoning_gym dataset (kwargs go to its config)
  "jsonl_math:<path>"                   {question, answer} records, .jsonl/.jsonl.gz/.parquet
  "jsonl_code:<path>"                   {prompt, tests, entry_point} records, run in the sandbox
"jsonl_math" / "jsonl_code" without a path take train= and test= files instead.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable

from smjax.domains.base import SPLITS, Domain, Example, ToyDomain

TOY_DOMAINS = ("math", "code", "logic", "strings")
_PREFIXES = ("rg", "jsonl_math", "jsonl_code")


def _toy(name: str) -> Callable[..., Domain]:
  def make(**kwargs: Any) -> Domain:
    # Imported lazily so that `import smjax.domains` stays cheap.
    # pylint: disable=import-outside-toplevel
    from smjax.domains import toy_code, toy_logic, toy_math, toy_strings
    cls = {"math": toy_math.MathDomain, "code": toy_code.CodeDomain,
           "logic": toy_logic.LogicDomain, "strings": toy_strings.StringsDomain}[name]
    return cls(**kwargs)
  return make


def domain_label(domain: str) -> str:
  """A short name for arm and directory names: `jsonl_math:/data/gsm8k.jsonl` -> `jsonl_math_gsm8k`
  (a data file's path must not become nested directories under the work dir)."""
  kind, sep, where = domain.partition(":")
  if sep:
    stem = os.path.basename(where.rstrip("/"))
    while os.path.splitext(stem)[1] in (".gz", ".jsonl", ".json", ".parquet"):
      stem = os.path.splitext(stem)[0]
    stem = stem or "data"
    domain = f"{kind}_{stem}"
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", domain)


def known_domains() -> list[str]:
  """Registry names; prefixed families are shown with their argument in angle brackets."""
  return list(TOY_DOMAINS) + ["rg:<reasoning_gym dataset>", "jsonl_math:<path>",
                              "jsonl_code:<path>"]


def get_domain(name: str, **kwargs: Any) -> Domain:
  """The domain called `name` (see the module docstring), built with `kwargs`."""
  if name in TOY_DOMAINS:
    return _toy(name)(**kwargs)
  prefix, sep, arg = name.partition(":")
  if prefix == "rg" and sep:
    from smjax.domains.rg import ReasoningGymDomain  # pylint: disable=import-outside-toplevel
    return ReasoningGymDomain(arg, **kwargs)
  if prefix in ("jsonl_math", "jsonl_code"):
    from smjax.domains import real  # pylint: disable=import-outside-toplevel
    cls = real.JsonlMathDomain if prefix == "jsonl_math" else real.JsonlCodeDomain
    if arg.startswith("train="):  # the name a train=/test= domain reports for itself
      files = dict(part.split("=", 1) for part in arg.split(","))
      return cls(**{k: (v if v != "None" else None) for k, v in files.items()}, **kwargs)
    return cls(arg or None, **kwargs)
  raise ValueError(f"unknown domain {name!r}; known: {', '.join(known_domains())}")


__all__ = ["SPLITS", "Domain", "Example", "ToyDomain", "get_domain", "known_domains"]
