#!/usr/bin/env bash
# slurm-local.sh - a real single-node Slurm cluster on this machine, for trying `diagnose slurm` and for its tests.
#
#   bash scripts/slurm-local.sh up        install Debian's Slurm/munge/slurmdbd/MariaDB if missing, start them
#   bash scripts/slurm-local.sh down      stop what `up` started, by PID (add --wipe to delete the state too)
#   bash scripts/slurm-local.sh status    say which daemons are running; exit 0 only when the node is ready
#
# Then:  source "${SLURM_LOCAL_DIR:-/tmp/slurm-local}/slurm.env"   (exports SLURM_CONF)
#
# Needs root and no systemd (daemons are started directly and tracked by their pid files). Idempotent: `up` on a
# running cluster reuses it. No cgroups are used (proctrack/linuxproc, task/none), so it works in containers.
# Knobs (environment, all optional):
#   SLURM_LOCAL_DIR=/tmp/slurm-local    config, state, logs and the accounting DB
#   SLURM_LOCAL_ACCOUNTING=1            0: no slurmdbd/MariaDB (sacct then does not work)
#   SLURM_LOCAL_INSTALL=1               0: never run apt-get, fail when packages are missing
#   SLURM_LOCAL_MIN_JOB_AGE=300         seconds slurmctld remembers a finished job (scontrol); small = sacct route
#   SLURM_LOCAL_TIMEOUT=60              seconds to wait for each daemon
#   SLURM_LOCAL_CLUSTER=localcluster    SLURM_LOCAL_DB_PORT=13306  SLURM_LOCAL_CTLD_PORT=6817
#   SLURM_LOCAL_SLURMD_PORT=6818        SLURM_LOCAL_DBD_PORT=6819
set -uo pipefail

DIR=${SLURM_LOCAL_DIR:-/tmp/slurm-local}
ACCOUNTING=${SLURM_LOCAL_ACCOUNTING:-1}
MIN_JOB_AGE=${SLURM_LOCAL_MIN_JOB_AGE:-300}
WAIT=${SLURM_LOCAL_TIMEOUT:-60}
CLUSTER=${SLURM_LOCAL_CLUSTER:-localcluster}
DB_PORT=${SLURM_LOCAL_DB_PORT:-13306}
CTLD_PORT=${SLURM_LOCAL_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_LOCAL_SLURMD_PORT:-6818}
DBD_PORT=${SLURM_LOCAL_DBD_PORT:-6819}
DB_PASSWORD=slurmlocal
RUN=$DIR/run
LOGS=$DIR/log
export SLURM_CONF=$DIR/etc/slurm.conf   # every Slurm command below finds the cluster through this

say() { echo "slurm-local: $*" >&2; }
fail() {  # fail MESSAGE [LOGFILE]: print the message and the log's tail, exit 1
  say "ERROR: $1"
  if [ -n "${2:-}" ] && [ -f "$2" ]; then echo "---- tail of $2" >&2; tail -n 20 "$2" >&2; fi
  exit 1
}

# A pid is running unless gone or a zombie (PID 1 here reaps orphans only every ~2 s).
pid_running() { [ -e "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
# pidfile_alive FILE NAME: the file names a running process whose command is NAME (guards against pid reuse).
pidfile_alive() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && pid_running "$pid"
}
# probe SNIPPET: run a check with a bound, so a daemon that accepts but never answers cannot hang us.
probe() { timeout 5 bash -c "$1" >/dev/null 2>&1; }
# wait_for NAME PIDFILE LOG SNIPPET: until the probe passes; give up early when the daemon died.
wait_for() {
  local name=$1 pidfile=$2 logfile=$3 snippet=$4 started=$SECONDS
  until probe "$snippet"; do
    if [ $((SECONDS - started)) -ge 2 ] && ! pidfile_alive "$pidfile" "$name"; then
      fail "$name exited while starting" "$logfile"
    fi
    [ $((SECONDS - started)) -ge "$WAIT" ] && fail "$name did not answer within ${WAIT}s" "$logfile"
    sleep 0.2
  done
  say "$name up (pid $(cat "$pidfile" 2>/dev/null || echo '?'))"
}

controller_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
node_ready() {  # the node accepts jobs; a node left down/drained by an earlier run is resumed
  local host state
  host=$(hostname -s)
  state=$(sinfo -h -n "$host" -o %T 2>/dev/null)
  case "$state" in
    idle|mixed|allocated|completing) return 0 ;;
    down*|drain*) scontrol update NodeName="$host" State=RESUME >/dev/null 2>&1 ;;
  esac
  return 1
}
export -f controller_up node_ready

