# The two commands of the README:
#   make demo   set up, then run the main job on the embedded default
#   make test   set up (Python packages, and Docker for the repository tasks), then run the test suite
# `make setup` alone creates .venv with everything but vLLM (a GPU extra), and installs bubblewrap.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup sandbox docker demo test bench clean

# bubblewrap too: generated envs run only in its sandbox (scripts/setup_sandbox.sh).
setup: $(VENV)/.installed sandbox

sandbox:
	bash scripts/setup_sandbox.sh

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull a multi-GB CUDA build.
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[all]'
	touch $@

docker:
	bash scripts/setup_docker.sh

# The embedded default of `trace run` (CPU, the tiny model, the τ² airline target); it prints its plan and
# time estimate first. The report lands in runs/demo/report.md and report.html.
demo: setup
	$(VENV)/bin/trace run --out runs/demo

test: setup docker
	$(PY) -m pytest -q -p no:cacheprovider

bench: setup
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
