"""RL algorithm cores (GRPO in grpo.py, on-policy distillation alongside): pure functions of arrays.

The train steps in smjax/train/ call them with explicit keyword arguments.
"""
