r"""A whole study: split-then-merge (GRPO experts + MOPD) against joint GRPO, plus claims (c), (d).

  python -m smjax.main --config=configs/study.py:two_domain,demo --workdir=runs/demo   # = make demo
  make study STUDY=two_domain,full STUDY_WORKDIR=runs/two_full STUDY_SEEDS="0 1 2"
  make study STUDY=four_domain,full,main STUDY_WORKDIR=runs/four_full

Arguments: `two_domain` (math + code) or `four_domain` (math, code, logic, strings); `demo` (one
seed, the main comparison, sized for `make demo`'s budget of 10 minutes on 2 CPU cores) or `full`
(three seeds, longer runs, every arm); `main`: only the main comparison's phases (base, joint GRPO,
experts, MOPD: claims (a), (b)), as `demo` always runs; `short`: the short-answer regime (answers
alone, the previous default) instead of the chain form.

Expected result: docs/study.md (the demo's table and verdicts, generated from
docs/demo_report.json); `two_domain,full`: docs/study.md#the-full-studies (generated from
docs/study_two_full_report.json: every arm, three seeds, claims (a)-(d) with intervals; about three
hours on 2 cores). `four_domain`: its base recipe lands in the band on seeds 0-4
(docs/four_domain_band.json, docs/study.md#four-domains); its full study (every arm, three seeds,
claims (a)-(d) with intervals; about three hours on 2 cores) is docs/study_four_full_report.json.
"""

from smjax.study.config import parse_arg, study_defaults


def get_config(arg=None):
  a = parse_arg(arg, two_domain=False, four_domain=False, demo=False, full=False, main=False,
                short=False)
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
    c.experts.steps = 200
    c.joint.steps = c.experts.steps * n
    c.mopd.steps = 200
    c.eval.points = 6
    # Twice the grid's resolution where joint GRPO and the experts cross their marks (the full
    # study: four times), to keep make demo within 10 minutes on 2 cores.
    c.joint.eval_refine = c.experts.eval_refine = 2
    c.checkpoint_every = 100
  else:
    c.seeds = (0, 1, 2)
    c.experts.steps = 400
    c.joint.steps = c.experts.steps * n
    c.mopd.steps = 400
    c.external.steps = 400
    c.self_teacher.degrade_steps = 1000
    c.self_teacher.recover_steps = 300
    c.eval.points = 10
  if a.four_domain:
    # Four domains share the base's batch, and logic's chain is learnt slowest: three times
    # the two-domain steps, and a mixture per domain, for which seeds 0-4 all land in the band
    # (benchmarks/study_seeds.py --base-only -> docs/four_domain_band.json).
    c.base.steps = 2700
    c.base.correct_fraction = 0.2
    c.base.domain_correct_fraction = "code=0.15,logic=0.6,strings=0.35"
  if a.demo or a.main:
    # The main comparison only (claims (a), (b)); external and self teachers are in `full`.
    c.phases = ("base", "joint", "experts", "mopd")
  if a.short:
    # The short-answer regime (the answer alone, ~4 tokens; docs/archive/short_answer): a base
    # SFT'd on gold answers and stopped part-way through its cosine, which is seed- and
    # machine-sensitive, so the band only warns.
    c.form = "short"
    c.rl.max_new_tokens = 12
    c.base.steps, c.base.schedule_steps, c.base.seq_len = 750, 1000, 36
    c.band.check = False
  return c
