"""The study: split-then-merge (GRPO experts + MOPD) against joint GRPO, and claims (c), (d).

config.py (the config schema), shared.py (what a seed's phases share), phases.py (each phase and
the config fields it reads), store.py (finished phases and the evaluation grid in a workdir),
run.py (`run_study`: every seed's phases, then the report), report.py (tables, JSON/CSV, plots).
"""
