#!/usr/bin/env bash
# Throwaway single-node SLURM cluster (with accounting) for developing and testing the SLURM launcher.
# munged + [mariadbd + slurmdbd] + slurmctld + slurmd, all as root, started by hand (no systemd, no cgroups),
# everything under $SLURM_TEST_ROOT (default /tmp/rlvr-slurm); clients find it through SLURM_CONF.
#
#   launchers/slurm-cluster.sh start    # idempotent: writes config, starts what is not running, waits for the node
#   launchers/slurm-cluster.sh stop     # idempotent: cancels jobs, stops the daemons by their pid files
#   launchers/slurm-cluster.sh status   # node state + queue length
#   launchers/slurm-cluster.sh env      # prints `export SLURM_CONF=...`: eval "$(launchers/slurm-cluster.sh env)"
#
# Debian 12: apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge slurmdbd mariadb-server
# Accounting (SLURM_TEST_ACCOUNTING=1, the default when slurmdbd and mariadbd exist) is what makes `sacct` work;
# without it submitit sees a job end only through its result pickle, so a job killed hard (SIGKILL, OOM, scancel,
# time limit) makes the Hydra launcher wait forever.
# Knobs: SLURM_TEST_CPUS (default max(nproc, 4): slots, oversubscribing the real cores; 4 hold one 2-task job of
# tests/launchers/test_slurm_distributed.py beside a two-run grid; those tests skip below 2), SLURM_TEST_MEM_MB,
# SLURM_TEST_DEF_MEM_PER_CPU, SLURM_TEST_CRED_EXPIRE (default 10 s; SLURM's 120 s is also how long a requeued job
# waits), SLURM_TEST_KILL_WAIT (default 60 s, see KillWait below),
# SLURM_TEST_{CTLD,SLURMD,DBD,MYSQL}_PORT (6817/6818/6819/3307, loopback only).
# A changed config takes effect after `stop` then `start` (`start` leaves running daemons alone).
# To reset, delete the whole root, never only state/ (job ids would restart while the DB keeps the old ones).
set -euo pipefail

ROOT=$(readlink -m "${SLURM_TEST_ROOT:-/tmp/rlvr-slurm}")
CONF=$ROOT/etc/slurm.conf
DBD_CONF=$ROOT/etc/slurmdbd.conf          # slurmdbd looks for slurmdbd.conf beside $SLURM_CONF
MUNGE_SOCKET=$ROOT/munge/run/munge.socket
MYSQL_DIR=$ROOT/mysql
NODE=$(hostname -s)
CPUS=${SLURM_TEST_CPUS:-$(( $(nproc) > 4 ? $(nproc) : 4 ))}
MEM_MB=${SLURM_TEST_MEM_MB:-$(awk '/MemTotal/ {printf "%d", $2/1024*0.85}' /proc/meminfo)}
DEF_MEM_PER_CPU=${SLURM_TEST_DEF_MEM_PER_CPU:-1024}   # without it a job without --mem takes the whole node
CTLD_PORT=${SLURM_TEST_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_TEST_SLURMD_PORT:-6818}
DBD_PORT=${SLURM_TEST_DBD_PORT:-6819}
MYSQL_PORT=${SLURM_TEST_MYSQL_PORT:-3307}
if [[ -z ${SLURM_TEST_ACCOUNTING:-} ]]; then
  SLURM_TEST_ACCOUNTING=0
  command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && SLURM_TEST_ACCOUNTING=1
fi
export SLURM_CONF=$CONF

