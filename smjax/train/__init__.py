"""Training: state and optimiser (state.py), pure jitted steps (steps.py), host loops (loop.py)."""
