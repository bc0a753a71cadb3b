"""Tokenizers with one interface: a char-level one for the toy domains and an HF `tokenizer.json` one.

Both expose `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size`, `pad_id`, `bos_id`,
`eos_id`, so rollouts, rewards and data pipelines never care which one they hold. An HF tokenizer
also carries its model's chat template (`chat_template`, smjax.models.chat; None without one; the
char tokenizer has none), which `smjax.batch.encode_prompt` renders prompts with. An exported toy
model carries the char tokenizer as Hugging Face files (`char_tokenizer_files`), and
`load_tokenizer` reloads either kind from a model directory.
"""

from __future__ import annotations

import json
import os
from typing import Protocol, Sequence

# Special ids first, then newline and printable ASCII. The vocabulary is padded to a multiple of 64
# so embedding and logit shapes stay friendly to every backend.
_SPECIALS = ("<pad>", "<bos>", "<eos>")
_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
CHAR_VOCAB_SIZE = 128


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  bos_id: int
  eos_id: int

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...


class CharTokenizer:
  """Character-level tokenizer for the toy study: pad=0, bos=1, eos=2, then '\\n' and ASCII 32..126."""

  pad_id = 0
  bos_id = 1
  eos_id = 2
  vocab_size = CHAR_VOCAB_SIZE

  def __init__(self):
    self._to_id = {ch: i + len(_SPECIALS) for i, ch in enumerate(_CHARS)}
    self._to_ch = {i: ch for ch, i in self._to_id.items()}
    # decode's table: id -> text (pad and BOS: nothing; an id past the characters: U+FFFD).
    self._text = ["\ufffd"] * self.vocab_size
    for i, ch in self._to_ch.items():
      self._text[i] = ch
    self._text[self.pad_id] = self._text[self.bos_id] = ""

  def encode(self, text: str) -> list[int]:
    try:
      return [self._to_id[ch] for ch in text]
    except KeyError as e:
      raise ValueError(
          f"CharTokenizer cannot encode character {e.args[0]!r} in {text[:40]!r}: only '\\n' and "
          "printable ASCII (32..126) are in its vocabulary") from None

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes up to the first EOS; pad and bos are skipped.

    Ids past the character table (the vocabulary is padded to 128) decode to U+FFFD: a model may
    sample them, and a verifier must see a wrong answer, not an exception.
    """
    ids = [int(i) for i in ids] if not isinstance(ids, list) else ids
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    text, n = self._text, len(self._text)
    return "".join([text[i] if 0 <= i < n else "\ufffd" for i in ids])


class HFTokenizer:
  """A Hugging Face `tokenizer.json` loaded with the `tokenizers` library (no transformers needed).

  chat_template: "auto" (the directory's chat template where it has one, smjax.models.chat) or
  "none" (raw-text prompts); the template is `self.chat_template` (None without one)."""

  def __init__(self, path: str, *, eos_token: str | None = None, pad_token: str | None = None,
               bos_token: str | None = None, chat_template: str = "auto"):
    from tokenizers import Tokenizer as _Tok  # pylint: disable=import-outside-toplevel
    from smjax.models.hub import check_model_dir  # pylint: disable=import-outside-toplevel
    check_model_dir(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
      raise FileNotFoundError(f"tokenizer file {file} does not exist (expected a tokenizer.json)")
    try:
      self._tok = _Tok.from_file(file)
    except Exception as e:  # pylint: disable=broad-except  (tokenizers raises a bare Exception)
      raise ValueError(f"{file}: not a readable tokenizer.json ({' '.join(str(e).split())[:200]}); "
                       "expected a Hugging Face `tokenizers` JSON file; re-download it from the "
                       "model's repository") from None
    config = {}
    config_file = os.path.join(os.path.dirname(file), "tokenizer_config.json")
    if os.path.exists(config_file):
      from smjax.json_io import read_json  # pylint: disable=import-outside-toplevel
      config = read_json(config_file, "re-download it from the model's repository, or delete it "
                         "and pass eos_token= (and pad_token=, bos_token=)")

    def _special(explicit, key):
      name = explicit or config.get(key)
      if isinstance(name, dict):
        name = name.get("content")
      return None if name is None else self._tok.token_to_id(name)

    self.eos_id = _special(eos_token, "eos_token")
    self.bos_id = _special(bos_token, "bos_token")
    pad = _special(pad_token, "pad_token")
    self.pad_id = pad if pad is not None else (self.eos_id if self.eos_id is not None else 0)
    if self.eos_id is None:
      raise ValueError(f"{file}: no EOS token found (set eos_token= or eos_token in "
                       f"{config_file})")
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    from smjax.models.chat import load_chat_template  # pylint: disable=import-outside-toplevel
    self.chat_template = load_chat_template(os.path.dirname(file), chat_template, config)

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self._tok.decode(ids, skip_special_tokens=True)


# The field of tokenizer_config.json that marks an exported CharTokenizer (`char_tokenizer_files`):
# smjax reloads such a directory with CharTokenizer itself (`load_tokenizer`).
CHAR_MARK = "smjax_tokenizer"


def char_tokenizer_files(model_max_length: int) -> dict[str, str]:
  """CharTokenizer as a Hugging Face fast tokenizer: {file name: text} for tokenizer.json,
  tokenizer_config.json and special_tokens_map.json, which `transformers.AutoTokenizer` loads.

  A WordLevel model over the same ids (pad 0, bos 1, eos 2, then '\\n' and ASCII 32..126), split
  into single characters and fused back on decode, with BOS prepended by the post-processor:
  `AutoTokenizer(text).input_ids` are the ids the study fed the model (smjax.batch.encode_prompt).
  Two differences, neither in what the study ever fed it: a character outside the table is an
  error in both, but a different one; and the literal texts "<pad>", "<bos>", "<eos>" are
  special tokens to `tokenizers` where CharTokenizer spells them out. Ids past the table (the
  vocabulary is padded to 128) have no entry: `transformers` decodes them to nothing, CharTokenizer
  to U+FFFD. smjax itself reloads the directory with CharTokenizer (tokenizer_config.json carries
  CHAR_MARK), so it scores exactly as the study did.
  """
  # pylint: disable=import-outside-toplevel
  from tokenizers import Regex, Tokenizer as _Tok, decoders, models, pre_tokenizers, processors
  tok = CharTokenizer()
  vocab = {name: i for i, name in enumerate(_SPECIALS)}   # the ids CharTokenizer gives them
  vocab.update({ch: i + len(_SPECIALS) for i, ch in enumerate(_CHARS)})
  hf = _Tok(models.WordLevel(vocab, unk_token="<unk>"))
  hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
  hf.decoder = decoders.Fuse()   # WordLevel's default decoder would join the characters by spaces
  hf.post_processor = processors.TemplateProcessing(
      single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tok.bos_id)])
  hf.add_special_tokens(list(_SPECIALS))
  special = {"pad_token": "<pad>", "bos_token": "<bos>", "eos_token": "<eos>"}
  config = {"tokenizer_class": "PreTrainedTokenizerFast", **special,
            "model_max_length": int(model_max_length), "clean_up_tokenization_spaces": False,
            "add_bos_token": True, "padding_side": "left", CHAR_MARK: "char"}
  return {"tokenizer.json": hf.to_str(pretty=True),
          "tokenizer_config.json": json.dumps(config, indent=1),
          "special_tokens_map.json": json.dumps(special, indent=1)}


def load_tokenizer(path: str, chat_template: str = "auto") -> Tokenizer:
  """The tokenizer of a Hugging Face model directory: CharTokenizer where its
  tokenizer_config.json carries CHAR_MARK (an exported toy model), else HFTokenizer(path) with
  `chat_template` ("auto": the directory's chat template where it has one; "none")."""
  config_file = os.path.join(path, "tokenizer_config.json")
  if os.path.exists(config_file):
    from smjax.json_io import read_json  # pylint: disable=import-outside-toplevel
    config = read_json(config_file, "re-download it from the model's repository, or export the "
                       "model again")
    if config.get(CHAR_MARK) == "char":
      return CharTokenizer()
  return HFTokenizer(path, chat_template=chat_template)
