# gpuctl: two commands do all the set-up on a fresh Debian machine.
#   make demo   installs what is needed, then on a 3-node lab fleet: jobs, a node killed, the jobs
#               resuming elsewhere from their checkpoints (examples/demo.sh, docs/demo.md)
#   make test   installs what is needed, then lint (ruff, import layers), type-check and the whole
#               test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO_DIR ?= /tmp/gpuctl-demo

.PHONY: deps sysdeps venv lint typecheck pytest test demo bench-gather bench-placement clean

# System packages: OpenSSH's server (the lab fleet runs real sshd), iproute2 (lab network
# partitions), tmux (the dashboard's end-to-end test), prometheus for promtool (the metrics tests
# check the exposition and the example alert rules with it; the Prometheus server it brings is
# stopped and disabled, and recommends such as the node exporter are not installed), postgresql's
# server (the store tests start their own in a temporary folder; Debian's cluster service is stopped
# and disabled), chromium (the HTML report's test screenshots the page headless), Slurm's
# slurmctld, slurmd, client and munge (the Slurm tests start their own in a temporary folder;
# Debian's services are stopped and disabled). Installed only when missing.
sysdeps:
	@missing=""; \
	  test -x /usr/sbin/sshd || missing="$$missing openssh-server openssh-client"; \
	  command -v ip >/dev/null 2>&1 || test -x /usr/sbin/ip || missing="$$missing iproute2"; \
	  command -v tmux >/dev/null 2>&1 || missing="$$missing tmux"; \
	  command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing="$$missing postgresql"; \
	  command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	  test -x /usr/sbin/slurmctld || missing="$$missing slurmctld"; \
	  test -x /usr/sbin/slurmd || missing="$$missing slurmd"; \
	  command -v sbatch >/dev/null 2>&1 || missing="$$missing slurm-client"; \
	  test -x /usr/sbin/munged || missing="$$missing munge"; \
	  if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	    $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	    case "$$missing" in *prometheus*) \
	      if [ -d /run/systemd/system ]; then $$SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true; fi;; \
	    esac; \
	    case "$$missing" in *postgresql*) \
	      if [ -d /run/systemd/system ]; then $$SUDO systemctl disable --now postgresql >/dev/null 2>&1 || true; \
	      else $$SUDO pg_ctlcluster --force "$$(ls /usr/lib/postgresql | sort -n | tail -1)" main stop >/dev/null 2>&1 || true; fi;; \
	    esac; \
	    case "$$missing" in *slurm*|*munge*) \
	      if [ -d /run/systemd/system ]; then $$SUDO systemctl disable --now slurmctld slurmd munge >/dev/null 2>&1 || true; \
	      else for s in slurmctld slurmd munge; do $$SUDO service $$s stop >/dev/null 2>&1 || true; done; fi;; \
	    esac; \
	  fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

venv: $(BIN)/python
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'

deps: sysdeps venv

# ruff (its banned-api keeps paramiko, textual, typer and sqlite3 in their rooms), then the import
# layers (import-linter's contracts in pyproject.toml: cli | tui > ops > config | adapters > core).
lint: venv
	$(BIN)/ruff check gpuctl tests benchmarks
	$(BIN)/ruff format --check gpuctl tests benchmarks
	$(BIN)/lint-imports --no-logo

typecheck: venv
	$(BIN)/mypy

pytest: deps
	$(BIN)/python -m pytest -q

test: deps lint typecheck pytest

demo: deps
	DEMO_DIR=$(DEMO_DIR) GPUCTL=$(BIN)/gpuctl PYTHON=$(BIN)/python bash examples/demo.sh

bench-gather: deps
	$(BIN)/python benchmarks/gather.py --nodes 50

bench-placement: deps
	$(BIN)/gpuctl bench placement --nodes ../shared/data/openb/openb_node_list_gpu_node.csv \
	  --pods ../shared/data/openb/openb_pod_list_default.csv --policy best-fit,fgd,default

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
