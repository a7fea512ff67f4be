#!/usr/bin/env bash
# CI: install SLURM + accounting from Debian and start the dev cluster under /tmp/rlvr-slurm, so that
# tests/launchers/test_slurm.py runs against it. Idempotent. Never fails CI: if anything does not work it
# prints a warning and exits 0, and the SLURM tests then skip with a reason.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SLURM_TEST_ROOT=${SLURM_TEST_ROOT:-/tmp/rlvr-slurm}   # the root tests/launchers/test_slurm.py looks at
warn() { echo "ci-slurm: WARNING: $*; the SLURM launcher tests will be skipped" >&2; exit 0; }

packages=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)
installed=$(dpkg-query -W -f='${Status}\n' "${packages[@]}" 2>/dev/null | grep -c 'install ok installed')
if [[ $installed == "${#packages[@]}" ]]; then
  echo "ci-slurm: packages already installed"
else
  [[ $(id -u) == 0 ]] || warn "not root, cannot apt-get install ${packages[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${packages[@]}"; } >/tmp/rlvr-ci-slurm-apt.log 2>&1 \
    || { tail -n 20 /tmp/rlvr-ci-slurm-apt.log >&2; warn "apt-get install failed (log: /tmp/rlvr-ci-slurm-apt.log)"; }
fi
timeout 180 bash "$here/slurm-cluster.sh" start || warn "the cluster did not start (logs: $SLURM_TEST_ROOT/log)"
bash "$here/slurm-cluster.sh" status || warn "the cluster does not answer"
