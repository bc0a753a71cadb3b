"""Answers and held-out rules of the toy domains re-derived from the prompt text alone,
independently of the generators, for tests/test_domains.py and tests/test_domains_chain.py."""

import collections
import re
import string
import zlib


def digit_sum(n):
  return sum(int(ch) for ch in str(abs(n)))


def math_truth(prompt):
  a, op, b = re.fullmatch(r"(\d+)([+-])(\d+)=", prompt).groups()
  a, b = int(a), int(b)
  return (a + b if op == "+" else a - b), (3 * digit_sum(a) + digit_sum(b)) % 5 == 0


def math_sum_truth(prompt):
  """The chain form's hard level "a+b+c=": the sum; held out iff the terms' digit sums add to
  0 mod 5 (in any order of the terms)."""
  terms = [int(t) for t in re.fullmatch(r"(\d+)\+(\d+)\+(\d+)=", prompt).groups()]
  return sum(terms), sum(digit_sum(t) for t in terms) % 5 == 0


def logic_truth(prompt):
  """Topological order of the chain; held-out iff CRC(template) % 4 == 0."""
  links = prompt[:-1].split(",")
  less = {}  # a -> b for a < b
  for link in links:
    left, op, right = link[0], link[1], link[2]
    lo, hi = (left, right) if op == "<" else (right, left)
    less[lo] = hi
  start = (set(less) - set(less.values())).pop()
  chain = [start]
  while chain[-1] in less:
    chain.append(less[chain[-1]])
  pos = {ch: i for i, ch in enumerate(chain)}
  order = "".join(str(min(pos[l[0]], pos[l[2]])) for l in links)
  dirs = "".join("1" if l[1] == ">" else "0" for l in links)
  return "".join(chain), zlib.crc32(f"{order}|{dirs}".encode()) % 4 == 0


def strings_truth(prompt):
  word = re.fullmatch(r"count:([a-z]+)=", prompt).group(1)
  counts = collections.Counter(word)
  answer = "".join(f"{c}{counts[c]}" for c in string.ascii_lowercase if c in counts)
  return answer, sum(string.ascii_lowercase.index(c) for c in word) % 5 == 0


def code_truth(prompt):
  pairs = [(int(x), int(y)) for x, y in re.findall(r"f\((\d+)\)=(-?\d+)", prompt)]
  if len(pairs) == 2:  # f(0)=c, f(1)=a+c
    c, a = pairs[0][1], pairs[1][1] - pairs[0][1]
    return (lambda x: a * x + c), (3 * digit_sum(a) + digit_sum(c)) % 5 == 0
  (x, y), = pairs
  return (lambda v: v + (y - x)), (3 * digit_sum(x) + digit_sum(abs(y - x))) % 5 == 0
