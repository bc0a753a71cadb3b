"""`python -m smjax <command>`: the `smjax` console script (smjax.main.cli)."""

from smjax.main import cli

if __name__ == "__main__":
  cli()
