"""The study's per-domain difficulty (config.domain_difficulty, smjax.study.config.difficulties):
parsed and validated like base.domain_correct_fraction, read by every phase, an added field that
keeps earlier workdirs comparable, and the difficulty each toy domain of a seed is built with."""

import json

import pytest

from smjax.study.config import (ADDED_FIELDS, difficulties, study_defaults, upgrade_old_config,
                                validate)


def _config(**fields):
  c = study_defaults()
  c.domains = ("math", "code", "logic")
  c.phases = ("base", "joint")
  c.heldout_size, c.stop_size = 8, 4
  for k, v in fields.items():
    c[k] = v
  return c


def test_domain_difficulty_overrides_the_global_one_per_domain():
  c = _config()
  assert c.domain_difficulty == "" and difficulties(c) == {"math": 1, "code": 1, "logic": 1}
  c.domain_difficulty = "code=2"
  validate(c)
  assert difficulties(c) == {"math": 1, "code": 2, "logic": 1}
  c.domain_difficulty, c.difficulty = " code=3 , math=0 ", 2
  validate(c)
  assert difficulties(c) == {"math": 0, "code": 3, "logic": 2}
  # Only toy domains take a difficulty: a file or imported domain is not a key.
  c.domains, c.domain_difficulty = ("math", "api_domains:EchoDomain"), "math=3"
  validate(c)
  assert difficulties(c) == {"math": 3}


@pytest.mark.parametrize("spec, says", [
    ("code", "'code' must be domain=level with the level an integer >= 0"),
    ("code=", "'code=' must be domain=level"),
    ("code=x", "'code=x' must be domain=level"),
    ("code=1.5", "'code=1.5' must be domain=level"),
    ("code=-1", "'code=-1' must be domain=level"),
    ("strings=1", "'strings' is not one of config.domains' toy domains ('math', 'code', 'logic')"),
    ("=1", "'' is not one of config.domains' toy domains"),
    ("code=4", "code takes a difficulty in [0, 3] in the chain form, not 4"),
    ("math=1,logic=9", "logic takes a difficulty in [0, 3] in the chain form, not 9"),
])
def test_bad_domain_difficulty_is_refused_naming_the_field(spec, says):
  c = _config(domain_difficulty=spec)
  with pytest.raises(ValueError, match="config.domain_difficulty=") as e:
    validate(c)
  assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_global_difficulty_is_checked_per_domain_too():
  c = _config(difficulty=4)
  with pytest.raises(ValueError, match=r"config.difficulty=4: math takes a difficulty in "
                                       r"\[0, 3\] in the chain form, not 4"):
    validate(c)
  c.domain_difficulty = "math=1,code=1,logic=1"   # every toy domain overridden: 4 is not used
  validate(c)
  c = _config(difficulty=-1, form="short")
  with pytest.raises(ValueError, match=r"config.difficulty=-1: math takes a difficulty in "
                                       r"\[0, 3\] in the short form"):
    validate(c)


def test_domain_difficulty_is_read_by_every_phase_and_an_added_field():
  from smjax.study import layout  # pylint: disable=import-outside-toplevel
  assert "domain_difficulty" in layout.COMMON_READS
  assert ADDED_FIELDS["domain_difficulty"]({}) == ""
  old = study_defaults().to_dict()
  del old["domain_difficulty"]   # a workdir's config from before the field
  assert upgrade_old_config(old) == json.loads(json.dumps(study_defaults().to_dict()))


def test_each_toy_domain_of_a_seed_gets_its_own_difficulty():
  # pylint: disable-next=import-outside-toplevel
  from smjax.study.shared import seed_shared
  c = _config(domain_difficulty="code=3")
  validate(c)
  # code's level-3 chains (up to 51 tokens) do not fit the default completion budget: refused
  # when the seed's record is built, before anything trains, naming the field and what fits.
  with pytest.raises(ValueError, match=r"config\.rl\.max_new_tokens=44 is shorter than the "
                     r"longest held-out solution of code \((4[5-9]|5[01]) tokens at difficulty 3"):
    seed_shared(c, 0)
  c.rl.max_new_tokens = 52
  with pytest.raises(ValueError, match=r"does not fit: .* exceeds the model's max_seq_len=64"):
    seed_shared(c, 0)
  c.model.max_seq_len = 80
  with pytest.raises(ValueError, match=r"config\.base\.seq_len=64 cannot hold the base's longest "
                     r"training row of code \(\d+ tokens"):
    seed_shared(c, 0)
  c.base.seq_len = 80
  shared = seed_shared(c, 0)   # builds the seed's record: nothing compiles until a phase runs
  assert {d: dom.difficulty for d, dom in shared.domains.items()} == {
      "math": 1, "code": 3, "logic": 1}
  assert {e.metadata["difficulty"] for e in shared.heldout["code"]} == {3}
  assert {e.metadata["difficulty"] for e in shared.heldout["math"]} == {1}
  assert all(e.solution.startswith(("y-x:", "x-y:")) for e in shared.heldout["code"])
