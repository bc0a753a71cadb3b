"""The README's Python quickstart (the short API: smjax.grpo with a reward callable, then
smjax.distill) runs as written on the CPU in a fresh process, its GRPO run's reward rising, and the
README opens with the two commands a new user types first."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")


def python_blocks(text: str) -> list[str]:
  return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def test_readme_opens_with_the_two_commands():
  text = open(README).read()
  first = re.search(r"^```\n(.*?)^```", text, re.S | re.M).group(1).splitlines()
  assert [line.split()[:2] for line in first] == [["make", "demo"], ["make", "test"]], first


def test_readme_quickstart_runs(tmp_path):
  blocks = python_blocks(open(README).read())
  assert len(blocks) == 1, f"README.md should hold one ```python quickstart, found {len(blocks)}"
  script = tmp_path / "quickstart.py"
  script.write_text(blocks[0])
  # conftest.py has set JAX_PLATFORMS=cpu and the fast-compile XLA_FLAGS in os.environ. The
  # quickstart names no workdir, so its runs go to temporary directories: the test's own.
  out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=dict(os.environ, TMPDIR=str(tmp_path)),
                       check=False)
  assert out.returncode == 0, f"the README quickstart failed:\n{out.stdout}\n{out.stderr[-4000:]}"
  lines = out.stdout.splitlines()
  # The GRPO run learns (from 2 `a`/`b` characters in 128 at random init) and is checkpointed.
  grpo = next(l for l in lines if l.startswith("GRPO reward "))
  assert float(grpo.split()[2]) > 0.05 and "/checkpoints/10" in grpo, out.stdout
  assert f" {tmp_path}{os.sep}smjax-grpo-" in grpo, grpo   # TMPDIR, where a user's tempfile goes
  student = next(l for l in lines if l.startswith("student's reverse KL to its teacher "))
  assert float(student.split()[6]) >= 0 and student.endswith("/checkpoints/4"), out.stdout
  for phase in ("rollout/decode", "train/policy", "train/teacher", "eval/heldout"):
    assert any(l.startswith(phase) and float(l.split()[1]) > 0 for l in lines), (phase, out.stdout)