log() { echo "[slurm-cluster] $*" >&2; }
# pid_alive PIDFILE NAME: the pid in PIDFILE runs a program called NAME (guards against reused pids)
pid_alive() { local p; p=$(cat "$1" 2>/dev/null) && [[ -n $p && $(cat "/proc/$p/comm" 2>/dev/null) == "$2" ]]; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() {  # wait_for SECONDS WHAT CMD...  (polls CMD every 0.2 s until it succeeds)
  local deadline=$(( SECONDS + $1 )) what=$2; shift 2
  while (( SECONDS < deadline )); do "$@" && return 0; sleep 0.2; done
  log "timed out waiting for $what"; return 1
}

write_config() {
  mkdir -p "$ROOT"/{etc,state,spool/slurmd,log,run} "$ROOT"/munge/{etc,run,lib,log}
  chmod 755 "$ROOT/munge" "$ROOT/munge/run"            # munged: the socket's folder must be o+x
  chmod 700 "$ROOT/munge/etc" "$ROOT/munge/lib" "$ROOT/munge/log"
  if [[ ! -s $ROOT/munge/etc/munge.key ]]; then
    if [[ -r /etc/munge/munge.key ]]; then cp /etc/munge/munge.key "$ROOT/munge/etc/munge.key"
    else mungekey --create --keyfile="$ROOT/munge/etc/munge.key"; fi
  fi
  chmod 600 "$ROOT/munge/etc/munge.key"
  local acct="AccountingStorageType=accounting_storage/none"
  if [[ $SLURM_TEST_ACCOUNTING == 1 ]]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=${DBD_PORT}
AccountingStoragePass=${MUNGE_SOCKET}"
    cat > "$DBD_CONF.tmp" <<EOF
AuthType=auth/munge
AuthInfo=socket=${MUNGE_SOCKET}
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=${DBD_PORT}
SlurmUser=root
DebugLevel=info
LogFile=${ROOT}/log/slurmdbd.log
PidFile=${ROOT}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=${MYSQL_PORT}
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DBD_CONF.tmp"; mv "$DBD_CONF.tmp" "$DBD_CONF"   # slurmdbd refuses a readable conf
  fi
  cat > "$CONF.tmp" <<EOF
ClusterName=testcluster
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${MUNGE_SOCKET},cred_expire=${SLURM_TEST_CRED_EXPIRE:-10}
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
StateSaveLocation=${ROOT}/state
SlurmdSpoolDir=${ROOT}/spool/slurmd
SlurmctldPidFile=${ROOT}/run/slurmctld.pid
SlurmdPidFile=${ROOT}/run/slurmd.pid
SlurmctldLogFile=${ROOT}/log/slurmctld.log
SlurmdLogFile=${ROOT}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
${acct}
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
# with cred_expire (AuthInfo) these make a requeued job start again within seconds, not minutes
SchedulerParameters=bf_interval=1,sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=${DEF_MEM_PER_CPU}
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
# KillWait: seconds between SIGTERM and SIGKILL when a job is requeued (scontrol requeue), cancelled, preempted
# without GraceTime, or reaches its time limit. rlvr answers SIGTERM by finishing the step it is in and
# checkpointing (exit 75), so this must exceed one step plus one checkpoint write, or the step's work and all
# since the last periodic checkpoint are lost. SLURM's default is 30 s; 5 s killed a 6 s step mid-way.
# (No preemption here: PreemptType is none, so GraceTime, which on a preempting cluster sends SIGTERM
# GraceTime seconds before this SIGTERM-then-KillWait sequence, does not apply.)
KillWait=${SLURM_TEST_KILL_WAIT:-60}
MinJobAge=300
Waittime=0
SlurmdParameters=config_overrides
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${MEM_MB} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"
}

start_munge() {
  pid_alive "$ROOT/munge/run/munged.pid" munged && return 0
  rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
  munged --socket="$MUNGE_SOCKET" --key-file="$ROOT/munge/etc/munge.key" \
    --pid-file="$ROOT/munge/run/munged.pid" --log-file="$ROOT/munge/log/munged.log" \
    --seed-file="$ROOT/munge/lib/munged.seed"          # forks into the background itself
  munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET" >/dev/null
}

mysql_ping() { mariadb-admin --no-defaults --socket="$MYSQL_DIR/mysqld.sock" -uroot ping >/dev/null 2>&1; }

start_mysql() {
  pid_alive "$MYSQL_DIR/mariadbd.pid" mariadbd && return 0
  if [[ ! -d $MYSQL_DIR/data/mysql ]]; then
    mkdir -p "$MYSQL_DIR"
    mariadb-install-db --no-defaults --user=root --datadir="$MYSQL_DIR/data" \
      --auth-root-authentication-method=normal --skip-test-db >"$MYSQL_DIR/install.log" 2>&1
  fi
  # mariadbd does not daemonize: detach it; loopback only
  setsid mariadbd --no-defaults --user=root --datadir="$MYSQL_DIR/data" --socket="$MYSQL_DIR/mysqld.sock" \
    --port="$MYSQL_PORT" --bind-address=127.0.0.1 --pid-file="$MYSQL_DIR/mariadbd.pid" \
    --log-error="$MYSQL_DIR/error.log" --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
    </dev/null >/dev/null 2>&1 &
  wait_for 60 mariadbd mysql_ping
  mariadb --no-defaults --socket="$MYSQL_DIR/mysqld.sock" -uroot -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    FLUSH PRIVILEGES;"
}

start_slurmdbd() {
  pid_alive "$ROOT/run/slurmdbd.pid" slurmdbd && return 0
  slurmdbd                                            # reads slurmdbd.conf beside $SLURM_CONF; daemonizes
  wait_for 60 slurmdbd port_open "$DBD_PORT"
}

start_slurm() {
  if ! pid_alive "$ROOT/run/slurmctld.pid" slurmctld; then
    slurmctld -i                                     # -i: ignore unreadable old state; daemonizes
    wait_for 30 slurmctld port_open "$CTLD_PORT" || { tail -n 20 "$ROOT/log/slurmctld.log" >&2; return 1; }
  fi
  if ! pid_alive "$ROOT/run/slurmd.pid" slurmd; then
    slurmd                                           # daemonizes; node name = hostname -s
  fi
}

node_ready() {
  local st
  st=$(timeout 10 sinfo -h -N -n "$NODE" -o '%T' 2>/dev/null || true)
  case $st in
    idle*|mixed*|allocated*|completing*) return 0 ;;
    down*|drain*|fail*) scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;;
  esac
  return 1
}

