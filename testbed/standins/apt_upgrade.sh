#!/bin/sh
# Stand-in for the node update command on a testbed host (hosts have no route to a mirror): records each
# run in /var/lib/testbed/apt-upgrade.log (not with --simulate) (a node that was never updated has no log) and prints what
# `apt-get -y upgrade` prints when held packages are kept back. playbooks/node_updates.yml runs it.
set -e
if [ "$1" != "--simulate" ]; then   # --simulate: what check mode runs; it records nothing
  mkdir -p /var/lib/testbed
  echo "$(date +%s) $*" >> /var/lib/testbed/apt-upgrade.log
fi
held=$(apt-mark showhold 2>/dev/null | tr '\n' ' ')
echo "Reading package lists..."
echo "Building dependency tree..."
echo "Calculating upgrade..."
if [ -n "$held" ]; then
  echo "The following packages have been kept back:"
  echo "  $held"
fi
echo "0 upgraded, 0 newly installed, 0 to remove and $(echo $held | wc -w) not upgraded."
