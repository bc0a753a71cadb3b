"""Domains with verifiable rewards, and their registry.

Names understood by `get_domain(name, **kwargs)`:
  "math", "code", "logic", "strings"   toy domains for tiny char-level models (kwargs difficulty=,
                                        form=); math and code share a skill (column rules)
  "add", "sub"                          toy domains built to interfere: one prompt and chain form,
                                        a+b or a-b told apart by a tag (smjax.domains.toy_tagged)
  "rg:<dataset>"                        any reasoning_gym dataset (kwargs go to its config)
  "jsonl_math:<path>"                   {question, answer} records, .jsonl/.jsonl.gz/.parquet
  "jsonl_code:<path>"                   {prompt, tests, entry_point} records, run in the sandbox
  "<module>:<attr>"                     your own Domain: a subclass (built with the kwargs) or an
                                        instance, imported from the module (the current directory
                                        is searched too)
"jsonl_math" / "jsonl_code" without a path take train= and test= files instead.

A domain's key, what its examples are tagged with and what reports, teachers and directories are
keyed by, is its `name` (`domain_key`): for a registry name the name itself, for an import path
the imported domain's `name` attribute. `register_domain(domain)` makes an object (a notebook's
Domain) known by its name, as an import path does on first use.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any, Callable

from smjax.domains.base import SPLITS, Domain, Example, ToyDomain

# The tagged pair (smjax.domains.toy_tagged) is listed apart: known_domains shows it after the
# prefixed families.
TAGGED_DOMAINS = ("add", "sub")
TOY_DOMAINS = ("math", "code", "logic", "strings") + TAGGED_DOMAINS
_PREFIXES = ("rg", "jsonl_math", "jsonl_code")
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
# Domains known by name beyond the built-in ones (`register_domain`, and every import path once
# loaded), and each import path's domain built without kwargs, so that its key and its examples
# come from one object.
_REGISTERED: dict[str, Domain] = {}
_LOADED: dict[str, Domain] = {}


def _toy(name: str) -> Callable[..., Domain]:
  def make(**kwargs: Any) -> Domain:
    # Imported lazily so that `import smjax.domains` stays cheap.
    # pylint: disable=import-outside-toplevel
    from smjax.domains import toy_code, toy_logic, toy_math, toy_strings, toy_tagged
    cls = {"math": toy_math.MathDomain, "code": toy_code.CodeDomain,
           "logic": toy_logic.LogicDomain, "strings": toy_strings.StringsDomain,
           "add": toy_tagged.AddDomain, "sub": toy_tagged.SubDomain}[name]
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
  untagged = [d for d in TOY_DOMAINS if d not in TAGGED_DOMAINS]
  return (untagged + ["rg:<reasoning_gym dataset>", "jsonl_math:<path>", "jsonl_code:<path>",
                      "<module>:<Domain class or instance>"]
          + list(TAGGED_DOMAINS) + sorted(_REGISTERED))


def is_import_path(name: str) -> bool:
  """Whether `name` is a `module:attr` import path of a user's Domain (a name with one of the
  registry's prefixes, e.g. `rg:gsm_symbolic`, is not)."""
  return bool(_IMPORT_PATH.match(name)) and name.partition(":")[0] not in _PREFIXES


def _check_name(where: str, dom: Domain) -> Domain:
  """A user's domain must have a name of its own: the key of its examples, reports and files."""
  name = getattr(dom, "name", None)
  if not isinstance(name, str) or not name.strip():
    raise ValueError(f"{where}: its name attribute is {name!r}; expected a non-empty string (the "
                     "key its examples, teachers, reports and directories use)")
  if name in TOY_DOMAINS or name.partition(":")[0] in _PREFIXES or is_import_path(name):
    raise ValueError(f"{where}: its name {name!r} is a built-in domain's or an import path; "
                     "give the domain a name of its own")
  return dom


def register_domain(domain: Domain) -> Domain:
  """Makes `domain` known by its `name` to `get_domain` (and so to the verifier, which finds an
  example's domain by its tag); returns it. A ValueError when the name is missing, is a built-in
  one, or names another domain already."""
  _check_name(f"register_domain({domain!r})", domain)
  old = _REGISTERED.get(domain.name)
  if old is not None and old is not domain:
    raise ValueError(f"register_domain: the name {domain.name!r} is taken by {old!r}; give "
                     f"{domain!r} another name")
  _REGISTERED[domain.name] = domain
  return domain


def load_domain(path: str, **kwargs: Any) -> Domain:
  """The Domain an import path `module:attr` names: a Domain subclass built with `kwargs`, or a
  Domain instance (no kwargs). The module is imported with the current directory on sys.path, as
  `python -m` runs; every failure is a one-line ValueError naming the path and why. The domain is
  registered under its name (`register_domain`); without kwargs one object per path is kept."""
  if not kwargs and path in _LOADED:
    return _LOADED[path]
  module_name, _, attr = path.partition(":")
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.append(os.getcwd())
  try:
    obj = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  (the user's module may raise anything)
    raise ValueError(f"domain {path!r}: cannot import module {module_name!r} ("
                     f"{type(e).__name__}: {' '.join(str(e).split())[:200]}); expected an "
                     "importable module (on sys.path or in the current directory)") from None
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise ValueError(f"domain {path!r}: module {module_name!r} has no attribute {attr!r}")
    obj = getattr(obj, part)
  if isinstance(obj, type) and issubclass(obj, Domain):
    try:
      dom = obj(**kwargs)
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"domain {path!r}: {obj.__name__}({', '.join(kwargs)}) raised "
                       f"{type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
  elif isinstance(obj, Domain):
    if kwargs:
      raise ValueError(f"domain {path!r}: a Domain instance takes no settings "
                       f"({sorted(kwargs)}); name a Domain subclass to build it with them")
    dom = obj
  else:
    raise ValueError(f"domain {path!r}: names {str(obj)[:60]!r} ({type(obj).__name__}); "
                     "expected a subclass or an instance of smjax.domains.Domain")
  _check_name(f"domain {path!r}", dom)
  old = _REGISTERED.get(dom.name)
  if old is not None and type(old) is not type(dom):
    raise ValueError(f"domain {path!r}: named {dom.name!r}, as {old!r} already is; give it "
                     "another name")
  _REGISTERED[dom.name] = dom
  if not kwargs:
    _LOADED[path] = dom
  return dom


def domain_key(name: str) -> str:
  """The key of the domain `name` builds: `name` itself for a registry name, the domain's own
  `name` for an import path (imported to read it; ValueError when that fails)."""
  return load_domain(name).name if is_import_path(name) else name


def get_domain(name: str, **kwargs: Any) -> Domain:
  """The domain called `name` (see the module docstring), built with `kwargs`."""
  if name in TOY_DOMAINS:
    return _toy(name)(**kwargs)
  if is_import_path(name):
    return load_domain(name, **kwargs)
  if name in _REGISTERED and not kwargs:
    return _REGISTERED[name]
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


__all__ = ["SPLITS", "Domain", "Example", "ToyDomain", "domain_key", "get_domain",
           "is_import_path", "known_domains", "load_domain", "register_domain"]
