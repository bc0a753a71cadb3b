"""A user's own domain, named by import path in tests/test_api.py (`api_domains:EchoDomain`) as a
researcher's `my_pkg.rewards:MyDomain` would be: write the number after the prompt's `>`."""

from smjax.domains import Domain, Example


class EchoDomain(Domain):
  """`17>` -> `17`: reward 1 for the number repeated. Train prompts are even numbers, held-out
  ones odd, so the splits are disjoint by construction."""

  name = "echo"

  def generate(self, split, n, seed, difficulty=None):
    del difficulty
    parity = 0 if split == "train" else 1
    out = []
    for i in range(n):
      k = 2 * ((seed * 7919 + i) % 500) + parity
      out.append(Example(prompt=f"{k}>", reference=str(k), solution=str(k), domain=self.name,
                         metadata={"split": split, "index": i}))
    return out

  def score(self, example, completion):
    return float(completion.strip() == example.reference)


ECHO = EchoDomain()   # an instance works as well: `api_domains:ECHO`
NOT_A_DOMAIN = 3
