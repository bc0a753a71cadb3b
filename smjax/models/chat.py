"""Chat templates: a model directory's jinja2 template, rendered as `transformers` renders it.

An instruct model was trained on conversations in its own format (Qwen2.5: `<|im_start|>user ...
<|im_end|>`), written by the jinja2 template its repository ships: `chat_template.jinja`, else the
`chat_template` field of tokenizer_config.json (a string, or a list of named templates of which
"default" is used), the order in which `transformers.AutoTokenizer` reads them. `ChatTemplate`
renders a conversation as `tokenizer.apply_chat_template(messages, add_generation_prompt=True,
tokenize=False)` does: the same sandboxed jinja2 environment (trim_blocks, lstrip_blocks, the
loop-controls extension, `{% generation %}` blocks rendered as their body), the same globals
(`raise_exception`, `strftime_now`, `namespace`, `dict`, a `tojson` that does not escape HTML)
and the tokenizer's named special tokens as variables (`bos_token`, `eos_token`, ...). The ids
are the rendered text encoded with no special tokens added, as transformers encodes it: a
template that wants a BOS writes `{{ bos_token }}` itself.

A study prompt becomes messages in one place (`prompt_messages`): a user message holding the
domain's instruction and the problem (an Example's `metadata["chat_prompt"]` where its domain
words it differently for a chat model, else its prompt), after a system message only when the
domain gives one (`metadata["system"]`); with none, the template's own default applies (Qwen2.5
writes "You are Qwen, created by Alibaba Cloud...").
Why: docs/design.md#chat-templates-and-published-data.
"""

from __future__ import annotations

import datetime
import json
import os
from typing import Any, Mapping, Sequence

# The named special tokens transformers passes to every template (its SPECIAL_TOKENS_ATTRIBUTES).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")
CHAT_TEMPLATE_MODES = ("auto", "none")
_OFF = "or set config.model.chat_template='none' to feed raw-text prompts"


def _token_text(value: Any) -> str | None:
  """A special token as tokenizer_config.json spells it: a string, or {"content": ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


def special_tokens(model_dir: str, config: Mapping[str, Any] | None = None) -> dict[str, str]:
  """{name: token text} of the named special tokens set in tokenizer_config.json (`config`, when
  already read), with special_tokens_map.json filling the names it leaves unset."""
  from smjax.json_io import read_json  # pylint: disable=import-outside-toplevel
  if config is None:
    file = os.path.join(model_dir, "tokenizer_config.json")
    config = read_json(file, "re-download it from the model's repository") \
        if os.path.exists(file) else {}
  out = {k: t for k in SPECIAL_TOKEN_NAMES if (t := _token_text(config.get(k))) is not None}
  legacy = os.path.join(model_dir, "special_tokens_map.json")
  if os.path.exists(legacy):
    more = read_json(legacy, "re-download it from the model's repository")
    out.update({k: t for k in SPECIAL_TOKEN_NAMES
                if k not in out and (t := _token_text(more.get(k))) is not None})
  return out


def read_chat_template(model_dir: str, config: Mapping[str, Any] | None = None
                       ) -> tuple[str, str] | None:
  """(template text, the file it came from) of a model directory, None when it has none: its
  chat_template.jinja, else tokenizer_config.json's `chat_template` (`config`, when already
  read): a string, or a list of {name, template} of which "default" is used."""
  jinja_file = os.path.join(model_dir, "chat_template.jinja")
  if os.path.exists(jinja_file):
    with open(jinja_file, encoding="utf-8") as f:
      return f.read(), jinja_file
  file = os.path.join(model_dir, "tokenizer_config.json")
  if config is None:
    if not os.path.exists(file):
      return None
    from smjax.json_io import read_json  # pylint: disable=import-outside-toplevel
    config = read_json(file, "re-download it from the model's repository")
  value = config.get("chat_template")
  if value is None or value == "":
    return None
  if isinstance(value, list):
    named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    if not isinstance(named.get("default"), str):
      raise ValueError(f"{file}: field 'chat_template' is a list of named templates without a "
                       f"'default' one (names {sorted(map(str, named))}); expected a jinja2 "
                       f"string or a list holding {{'name': 'default', 'template': ...}}; {_OFF}")
    return named["default"], file
  if not isinstance(value, str):
    raise ValueError(f"{file}: field 'chat_template' is {type(value).__name__}; expected a jinja2 "
                     f"template string; {_OFF}")
  return value, file


def _environment():
  """transformers' chat-template environment (utils/chat_template_utils.py), rebuilt here so that
  rendering needs jinja2 only."""
  # pylint: disable=import-outside-toplevel
  import jinja2
  import jinja2.ext
  import jinja2.nodes
  import jinja2.utils
  from jinja2.sandbox import ImmutableSandboxedEnvironment

  class Generation(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (marks the assistant's tokens for training masks
    in transformers): rendered as its body."""
    tags = {"generation"}

    def parse(self, parser):
      lineno = next(parser.stream).lineno
      body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
      return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
      return caller()

  def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

  def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)

  def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)

  class Namespace(jinja2.utils.Namespace):
    """jinja2's namespace without underscore-prefixed attributes (no reach into internals)."""

    def __init__(*args, **kwargs):  # pylint: disable=no-method-argument
      self, args = args[0], args[1:]
      attrs = dict(*args, **kwargs)
      for name in attrs:
        Namespace._check(name)
      jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
      Namespace._check(name)
      jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
      if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"a chat template may not set {name!r} on a "
                                              "namespace")

  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                      extensions=[Generation, jinja2.ext.loopcontrols])
  env.filters["tojson"] = tojson
  env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                     dict=dict, namespace=Namespace)
  return env