stop_all() {  # stop_all PIDFILE NAME [PIDFILE NAME ...]: SIGTERM those pids, wait up to 15 s, SIGKILL leftovers
  local pids=() pid
  while (( $# )); do
    if pid_alive "$1" "$2"; then pid=$(cat "$1"); pids+=("$pid"); kill "$pid" 2>/dev/null || true; fi
    rm -f "$1"; shift 2
  done
  for _ in $(seq 1 150); do
    local alive=0
    for pid in "${pids[@]}"; do [[ -d /proc/$pid ]] && alive=1; done
    (( alive )) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do [[ -d /proc/$pid ]] && kill -9 "$pid" 2>/dev/null || true; done
}

case ${1:-} in
  start)
    t0=$SECONDS
    for b in munged slurmctld slurmd sinfo; do command -v $b >/dev/null || { log "missing $b"; exit 1; }; done
    write_config
    start_munge
    if [[ $SLURM_TEST_ACCOUNTING == 1 ]]; then start_mysql; start_slurmdbd; fi
    start_slurm
    if ! wait_for "${SLURM_TEST_START_TIMEOUT:-60}" "node $NODE" node_ready; then
      tail -n 20 "$ROOT"/log/*.log >&2 || true; exit 1
    fi
    log "ready (accounting=$SLURM_TEST_ACCOUNTING) in $(( SECONDS - t0 )) s; export SLURM_CONF=$CONF"
    ;;
  stop)
    if pid_alive "$ROOT/run/slurmctld.pid" slurmctld; then
      scancel --user=root >/dev/null 2>&1 || true
      wait_for 10 "jobs to leave" bash -c '[[ -z $(squeue -h -t R,CG,PD 2>/dev/null) ]]' || true
    fi
    stop_all "$ROOT/run/slurmd.pid" slurmd "$ROOT/run/slurmctld.pid" slurmctld
    stop_all "$ROOT/run/slurmdbd.pid" slurmdbd "$MYSQL_DIR/mariadbd.pid" mariadbd "$ROOT/munge/run/munged.pid" munged
    log "stopped"
    ;;
  status)
    sinfo -h -N -n "$NODE" -o '%N %T cpus=%c mem=%m' && echo "jobs in queue: $(squeue -h | wc -l)"
    ;;
  env)
    echo "export SLURM_CONF=$CONF"
    ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
