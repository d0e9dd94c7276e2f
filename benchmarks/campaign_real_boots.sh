#!/usr/bin/env bash
# The campaign's own overhead (issue 23 "Performance": everything but boots and benchmarks) with boots of the
# real fleet's length: a fresh seed testbed serving at SIM_TIME_SCALE=1.0 with SIM_BOOT_S seconds a boot
# (docs/simulator.md; docs/reference.md section 10: 3-6 min), then a campaign plan (default: the 2-rung
# tests/integration/fixtures/campaigns/testbed-real-default.yml, the shipped default plan's benchmark workloads;
# testbed-real-boots.yml is the shorter c1-only plan of the first measurement); prints the campaign's `overhead`
# (its state file), each rung's orchestration (benchmarks/rung_profile.py) and the load average before and after.
#
#   SPARKFLEET_TESTBED_ID=<k> ANSIBLE_HOME=$PWD/.ansible-<k> flock /tmp/sparkfleet-heavy.lock \
#     benchmarks/campaign_real_boots.sh [SIM_BOOT_S, default 240] [PLAN]
set -euo pipefail
cd "$(dirname "$0")/.."
boot="${1:-240}"
plan="${2:-tests/integration/fixtures/campaigns/testbed-real-default.yml}"
[ -f "$plan" ] || { echo "no plan file $plan" >&2; exit 2; }
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) ($(date -u +%FT%TZ))"
case "$boot" in (*[!0-9]*|'') echo "SIM_BOOT_S must be a whole number of seconds" >&2; exit 2;; esac
export PATH="$PWD/.venv/bin:$PATH" ANSIBLE_CONFIG="$PWD/ansible.cfg"
python3 testbed/fleet down >/dev/null
python3 testbed/fleet up --hosts 3 --scenario seed
incumbent=inventory/testbed/group_vars/all/incumbent.yml
# The workers start first and wait for the head at the rendezvous after their own weight load: allow the head's.
printf 'engine_env_incumbent:\n  SIM_TIME_SCALE: "1.0"\n  SIM_BOOT_S: "%s"\n  SIM_RENDEZVOUS_TIMEOUT_S: "120"\n' "$boot" >"$incumbent"
trap 'rm -f "$incumbent"' EXIT
started=$(date +%s)
ansible-playbook playbooks/engine.yml >/dev/null
echo "the fleet served after $(( $(date +%s) - started )) s (one boot of SIM_BOOT_S=$boot)"
before=$(ls -d runs/*-campaign 2>/dev/null | sort | tail -1 || true)
log=$(mktemp)
rc=0
ansible-playbook playbooks/campaign.yml -e window_confirmed=true -e window_end=4h \
  -e "campaign_plan=$plan" >"$log" 2>&1 || rc=$?
tail -25 "$log"; rm -f "$log"
echo "campaign.yml rc=$rc"
folder=$(ls -d runs/*-campaign | sort | tail -1)
[ "$folder" != "$before" ] || { echo "no new campaign folder" >&2; exit 1; }
python3 - "$folder" <<'PY'
import json, sys
state = json.load(open(sys.argv[1] + "/campaign-state.json"))
print(sys.argv[1], json.dumps(state.get("overhead")))
for r in state["rungs"]:
    print(r["id"], r["status"], r.get("outcome"), r.get("duration_s"), r.get("nested_s"))
PY
python3 benchmarks/rung_profile.py "$folder" --top 15 || true
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) ($(date -u +%FT%TZ))"
