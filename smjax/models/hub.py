"""A Hugging Face Hub id given where smjax expects a local model directory.

smjax reads models from local directories only (nothing is downloaded: a study on a TPU pod must
not have each worker fetch gigabytes at start). A path that does not exist and reads as
`owner/name` (`Qwen/Qwen2.5-1.5B-Instruct`) is almost always a Hub id: the error says so and
gives the command that downloads it, instead of naming a missing tokenizer or config file.
"""

from __future__ import annotations

import os
import re

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def looks_like_hub_id(path: str) -> bool:
  """True for a path that does not exist and reads as a Hub id `owner/name` (two parts, neither
  starting with '.', no scheme, not absolute, no '~')."""
  return (isinstance(path, str) and not os.path.exists(path)
          and _HUB_ID.fullmatch(path) is not None and ".." not in path)


def download_hint(repo_id: str) -> str:
  """The commands that put `repo_id` in a local directory."""
  return (f"`hf download {repo_id} --local-dir DIR` (huggingface_hub < 1.0: `huggingface-cli "
          f"download {repo_id} --local-dir DIR`), then pass DIR")


def check_model_dir(path: str, what: str = "model directory") -> None:
  """FileNotFoundError, one line naming `what` and the download command, when `path` is a Hub
  id rather than a local directory; nothing otherwise (a missing file is named by its reader)."""
  if looks_like_hub_id(path):
    raise FileNotFoundError(
        f"{what} {path!r} is not a local directory, and smjax reads local model directories "
        f"only (nothing is downloaded); if it is a Hugging Face Hub id, download it with "
        f"{download_hint(path)}")
