"""Rewards: the code sandbox (sandbox.py), math-verify answer checking (math.py) and batched
verification over domains (verify.py: `verify_batch`)."""
