r"""A whole study: split-then-merge (GRPO experts + MOPD) against joint GRPO, plus claims (c), (d).

  python -m smjax.main --config=configs/study.py:two_domain,demo --workdir=runs/demo   # = make demo
  make study STUDY=two_domain,full STUDY_WORKDIR=runs/two_full STUDY_SEEDS="0 1 2 3 4"
  make study STUDY=four_domain,full,main STUDY_WORKDIR=runs/four_full

Arguments: `two_domain` (math + code) or `four_domain` (math, code, logic, strings); `demo` (one
seed, the main comparison, sized for `make demo`'s budget of 10 minutes on 2 CPU cores: 256 report
and 128 stop prompts per domain, the experts' checkpoints at two bars) or `full` (five seeds, 512
report and 256 stop prompts per domain, checkpoints at four bars, every arm); `main`: only the main
comparison's phases (base, joint GRPO, experts, MOPD: claims (a), (b)), as `demo` always runs;
`short`: the short-answer regime (answers alone, the previous default) instead of the chain form.

Expected result: docs/study.md (the demo's frontier, table and verdicts, generated from
docs/demo_report.json; one seed, so its intervals cover evaluation noise only).
`two_domain,full,main` on five seeds: docs/study_two_full_report.json
(docs/study.md#the-full-studies; hours on 2 cores); its teachers' arms, claims (c) and (d), on
the same five seeds: docs/study_two_full_teachers_report.json, (d) at both depths of its
degradation (half the degraded chains right, and none: `self_teacher.also_correct_fractions`;
seeds 0-2's `@0` arms were lent by a run at that depth). `four_domain,full`: seeds 0-2, every
arm ((d) at both depths), docs/study_four_full_report.json (recorded in docs/records/four_full).
The reports of the previous instrument, whose claim (a) was set by the experts' stop rule, are in
docs/archive/stop_rule/.
`four_domain`: its base recipe lands in the band on seeds 0-4 (docs/four_domain_band.json,
docs/study.md#four-domains).
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
    c.joint.steps = 100 * n
    c.mopd.steps = 200
    c.eval.points = 6
    # Sized for make demo's 10 minutes on 2 cores: half the report prompts and a smaller stop set
    # (the demo's intervals cover evaluation noise only anyway), no greedy pass, evaluations
    # after every 50 % growth of an arm's FLOPs (the full study: 10 %), and the experts'
    # checkpoints at two bars (the full study: four).
    c.heldout_size, c.stop_size = 256, 128
    c.eval.greedy = False
    c.eval.growth = 0.5
    c.joint.eval_refine = c.experts.eval_refine = 2
    c.opd.eval_refine = 8
    c.experts.bars = (0.9, 1.0)
    c.checkpoint_every = 100
  else:
    c.seeds = (0, 1, 2, 3, 4)
    c.joint.steps = 400 * n
    c.mopd.steps = 400
    c.external.steps = 400
    c.self_teacher.recover_steps = 300
    # Claim (d) at two depths of its degradation: half the degraded chains right (GRPO can find
    # its way back) and none right (it finds nothing to learn from): the factor differs by which
    # (docs/study.md), so the full study reports both.
    c.self_teacher.also_correct_fractions = (0.0,)
    c.eval.points = 10
  # An expert steps on its own domain's share of joint GRPO's batch (experts.prompts_per_step),
  # so its cap in steps is joint GRPO's: the experts together may spend what joint GRPO does.
  c.experts.steps = c.joint.steps
  if a.four_domain:
    # Four domains share the base's batch, and logic's chain is learnt slowest: three times
    # the two-domain steps, and a mixture per domain, for which seeds 0-4 all land in the band
    # (benchmarks/study_seeds.py --base-only -> docs/four_domain_band.json).
    c.base.steps = 2700
    c.base.correct_fraction = 0.2
    c.base.domain_correct_fraction = "code=0.15,logic=0.6,strings=0.35"
  # The experts side by side, then the MOPD runs from their checkpoint sets (and the teachers'
  # arms): one process using both cores of a 2-core machine, the same results as one at a time
  # (a toy phase keeps about one core busy).
  c.parallel_phases = 2
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
