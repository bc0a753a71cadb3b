"""Shared pytest setup: tests import helpers from this folder; jax stays on the CPU."""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))