install_packages() {
  local wanted=(slurmctld slurmd slurm-client munge) missing=() pkg
  [ "$ACCOUNTING" = 1 ] && wanted+=(slurmdbd mariadb-server)
  for pkg in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  [ "${#missing[@]}" = 0 ] && return 0
  [ "${SLURM_LOCAL_INSTALL:-1}" = 1 ] || fail "packages missing and SLURM_LOCAL_INSTALL=0: ${missing[*]}"
  command -v apt-get >/dev/null || fail "packages missing and no apt-get here: ${missing[*]}"
  say "installing ${missing[*]} with apt-get"
  # The packages' postinst would start the system's own daemons; a policy-rc.d that says no keeps them off.
  local own_policy=0 rc=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    > "$LOGS/apt.log" 2>&1 || rc=$?
  [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || fail "apt-get install failed (exit $rc)" "$LOGS/apt.log"
}

write_config() {  # sets CONFIG_CHANGED=1 when slurm.conf differs from the running one
  local host hw accounting_lines
  host=$(hostname -s)
  [ -n "$host" ] || fail "hostname -s is empty"
  # the node's real sockets/cores (slurmd -C) so slurmd does not complain; memory kept modest on purpose
  hw=$(slurmd -C 2>/dev/null | head -n 1 | sed -E 's/^NodeName=[^ ]+ //; s/ RealMemory=[0-9]+//')
  [ -n "$hw" ] || hw="CPUs=$(nproc)"
  if [ "$ACCOUNTING" = 1 ]; then
    accounting_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoreFlags=job_comment,job_script,job_env"
  else
    accounting_lines="AccountingStorageType=accounting_storage/none"
  fi
  cat > "$DIR/etc/slurm.conf.next" <<EOF
# written by scripts/slurm-local.sh
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
MinJobAge=$MIN_JOB_AGE
KillWait=5
InactiveLimit=0
MailProg=/bin/true
$accounting_lines
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.log
NodeName=$host NodeAddr=127.0.0.1 $hw RealMemory=1024 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  CONFIG_CHANGED=0
  if cmp -s "$DIR/etc/slurm.conf.next" "$SLURM_CONF"; then
    rm -f "$DIR/etc/slurm.conf.next"
  else
    mv "$DIR/etc/slurm.conf.next" "$SLURM_CONF"
    CONFIG_CHANGED=1
  fi
  if [ "$ACCOUNTING" = 1 ]; then
    # slurmdbd reads slurmdbd.conf beside slurm.conf and refuses one readable by others
    (umask 077 && cat > "$DIR/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
DebugLevel=info
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASSWORD
StorageLoc=slurm_acct_db
EOF
    )
    chmod 600 "$DIR/etc/slurmdbd.conf"
  fi
  printf 'export SLURM_CONF=%s\n' "$SLURM_CONF" > "$DIR/slurm.env"
}

start_munge() {
  if probe 'munge -n | unmunge'; then say "munged already answering; reusing it"; return 0; fi
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge && chmod 755 /run/munge
  runuser -u munge -- /usr/sbin/munged --force 9>&- || fail "munged did not start" /var/log/munge/munged.log
  local started=$SECONDS
  until probe 'munge -n | unmunge'; do
    [ $((SECONDS - started)) -ge "$WAIT" ] && fail "munged not answering" /var/log/munge/munged.log
    sleep 0.2
  done
  cp /run/munge/munged.pid "$RUN/munged.pid"   # our mark: `down` stops munged only when we started it
  say "munged up (pid $(cat "$RUN/munged.pid"))"
}

start_database() {
  local db=$DIR/db socket=$DIR/db/mysql.sock
  if pidfile_alive "$RUN/mariadbd.pid" mariadbd; then
    # never start a second one beside a slow one: wait for the running one to answer
    wait_for mariadbd "$RUN/mariadbd.pid" "$db/mariadb.log" "mariadb-admin --no-defaults -S '$socket' ping"
  else
    # mariadbd runs as mysql: its socket, pid file and log must sit in a folder mysql owns
    mkdir -p "$db" && chown mysql:mysql "$db"
    if [ ! -d "$db/data/mysql" ]; then
      rm -rf "$db/data" && mkdir -p "$db/data" && chown mysql:mysql "$db/data"
      mariadb-install-db --no-defaults --datadir="$db/data" --user=mysql --auth-root-authentication-method=socket \
        --skip-test-db > "$LOGS/mariadb-install.log" 2>&1 || fail "mariadb-install-db failed" "$LOGS/mariadb-install.log"
    fi
    setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$db/data" --socket="$socket" --port="$DB_PORT" \
      --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$db/mariadb.pid" --log-error="$db/mariadb.log" \
      --skip-log-bin --innodb-buffer-pool-size=128M --innodb-log-file-size=64M --innodb-lock-wait-timeout=900 \
      </dev/null >/dev/null 2>&1 9>&- &
    echo $! > "$RUN/mariadbd.pid"   # mariadbd's own pid file appears late and root cannot hand it to mysql
    wait_for mariadbd "$RUN/mariadbd.pid" "$db/mariadb.log" "mariadb-admin --no-defaults -S '$socket' ping"
  fi
  mariadb --no-defaults -S "$socket" -u root -e "
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || fail "could not create the slurm database user" "$db/mariadb.log"
  if pidfile_alive "$RUN/slurmdbd.pid" slurmdbd; then
    say "slurmdbd already running; reusing it"
  else
    /usr/sbin/slurmdbd 9>&- || fail "slurmdbd did not start" "$LOGS/slurmdbd.log"
    wait_for slurmdbd "$RUN/slurmdbd.pid" "$LOGS/slurmdbd.log" "sacctmgr -n -P list cluster"
  fi
}

start_slurm() {
  local host
  host=$(hostname -s)
  if pidfile_alive "$RUN/slurmctld.pid" slurmctld; then
    # A busy slurmctld may be slow to answer; starting a second one would purge the first one's new jobs as
    # "defunct" on its way up, so wait for the running one instead.
    wait_for slurmctld "$RUN/slurmctld.pid" "$LOGS/slurmctld.log" controller_up
    if [ "$CONFIG_CHANGED" = 1 ]; then scontrol reconfigure || fail "scontrol reconfigure failed" "$LOGS/slurmctld.log"; fi
  else
    /usr/sbin/slurmctld 9>&- || fail "slurmctld did not start" "$LOGS/slurmctld.log"
    wait_for slurmctld "$RUN/slurmctld.pid" "$LOGS/slurmctld.log" controller_up
  fi
  if pidfile_alive "$RUN/slurmd.pid" slurmd; then
    say "slurmd already running; reusing it"
    local started=$SECONDS
    until probe node_ready; do
      [ $((SECONDS - started)) -ge "$WAIT" ] && fail "node $host not ready: $(sinfo -h -n "$host" -o '%T %E' 2>&1)" "$LOGS/slurmd.log"
      sleep 0.2
    done
  else
    /usr/sbin/slurmd -N "$host" 9>&- || fail "slurmd did not start" "$LOGS/slurmd.log"
    wait_for slurmd "$RUN/slurmd.pid" "$LOGS/slurmd.log" node_ready
  fi
}

cmd_up() {
  [ "$(id -u)" = 0 ] || fail "must run as root (munged, slurmd and mariadbd need it)"
  mkdir -p "$DIR"/etc "$DIR"/state "$DIR"/spool "$LOGS" "$RUN"
  chmod 755 "$DIR"   # mysql must be able to reach $DIR/db
  install_packages
  write_config
  start_munge
  [ "$ACCOUNTING" = 1 ] && start_database
  start_slurm
  say "cluster $CLUSTER up on $(hostname -s); accounting=$ACCOUNTING; now: source $DIR/slurm.env"
  echo "SLURM_CONF=$SLURM_CONF"
}

# stop NAME PIDFILE [SECONDS]: TERM, wait, then KILL
stop() {
  local name=$1 pidfile=$2 grace=${3:-20} pid deadline
  if ! pidfile_alive "$pidfile" "$name"; then rm -f "$pidfile"; return 0; fi
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null
  deadline=$((SECONDS + grace))
  while pid_running "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  if pid_running "$pid"; then say "$name (pid $pid) ignored TERM; killing it"; kill -KILL "$pid" 2>/dev/null; fi
  say "$name (pid $pid) stopped"
  rm -f "$pidfile"
}

cmd_down() {
  if pidfile_alive "$RUN/slurmctld.pid" slurmctld; then
    # cancel live jobs first so their slurmstepd processes end by themselves
    local live deadline
    live=$(squeue -h -o %A -t PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING 2>/dev/null | sort -u | tr '\n' ' ')
    if [ -n "${live// /}" ]; then
      say "cancelling jobs: $live"
      # shellcheck disable=SC2086 # one argument per job id
      scancel $live 2>/dev/null
      deadline=$((SECONDS + 30))
      while [ -n "$(squeue -h -o %A -t RUNNING,COMPLETING,CONFIGURING 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.5
      done
    fi
  fi
  stop slurmd "$RUN/slurmd.pid"
  stop slurmctld "$RUN/slurmctld.pid"
  stop slurmdbd "$RUN/slurmdbd.pid"
  stop mariadbd "$RUN/mariadbd.pid" 60
  if [ -s "$RUN/munged.pid" ]; then
    if [ "$(cat "$RUN/munged.pid")" = "$(cat /run/munge/munged.pid 2>/dev/null)" ]; then
      stop munged "$RUN/munged.pid"
    else
      say "munged was restarted by someone else; leaving it alone"; rm -f "$RUN/munged.pid"
    fi
  fi
  if [ "${1:-}" = --wipe ]; then
    case "$DIR" in /|/tmp|/root|/home|"") fail "refusing to delete '$DIR'" ;; esac
    rm -rf "$DIR" && say "deleted $DIR"
  fi
  return 0
}

cmd_status() {
  local name ok=0
  for name in munged mariadbd slurmdbd slurmctld slurmd; do
    if pidfile_alive "$RUN/$name.pid" "$name"; then echo "$name running (pid $(cat "$RUN/$name.pid"))"
    else echo "$name not running (by our pid files)"; fi
  done
  if [ -f "$SLURM_CONF" ] && probe controller_up && probe node_ready; then
    echo "ready: source $DIR/slurm.env"
  else
    echo "not ready"; ok=1
  fi
  return "$ok"
}

# up and down from several shells at once (parallel test sessions) take turns; the daemons are started with
# fd 9 closed (9>&-) so they do not hold the lock after the script ends
with_lock() {
  mkdir -p "$DIR"
  exec 9> "$DIR/.lock"
  flock -w 600 9 || fail "waited 600 s for another slurm-local.sh (lock $DIR/.lock)"
  "$@"
}

case "${1:-}" in
  up) with_lock cmd_up ;;
  down) shift; with_lock cmd_down "$@" ;;
  status) cmd_status ;;
  *) echo "usage: $0 up | down [--wipe] | status" >&2; exit 2 ;;
esac
