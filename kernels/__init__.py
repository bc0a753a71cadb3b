"""Pallas kernels, one file each (kernel + jitted wrapper + custom_vjp + *_reference).

Installed as `smjax.kernels` (package-dir mapping in pyproject.toml): `from smjax.kernels import X`.
"""
