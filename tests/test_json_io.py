"""read_json, the reader of the project's small JSON files (result.json, eval_interval.json,
config.json, the safetensors index, tokenizer_config.json): one-line errors naming the file, the
line or field, what was expected and what to do."""

import pytest

from smjax.json_io import read_json, require_keys


def _read_json_error(exc_type, path, what="delete the phase directory to rerun it", **kw):
  with pytest.raises(exc_type) as e:
    read_json(str(path), what, **kw)
  msg = str(e.value)
  assert "\n" not in msg, msg
  err = e.value  # raised `from None` or outside any handler: ours is the last line
  assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__), msg
  assert msg.startswith(f"{path}: ") and msg.endswith(f"; {what}"), msg
  return msg


def test_read_json_names_file_line_and_field(tmp_path):
  path = tmp_path / "result.json"
  path.write_text('{"ledger": {"total": 1},\n "curve": [1, 2,\n')
  assert _read_json_error(ValueError, path) == (
      f"{path}: not valid JSON (Expecting value, line 3 column 1); expected a JSON object; "
      "delete the phase directory to rerun it")
  path.write_bytes(b'{"every_flops": 1e9, "note": "\xff"}')
  assert "not UTF-8 text (byte 0xff at offset 30); expected a JSON object" in _read_json_error(
      ValueError, path)
  path.write_text("[1, 2]")
  assert "holds a JSON list, expected a JSON object" in _read_json_error(ValueError, path)
  path.write_text('{"from_step_flops": 3.0}')
  msg = _read_json_error(ValueError, path, "delete it to fix the grid again",
                         keys=("every_flops",))
  assert msg == (f"{path}: field 'every_flops' is missing (expected fields ['every_flops']; the "
                 "file has ['from_step_flops']); delete it to fix the grid again")
  assert read_json(str(path), "unused", keys=("from_step_flops",)) == {"from_step_flops": 3.0}
  assert "no such file" in _read_json_error(FileNotFoundError, tmp_path / "absent.json")
  with pytest.raises(ValueError, match=r"x\.json: field 'b' is missing"):
    require_keys({"a": 1}, ("a", "b"), "x.json", "fix it")
