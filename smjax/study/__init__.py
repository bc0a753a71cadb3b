"""The study: split-then-merge (GRPO experts + MOPD) against joint GRPO, and claims (c), (d).

config.py (the config schema), layout.py (a workdir's seed and phase directories, and the
config fields each phase reads), shared.py (what a seed's phases share), phases.py (what each
phase runs), store.py (finished phases and the evaluation grid in a workdir),
run.py (`run_study`: every seed's phases, then the report), report.py (tables, JSON/CSV, plots).
"""
