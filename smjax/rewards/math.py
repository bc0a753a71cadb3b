"""Math answer checking with math-verify (GSM8K / MATH style).

The gold answer is taken from a reference solution (the text after the last "####", else the
last \\boxed{...}, else the whole string); the completion is parsed by math-verify, which
prefers the last \\boxed{...} and falls back to the last expression. Equivalent forms match
(1/2, 0.5, \\frac{1}{2}).
"""

from __future__ import annotations

import threading


def last_boxed(text: str) -> str | None:
  """Content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None if there is none."""
  best = None
  for tag in ("\\boxed{", "\\fbox{"):
    start = text.rfind(tag)
    if start >= 0 and (best is None or start > best[0]):
      best = (start, tag)
  if best is None:
    return None
  begin = best[0] + len(best[1])
  depth = 1
  for i in range(begin, len(text)):
    depth += {"{": 1, "}": -1}.get(text[i], 0)
    if depth == 0:
      return text[begin:i]
  return None


def gold_answer(reference: str) -> str:
  """The final answer inside a reference solution (GSM8K '#### 42', MATH '\\boxed{42}')."""
  reference = str(reference)
  if "####" in reference:
    return reference.rsplit("####", 1)[1].strip().replace(",", "")
  boxed = last_boxed(reference)
  return (boxed if boxed is not None else reference).strip()


def math_reward(completion: str, gold: str) -> float:
  """1.0 iff math-verify finds the completion's answer equal to `gold` (a final answer)."""
  from math_verify import parse, verify  # pylint: disable=import-outside-toplevel
  # math-verify's timeouts use SIGALRM, which only works in the main thread.
  timeout = 5 if threading.current_thread() is threading.main_thread() else None
  gold_parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
  if not gold_parsed:
    return 0.0
  pred = parse(completion, parsing_timeout=timeout)
  if not pred:
    return 0.0
  return float(verify(gold_parsed, pred, timeout_seconds=timeout))
