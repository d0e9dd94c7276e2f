# sparkfleet: the README's two commands are `make demo` and `make test`. Run as root (the testbed
# uses network and mount namespaces). Everything installs into .venv; apt packages via `make deps`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_HOME ?= $(CURDIR)/.ansible
export XDG_CACHE_HOME ?= $(CURDIR)/.cache
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PYTHONDONTWRITEBYTECODE := 1
# python3-requests: community.docker's modules run on the hosts (the testbed's use this machine's /usr/bin/python3).
APT_PACKAGES := openssh-server openssh-client netcat-openbsd iproute2 util-linux docker.io python3-requests
PYTEST := $(BIN)/python -m pytest

.PHONY: help deps venv venv-kernels lint unit unit-slow kernels integration integration-slow journeys molecule test test-all demo up down status clean

help:
	@echo "make demo    set up, bring the seed testbed up and run the main job (pack_engram.yml) on it"
	@echo "make test    set up and run lint, unit, kernel, integration and Molecule tests"
	@echo "make up | down | status    the testbed; make lint | unit | kernels | integration | molecule"

deps:
	@missing=""; for tool in /usr/sbin/sshd /usr/bin/ssh /usr/bin/nc /usr/sbin/ip /usr/bin/unshare /usr/bin/nsenter \
	  /usr/sbin/dockerd /usr/bin/containerd /usr/sbin/runc; do \
	  [ -x $$tool ] || missing=1; done; \
	/usr/bin/python3 -c 'import requests' 2>/dev/null || missing=1; \
	if [ -n "$$missing" ]; then \
	  [ "$$(id -u)" = 0 ] || { echo "make deps: apt packages missing ($(APT_PACKAGES)) and not root"; exit 1; }; \
	  made=""; if [ ! -e /usr/sbin/policy-rc.d ]; then \
	    printf '#!/bin/sh\n# make deps: docker.io must not start a daemon outside the testbed\nexit 101\n' > /usr/sbin/policy-rc.d; \
	    chmod 755 /usr/sbin/policy-rc.d; made=1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES) >/dev/null; rc=$$?; \
	  [ -z "$$made" ] || rm -f /usr/sbin/policy-rc.d; [ $$rc = 0 ] || exit $$rc; \
	fi

$(VENV)/.stamp: requirements.txt requirements.yml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/python tests/lint/check_collections.py requirements.yml
	touch $@

venv: $(VENV)/.stamp

$(VENV)/.stamp-kernels: requirements-kernels.txt $(VENV)/.stamp
	$(BIN)/pip install -q -r requirements-kernels.txt
	touch $@

venv-kernels: $(VENV)/.stamp-kernels

lint: venv
	$(BIN)/yamllint .
	$(BIN)/ansible-lint -q playbooks roles
	$(BIN)/python -m compileall -q library module_utils plugins testbed benchmarks kernels
	@for m in $$(ls library/*.py | xargs -n1 basename | sed 's/\.py$$//'); do \
	  $(BIN)/ansible-doc -M library -t module $$m >/dev/null || { echo "ansible-doc cannot render $$m"; exit 1; }; done
	PYTHON=$(BIN)/python bash tests/lint/validate_modules.sh

unit: venv
	$(PYTEST) tests/unit -q -m "not slow"

# The long kill -9 trials (120 relocations, 60 packs) and other slow unit checks: `make test-all` runs them.
unit-slow: venv
	$(PYTEST) tests/unit -q -m slow

kernels: venv-kernels
	TRITON_INTERPRET=1 $(PYTEST) tests/kernels -q -m kernels

# Scenario tests that take minutes each (rollouts, ladders, image releases) are marked slow: `make test`
# leaves them to `make integration-slow` (docs/testbed.md has their figures).
integration: venv deps
	$(PYTEST) tests/integration -q -m "not slow"

# Operator journeys (tests/journeys): the commands of README.md and docs/ run as written on the seed testbed.
journeys: venv deps
	$(PYTEST) tests/journeys -q -m "journey and not slow"

integration-slow: venv deps
	$(PYTEST) tests/integration -q -m slow

molecule: venv deps
	$(BIN)/python testbed/fleet down
	cd $(CURDIR) && for s in $$(ls molecule/*/molecule.yml | cut -d/ -f2); do \
	  SPARKFLEET_RUNS_DIR=$(CURDIR)/runs $(BIN)/molecule test -s $$s || exit 1; done

test: deps venv venv-kernels lint unit kernels molecule integration journeys
	$(BIN)/python testbed/fleet down

test-all: test unit-slow integration-slow
	$(BIN)/python testbed/fleet down

up: venv deps
	$(BIN)/python testbed/fleet up --scenario seed

down:
	@$(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON)) testbed/fleet down

status:
	@$(PYTHON) testbed/fleet status

demo: deps venv
	$(BIN)/python testbed/fleet down
	$(BIN)/python testbed/fleet up --scenario seed
	$(BIN)/ansible-playbook playbooks/pack_engram.yml \
	  -e engram_relocate_stale=true -e engram_relocate_remove_source=true -e engram_restart_engine=true

clean: down
	rm -rf $(VENV) .ansible .cache runs .pytest_cache