class ChatTemplate:
  """A model's chat template, compiled once (module docstring). `where`: the file it came from,
  named in every error; `tokens`: the special-token variables the template sees."""

  def __init__(self, template: str, *, where: str, tokens: Mapping[str, str] | None = None):
    import jinja2  # pylint: disable=import-outside-toplevel
    self.source, self.where, self.tokens = template, where, dict(tokens or {})
    try:
      self._template = _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
      raise ValueError(f"{where}: the chat template is not valid jinja2 ({e.message}, template "
                       f"line {e.lineno}); expected the model repository's template; re-download "
                       f"it, {_OFF}") from None

  def __getstate__(self):
    """Pickled as its source (a tokenizer sent to a data worker): a compiled template is not."""
    return {"template": self.source, "where": self.where, "tokens": self.tokens}

  def __setstate__(self, state):
    self.__init__(state["template"], where=state["where"], tokens=state["tokens"])

  def render(self, messages: Sequence[Mapping[str, str]], *,
             add_generation_prompt: bool = True) -> str:
    """The conversation as text, ending with the assistant's header (add_generation_prompt)."""
    import jinja2  # pylint: disable=import-outside-toplevel
    try:
      return self._template.render(messages=[dict(m) for m in messages], tools=None,
                                   documents=None, add_generation_prompt=add_generation_prompt,
                                   **self.tokens)
    except jinja2.TemplateError as e:   # raise_exception(...) and undefined-name errors
      roles = [m.get("role") for m in messages]
      raise ValueError(f"{self.where}: the chat template refused a conversation of roles {roles} "
                       f"({' '.join(str(e).split())[:200]}); {_OFF}") from None


def load_chat_template(model_dir: str, mode: str = "auto",
                       config: Mapping[str, Any] | None = None) -> ChatTemplate | None:
  """The chat template of a model directory: mode "auto" uses the directory's (None when it
  has none), "none" uses none (raw-text prompts). `config`: its tokenizer_config.json, when
  already read."""
  if mode not in CHAT_TEMPLATE_MODES:
    raise ValueError(f"chat_template={mode!r}: expected one of {list(CHAT_TEMPLATE_MODES)} "
                     "('auto': the model directory's template where it has one)")
  if mode == "none":
    return None
  found = read_chat_template(model_dir, config)
  if found is None:
    return None
  return ChatTemplate(found[0], where=found[1], tokens=special_tokens(model_dir, config))


def prompt_messages(prompt: Any) -> list[dict[str, str]]:
  """A study prompt as chat messages: a text is one user message; an Example is its
  `metadata["chat_prompt"]` (else its prompt) as the user message, after a system message only
  where its metadata carries `system`."""
  if isinstance(prompt, str):
    return [{"role": "user", "content": prompt}]
  meta = getattr(prompt, "metadata", None) or {}
  out = [{"role": "system", "content": meta["system"]}] if meta.get("system") else []
  return out + [{"role": "user", "content": meta.get("chat_prompt") or prompt.prompt}]
