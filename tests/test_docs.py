"""The docs cannot drift from the runs or from the tree: every generated block of README.md and
docs/*.md equals what `python -m smjax.study.render --update-docs` renders from the report JSON it
names, every relative link in them points to a file (and heading) that exists, and every
`docs/design.md#<section>` that the code cites is a heading of docs/design.md."""

import glob
import os
import re

import pytest

from smjax.study import render

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                                  recursive=True))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _read(page: str) -> str:
  with open(os.path.join(ROOT, page)) as f:
    return f.read()


def _prose(text: str) -> str:
  """The page without its fenced code blocks (code may contain `](` that is not a link)."""
  return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def _anchors(text: str) -> set[str]:
  return {_slug(m) for m in re.findall(r"^#+ (.*)$", _prose(text), re.M)}


@pytest.mark.parametrize("page", PAGES)
def test_generated_blocks_match_their_reports(page, monkeypatch):
  monkeypatch.chdir(ROOT)  # the blocks name their reports relative to the repository root
  text = _read(page)
  for src in re.findall(re.escape(render.GENERATED).replace(r"\{src\}", r"(\S+)"), text):
    # "report.json#recovery": a part of that report; "a.json,b.json#claims": several reports
    for path in src.partition("#")[0].split(","):
      assert os.path.exists(path), f"{page}: a generated block names {path}, which does not exist"
  assert render.update_docs(text) == text, (
      f"{page} differs from its reports; run `python -m smjax.study.render --update-docs "
      f"{page}` and commit the result")


def test_the_demo_table_is_generated_in_readme_and_study():
  for page in ("README.md", "docs/study.md"):
    assert render.GENERATED.format(src="docs/demo_report.json") in _read(page), page


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_point_to_existing_files(page):
  text = _read(page)
  here = os.path.dirname(os.path.join(ROOT, page))
  broken = []
  for target in LINK.findall(_prose(text)):
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
      continue
    path, _, anchor = target.partition("#")
    file = os.path.normpath(os.path.join(here, path)) if path else os.path.join(ROOT, page)
    if not os.path.exists(file):
      broken.append(f"{target} (no file {os.path.relpath(file, ROOT)})")
    elif anchor and file.endswith(".md") and anchor not in _anchors(open(file).read()):
      broken.append(f"{target} (no heading #{anchor} in {os.path.relpath(file, ROOT)})")
  assert not broken, f"{page}: broken links: {broken}"


# Where the repository's own files cite docs/design.md (code comments and docstrings, configs,
# launch scripts, notebooks, docs); runs/, the venv and build outputs are not the repository's.
CITING_DIRS = ("smjax", "kernels", "configs", "benchmarks", "tests", "launch", "notebooks", "docs")
CITING_SUFFIXES = (".py", ".md", ".sh", ".ipynb", ".toml", ".txt")
DESIGN_CITATION = re.compile(r"docs/design\.md(?:#([\w-]+))?")


def _citing_files():
  yield from (name for name in ("README.md", "Makefile", "pyproject.toml")
              if os.path.exists(os.path.join(ROOT, name)))
  for top in CITING_DIRS:
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
      dirnames[:] = [d for d in dirnames if not d.startswith(".") and d != "__pycache__"]
      for name in filenames:
        if name.endswith(CITING_SUFFIXES):
          yield os.path.relpath(os.path.join(dirpath, name), ROOT)


def test_design_citations_name_existing_sections():
  """`docs/design.md#<anchor>` in any file of the repository names a heading of docs/design.md
  (GitHub's anchor slugs), and no file cites the design notes that lived outside the repository."""
  anchors = _anchors(_read("docs/design.md"))
  broken, outside = [], []
  for path in _citing_files():
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
      for number, line in enumerate(f, 1):
        broken += [f"{path}:{number}: #{a}" for a in DESIGN_CITATION.findall(line)
                   if a and a not in anchors]
        if re.search(r"\bDESIGN\.md", line):
          outside.append(f"{path}:{number}")
  assert not broken, (f"citations of headings docs/design.md does not have: {broken}; "
                      f"its anchors: {sorted(anchors)}")
  assert not outside, f"files citing the outside design notes; cite docs/design.md#<section>: " \
      f"{outside}"
