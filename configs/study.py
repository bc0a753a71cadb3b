r"""A whole study: split-then-merge (GRPO experts + MOPD) against joint GRPO, plus claims (c), (d).

  python -m smjax.main --config=configs/study.py:two_domain,demo --workdir=runs/demo   # = make demo
  python -m smjax.main --config=configs/study.py:two_domain,full --workdir=runs/two_full
  python -m smjax.main --config=configs/study.py:four_domain,full --workdir=runs/four_full
  make study STUDY=four_domain,full,main STUDY_WORKDIR=runs/study_four

Arguments: `two_domain` (math + code) or `four_domain` (math, code, logic, strings); `demo` (one
seed, the 2-core-CPU budget of `make demo`) or `full` (three seeds, longer runs, all arms);
`main`: only the main comparison's phases (base, joint GRPO, experts, MOPD: claims (a), (b)), as
`demo` always runs.

Expected runtime on a 2-core CPU (measured 2026-12-01, with the shared-prompt and packed steps,
idle machine): demo 3 min 18 s; two_domain,full about an hour through `make study` (three seeds
as parallel processes; every phase after the base and the external teacher about 19 min: 14 min
42 s with 300 degrade steps, and the self-teacher phases at the defaults took 7 min 33 s; the
two SFT phases most of the rest); four_domain,full,main 13 min 25 s after its SFT bases (18 min
46 s with them, measured 2026-11-30 before packing); four_domain,full with the external and self
teachers not yet run. Expected result: README "The toy study" (numbers measured with these
configs, whatever they say about the paper's claims: at this scale joint GRPO beats
split-then-merge per FLOP).
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, two_domain=False, four_domain=False, demo=False, full=False, main=False)
  if a.two_domain == a.four_domain:
    raise ValueError("configs/study.py: give exactly one of two_domain, four_domain")
  if a.demo == a.full:
    raise ValueError("configs/study.py: give exactly one of demo, full")
  c = study_defaults()
  c.domains = ("math", "code") if a.two_domain else ("math", "code", "logic", "strings")
  n = len(c.domains)
  c.name = f"{'two' if a.two_domain else 'four'}_domain_{'demo' if a.demo else 'full'}"
  if a.demo:
    c.seeds = (0,)
    c.heldout_size = 128
    c.experts.steps = 300
    c.joint.steps = c.experts.steps * n
    c.mopd.steps = 150
    c.eval.points = 8
    c.checkpoint_every = 100
  else:
    c.seeds = (0, 1, 2)
    c.heldout_size = 256
    c.experts.steps = 500
    c.joint.steps = c.experts.steps * n
    c.mopd.steps = 250
    c.external.steps = 250
    c.self_teacher.degrade_steps = 1000
    c.self_teacher.recover_steps = 200
    c.eval.points = 12
  if a.demo or a.main:
    # The main comparison only (claims (a), (b)); external and self teachers are in `full`.
    c.phases = ("base", "joint", "experts", "mopd")
  return c
