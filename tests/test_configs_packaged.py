"""The configs ship inside the package (configs/ installed as smjax.configs): a short name
(`--config=study:two_domain,demo`) is the same config as the path form, resolves outside a clone,
and an unknown name is one line naming the known configs (smjax.config_files, smjax.main).

That a built wheel holds smjax/configs/*.py is checked by hand, not here (building one takes
longer than this suite should): `pip wheel . --no-deps -w /tmp/whl && unzip -l /tmp/whl/*.whl`.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from smjax import config_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
# PYTHONPATH: smjax importable from any cwd, installed or not (the resolver finds the configs
# either way: the installed smjax.configs, or <repo>/configs beside the smjax package).
ENV = dict(os.environ, SMJAX_CPU_MALLOC="glibc", JAX_PLATFORMS="cpu",
           PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
SHIPPED = sorted(f[:-3] for f in os.listdir(CONFIGS) if f.endswith(".py") and f[0] != "_")


def _by_path(name: str, arg: str) -> dict:
  """configs/<name>.py's get_config(arg) loaded straight from the file: the reference."""
  spec = importlib.util.spec_from_file_location(f"reference_{name}",
                                                os.path.join(CONFIGS, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg).to_dict()


def test_every_config_is_packaged_and_listed():
  assert config_files.names() == SHIPPED and "study" in SHIPPED
  assert os.path.samefile(config_files.configs_dir(), CONFIGS)
  doc = open(os.path.join(CONFIGS, "__init__.py")).read().split('"""')[1]
  assert [n for n in SHIPPED if f"  {n} " not in doc] == [], "configs/__init__.py's docstring"


@pytest.mark.parametrize("form", ["study", "study.py", "configs/study.py",
                                  "smjax/configs/study.py", os.path.join(CONFIGS, "study.py")])
def test_short_name_is_the_same_config_as_the_path_outside_a_clone(form, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)   # no configs/ here: the relative forms are names
  want = _by_path("study", "two_domain,demo")
  c = config_files.load(form, "two_domain,demo")
  assert c.to_dict() == want and c.is_locked
  assert config_files.load(f"{form}:two_domain,demo").to_dict() == want


def test_a_file_that_exists_is_used_as_is(tmp_path, monkeypatch):
  """A path to an existing file wins over the packaged config of the same name; an absolute or
  other-directory path that does not exist is left for ml_collections' "no such file"."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "study.py").write_text("def get_config(arg=None):\n  return {'mine': arg}\n")
  assert config_files.resolve("study.py:x") == "study.py:x"
  assert config_files.load("study.py", "x", lock=False) == {"mine": "x"}
  assert config_files.resolve("study:x") == os.path.join(config_files.configs_dir(),
                                                         "study.py") + ":x"
  for missing in ("/nowhere/study.py:x", "elsewhere/study.py:x"):
    assert config_files.resolve(missing) == missing
  monkeypatch.chdir(ROOT)   # in a clone the clone's file, by its relative path
  assert config_files.resolve("configs/study.py:a,b") == "configs/study.py:a,b"


def test_unknown_name_is_one_line_naming_the_known_configs():
  for spec in ("nope:x", "configs/nope.py:x"):
    with pytest.raises(ValueError) as e:
      config_files.resolve(spec)
    msg = str(e.value)
    assert "\n" not in msg and repr(spec.split(":")[0]) in msg, msg
    assert all(n in msg for n in SHIPPED) and "--config=study:two_domain,demo" in msg, msg
  with pytest.raises(ValueError, match="give the argument once"):
    config_files.load("study:two_domain,demo", "two_domain,demo")


def test_source_tree_without_install_finds_the_repository_configs(monkeypatch):
  """PYTHONPATH=<repo> with nothing installed: no smjax.configs package to find, so the configs/
  beside the smjax package."""
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "smjax.configs" else real(name, *a))
  assert os.path.samefile(config_files.configs_dir(), CONFIGS)
  assert config_files.names() == SHIPPED


def _cli(*args, cwd):
  return subprocess.run([sys.executable, "-m", "smjax", *args], cwd=cwd, env=ENV,
                        capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("config", ["study:two_domain,demo", "configs/study.py:two_domain,demo"])
def test_cli_parses_the_packaged_config_outside_a_clone(config, tmp_path):
  """The command line's own parsing (smjax.main's --config flag) from a cwd without configs/:
  the config it loads is the clone's file's, field for field."""
  code = ("import json, sys; from absl import flags; from smjax import main; "
          f"flags.FLAGS(['smjax', '--config={config}', '--workdir=w']); "
          "print(json.dumps(main._CONFIG.value.to_dict()))")
  p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  assert json.loads(p.stdout) == json.loads(json.dumps(_by_path("study", "two_domain,demo")))


@pytest.mark.parametrize("config", ["study:two_domain,demo", "configs/study.py:two_domain,demo"])
def test_cli_outside_a_clone_reaches_the_config_fields(config, tmp_path):
  """`smjax study` from a cwd without configs/: a misspelt override is refused naming the
  config's real field, so the packaged config was loaded; nothing runs, no workdir is made."""
  p = _cli("study", f"--config={config}", "--config.joint.stepz=3",
           f"--workdir={tmp_path / 'w'}", cwd=tmp_path)
  assert p.returncode == 2 and p.stderr == (
      "smjax: error: --config.joint.stepz: the config has no field 'stepz'; did you mean "
      "--config.joint.steps?\n"), p.stderr
  assert not (tmp_path / "w").exists()


def test_cli_unknown_config_is_one_line_exit_2(tmp_path):
  p = _cli("study", "--config=nope:two_domain,demo", f"--workdir={tmp_path / 'w'}", cwd=tmp_path)
  assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stdout == "", p.stderr
  assert p.stderr.startswith("smjax: error: ") and "config 'nope'" in p.stderr, p.stderr
  assert all(n in p.stderr for n in SHIPPED) and "Traceback" not in p.stderr, p.stderr
  assert not (tmp_path / "w").exists()


def test_study_help_names_the_short_form_and_the_configs(tmp_path):
  p = _cli("study", "--help", cwd=tmp_path)
  assert p.returncode == 0 and "study:two_domain,demo" in p.stdout, p.stdout
  assert all(n in p.stdout for n in SHIPPED), p.stdout
  assert max(len(line) for line in p.stdout.splitlines()) <= 100, p.stdout
