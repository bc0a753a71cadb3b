"""The check the error tests share: a fault is one line, ours is the last one, and it names what
it should (tests/test_data.py, tests/test_hf.py)."""


def one_line_error(exc_info, *parts):
  """`exc_info` (pytest.raises) holds a one-line message containing every one of `parts`,
  raised `from None` or outside any handler, so that it is the last line a user sees."""
  msg = str(exc_info.value)
  assert "\n" not in msg, msg
  err = exc_info.value
  assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__), msg
  for part in parts:
    assert part in msg, (part, msg)
  return msg
