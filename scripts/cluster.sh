#!/usr/bin/env bash
# A real SLURM cluster (with accounting) or a two-node Ray cluster on this one machine, for the executors' tests
# and for trying hardware.executor=slurm|ray by hand (docs/scale_out.md).
#
#   bash scripts/cluster.sh slurm start     # munged, MariaDB, slurmdbd, slurmctld, slurmd; waits for sinfo and sacct
#   bash scripts/cluster.sh ray start       # a Ray head and a second worker node (resource "worker_node")
#   bash scripts/cluster.sh slurm|ray status|stop|env
#   bash scripts/cluster.sh ray kill-worker # SIGKILLs the worker node (a fault test); start brings it back
#   bash scripts/cluster.sh slurm stop-slurmd  # stops the node's slurmd alone (a fault test); start brings it back
#   bash scripts/cluster.sh mlflow start    # an MLflow server for runs that write from several processes or nodes
#
# Idempotent: start on a running cluster only checks it. Everything it writes lives in
# ${CLUSTER_DIR:-/tmp/agent-trainer-cluster}/{slurm,ray,mlflow}; stop kills exactly the processes whose pids it recorded
# there (never `ray stop`, which would stop every Ray on the machine). Installs what is missing with apt-get
# (root) the first time: slurm-wlm, munge, slurmdbd, mariadb-server. SLURM commands find the cluster through
# SLURM_CONF (see `env`); when /etc/slurm/slurm.conf is absent it is linked to ours, so a plain shell finds it too.
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${1:-}
ACTION=${2:-status}
ROOT=${CLUSTER_DIR:-/tmp/agent-trainer-cluster}
VENV=${VENV:-.venv}
PY=$(realpath -s "$VENV/bin/python" 2>/dev/null || command -v python3)
CPUS=${CLUSTER_CPUS:-2}          # the node's CPUs as SLURM and Ray see them (this machine: 2 cores)
CLUSTER_NAME=agenttrainer
# Ports of their own, so that a system SLURM or another user's Ray on the usual ports is left alone.
SLURMCTLD_PORT=${SLURMCTLD_PORT:-6917}
SLURMD_PORT=${SLURMD_PORT:-6918}
SLURMDBD_PORT=${SLURMDBD_PORT:-6919}
MYSQL_PORT=${MYSQL_PORT:-3317}
RAY_PORT=${RAY_PORT:-6389}
MLFLOW_PORT=${MLFLOW_PORT:-6920}
MUNGE_SOCKET=/run/munge/munge.socket.2
# Jobs pass requests and results of a few KB: 300 MB of object store per node, not Ray's 30% of the memory.
OBJECT_STORE=$((300 * 1024 * 1024))

die() { echo "cluster: error: $*" >&2; exit 1; }
say() { echo "cluster: $*"; }

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND until it succeeds.
wait_for() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "$what did not answer within ${limit}s (logs: $DIR/log)"
    sleep 1
  done
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pid PIDFILE: TERM the recorded process, wait up to 15 s, then KILL; the pid file goes either way.
stop_pid() {
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

install_missing() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurm-wlm)
  command -v munged >/dev/null || missing+=(munge)
  command -v slurmdbd >/dev/null || missing+=(slurmdbd)
  command -v mariadbd >/dev/null || missing+=(mariadb-server)
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || die "missing ${missing[*]}: install them (apt-get, as root)"
  say "installing ${missing[*]} (apt-get, ~1 min)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    >"$ROOT/apt.log" 2>&1 || die "apt-get install ${missing[*]} failed (log: $ROOT/apt.log)"
}

# ---------------------------------------------------------------- SLURM
slurm_env() {
  echo "export SLURM_CONF=$DIR/slurm.conf"
}

slurm_answers() {
  SLURM_CONF=$DIR/slurm.conf timeout 10 sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'
}
sacct_answers() { SLURM_CONF=$DIR/slurm.conf timeout 10 sacct -n -X -S now-1minutes >/dev/null 2>&1; }

slurm_write_config() {
  local host mem
  host=$(hostname -s)
  # SLURM drains a node that has less memory than configured: claim 80% of it.
  mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
  mkdir -p "$DIR"/{log,state,spool,munge,mysql}
  cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/cluster.sh for $(hostname -s): one node, root as SlurmUser, accounting in slurmdbd.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$SLURMCTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$SLURMDBD_PORT
JobCompType=jobcomp/none
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# Faults show quickly here: a lost slurmd is noticed in 30 s, a killed job's processes get 5 s.
SlurmdTimeout=30
KillWait=5
ReturnToService=2
MinJobAge=60
NodeName=$host NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$DIR/slurmdbd.conf" <<EOF
# Written by scripts/cluster.sh: slurmdbd on MariaDB (port $MYSQL_PORT), both started by it.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$SLURMDBD_PORT
SlurmUser=root
PidFile=$DIR/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$DIR/slurmdbd.conf"
}

slurm_start_munge() {
  alive "$DIR/munged.pid" && return 0
  if [ ! -f "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  # munged insists on its key being the munge user's and private, and its socket folder reachable by all.
  chown -R munge:munge "$DIR/munge"
  chmod 755 "$DIR/munge"   # clients need to reach its socket
  chmod 400 "$DIR/munge/munge.key"
  # The default socket: SLURM's clients (sacctmgr among them) do not all take another one from slurm.conf.
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  [ -S "$MUNGE_SOCKET" ] && munge -n >/dev/null 2>&1 && die "a munged not started by this script is running \
($MUNGE_SOCKET); stop it first"
  runuser -u munge -- munged --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" --num-threads=10 \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
    || die "munged did not start (log: $DIR/munge/munged.log)"
  cp "$DIR/munge/munged.pid" "$DIR/munged.pid"
  wait_for 10 munged munge -n
}

slurm_start_mysql() {
  alive "$DIR/mysqld.pid" && return 0
  local fresh=0
  if [ ! -d "$DIR/mysql/mysql" ]; then
    mariadb-install-db --user=root --datadir="$DIR/mysql" --auth-root-authentication-method=socket \
      >"$DIR/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed (log: $DIR/log/mariadb-install.log)"
    fresh=1
  fi
  nohup mariadbd --user=root --datadir="$DIR/mysql" --port="$MYSQL_PORT" --bind-address=127.0.0.1 \
    --socket="$DIR/mysql.sock" --pid-file="$DIR/mysqld.pid.mariadb" --log-error="$DIR/log/mariadb.log" \
    --skip-log-bin >/dev/null 2>&1 &
  echo $! >"$DIR/mysqld.pid"
  wait_for 60 MariaDB mariadb --socket="$DIR/mysql.sock" -e 'select 1'
  if [ "$fresh" = 1 ]; then
    mariadb --socket="$DIR/mysql.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
      CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  fi
}

slurm_start() {
  install_missing
  if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid" && slurm_answers && sacct_answers; then
    say "slurm is running ($DIR/slurm.conf)"; slurm_env; return 0
  fi
  slurm_write_config
  slurm_start_munge
  slurm_start_mysql
  if ! alive "$DIR/slurmdbd.pid"; then
    # slurmdbd reads the slurmdbd.conf beside SLURM_CONF (it has no -f).
    SLURM_CONF=$DIR/slurm.conf slurmdbd || die "slurmdbd did not start (log: $DIR/log/slurmdbd.log)"
  fi
  wait_for 60 slurmdbd env SLURM_CONF="$DIR/slurm.conf" timeout 10 sacctmgr -n list cluster
  # The cluster must be in the database before slurmctld registers with it.
  if ! SLURM_CONF=$DIR/slurm.conf sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER_NAME"; then
    SLURM_CONF=$DIR/slurm.conf sacctmgr -i add cluster "$CLUSTER_NAME" >/dev/null
  fi
  alive "$DIR/slurmctld.pid" || slurmctld -f "$DIR/slurm.conf" \
    || die "slurmctld did not start (log: $DIR/log/slurmctld.log)"
  alive "$DIR/slurmd.pid" || slurmd -f "$DIR/slurm.conf" || die "slurmd did not start (log: $DIR/log/slurmd.log)"
  wait_for 60 "slurmctld (sinfo: node idle)" slurm_answers
  wait_for 60 "slurmdbd (sacct)" sacct_answers
  if [ ! -e /etc/slurm/slurm.conf ] && [ -d /etc/slurm ]; then
    ln -s "$DIR/slurm.conf" /etc/slurm/slurm.conf
  fi
  say "slurm is up: $(SLURM_CONF=$DIR/slurm.conf sinfo -h -o '%P %D %T %c cpus')"
  slurm_env
}

slurm_stop() {
  # Daemons in reverse order. The state stays: job ids go on where they stopped, as the accounting database does.
  stop_pid "$DIR/slurmd.pid"
  stop_pid "$DIR/slurmctld.pid"
  stop_pid "$DIR/slurmdbd.pid"
  stop_pid "$DIR/mysqld.pid"
  stop_pid "$DIR/munged.pid"
  if [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$DIR/slurm.conf" ]; then rm -f /etc/slurm/slurm.conf; fi
  say "slurm stopped"
}

# slurm_stop_slurmd: the node's daemon goes away as on a lost node (its running steps stay, as slurmstepd does);
# slurmctld marks the node DOWN after SlurmdTimeout. `start` starts it again and the node returns to service.
slurm_stop_slurmd() {
  alive "$DIR/slurmd.pid" || die "slurmd is not running (bash scripts/cluster.sh slurm start)"
  stop_pid "$DIR/slurmd.pid"
  say "slurmd stopped"
}

slurm_status() {
  local up=1
  for d in munged mysqld slurmdbd slurmctld slurmd; do
    if alive "$DIR/$d.pid"; then echo "  $d: running (pid $(cat "$DIR/$d.pid"))"; else echo "  $d: stopped"; up=0; fi
  done
  [ "$up" = 1 ] && slurm_answers && sacct_answers || { say "slurm is not running"; return 3; }
  SLURM_CONF=$DIR/slurm.conf sinfo
  slurm_env
}

# ---------------------------------------------------------------- Ray
ray_cli() { "$PY" -c 'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; main()' "$@"; }

ray_env() {
  echo "export RAY_ADDRESS=127.0.0.1:$RAY_PORT"
}

# ray_active_nodes: how many nodes the head counts as alive (`ray status`'s "Active:" list); nothing when the head
# does not answer. A killed node stays in the resource totals for a while; it leaves the Active list.
ray_active_nodes() {
  local out
  out=$(RAY_ADDRESS=127.0.0.1:$RAY_PORT timeout 60 "$PY" -c \
    'import sys; from ray.scripts.scripts import main; sys.argv[0] = "ray"; main()' status 2>/dev/null) || return 0
  echo "$out" | awk '/^Active:/ {on = 1; next} /^Pending:/ {on = 0} on && /node_/ {n++} END {print n + 0}'
}

ray_answers() { [ "$(ray_active_nodes)" = 2 ]; }

# ray_pids: the processes of our cluster: those whose command line names our temp folder or our GCS port.
ray_pids() {
  local pid
  local ours="$DIR/tmp|127.0.0.1:$RAY_PORT|--gcs_server_port=$RAY_PORT"
  for pid in $(pgrep -f "ray" || true); do
    if { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qE -- "$ours"; then
      echo "$pid"
    fi
  done
}

ray_start_worker() {
  ray_cli start --address="127.0.0.1:$RAY_PORT" --node-ip-address=127.0.0.1 --num-cpus=$((CPUS - CPUS / 2)) \
    --num-gpus=0 --object-store-memory=$OBJECT_STORE --resources='{"worker_node": 1}' --temp-dir="$DIR/tmp" \
    >"$DIR/log/worker.log" 2>&1 || die "ray worker node did not start (log: $DIR/log/worker.log)"
  # The worker node's processes: ours now that were not the head's (kill-worker kills exactly these).
  ray_pids | grep -vxFf "$DIR/head.pids" >"$DIR/worker.pids" || true
}

ray_start() {
  "$PY" -c 'import ray' 2>/dev/null || die "Ray is not installed in $VENV: pip install -e '.[ray]' (or make setup)"
  export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
  if ray_answers; then say "ray is running (head 127.0.0.1:$RAY_PORT)"; ray_env; return 0; fi
  mkdir -p "$DIR/tmp" "$DIR/log"
  if [ -s "$DIR/head.pids" ] && [ "$(ray_active_nodes)" = 1 ]; then
    say "ray head is running without its worker node (killed?): starting the worker node again"
    ray_start_worker
  else
    # The head takes one CPU and the worker node one: two nodes of this machine's 2 cores, jobs placed on both.
    ray_cli start --head --node-ip-address=127.0.0.1 --port="$RAY_PORT" --num-cpus=$((CPUS / 2)) --num-gpus=0 \
      --object-store-memory=$OBJECT_STORE --resources='{"head_node": 1}' --include-dashboard=false \
      --temp-dir="$DIR/tmp" --disable-usage-stats >"$DIR/log/head.log" 2>&1 \
      || die "ray head did not start (log: $DIR/log/head.log)"
    ray_pids >"$DIR/head.pids"
    ray_start_worker
  fi
  wait_for 90 "ray (ray status: two nodes)" ray_answers
  say "ray is up: head 127.0.0.1:$RAY_PORT and a worker node (resource worker_node)"
  ray_env
}

# ray_kill_worker: the worker node dies as a lost machine would (SIGKILL, its task processes with it); for tests.
ray_kill_worker() {
  local pids
  pids=$(cat "$DIR/worker.pids" 2>/dev/null || true)
  [ -n "$pids" ] || die "no worker node recorded (bash scripts/cluster.sh ray start)"
  for pid in $pids; do pkill -9 -P "$pid" 2>/dev/null || true; kill -9 "$pid" 2>/dev/null || true; done
  : >"$DIR/worker.pids"
  # Until the head has seen the node die (its health checks: ~15 s), `start` would take the cluster for whole.
  local deadline=$((SECONDS + 90)) n
  while [ "$SECONDS" -lt "$deadline" ]; do
    n=$(ray_active_nodes)
    [ -n "$n" ] && [ "$n" -lt 2 ] && break   # a head that did not answer this time proves nothing
    sleep 2
  done
  say "ray worker node killed"
}

ray_stop() {
  local pids
  # Processes started since start (workers) count too: the command-line match finds them; the file the rest.
  pids=$( { cat "$DIR/head.pids" "$DIR/worker.pids" 2>/dev/null || true; ray_pids; } | sort -u)
  for pid in $pids; do kill "$pid" 2>/dev/null || true; done
  sleep 2
  for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$DIR/head.pids" "$DIR/worker.pids"
  rm -rf "$DIR/tmp"
  say "ray stopped"
}

ray_status() {
  ray_answers || { say "ray is not running"; return 3; }
  RAY_ADDRESS=127.0.0.1:$RAY_PORT ray_cli status
  ray_env
}

# ---------------------------------------------------------------- MLflow server
# One writer in front of the SQLite file: a sweep whose runs are SLURM jobs (on several nodes: SQLite on a shared
# file system is not safe to write from several machines) logs to it with
#   at-train tracking=server tracking.tracking_uri=http://<this host>:$MLFLOW_PORT ...
mlflow_uri() { echo "http://$(hostname -s):$MLFLOW_PORT"; }

mlflow_answers() { curl -fsS -m 5 "http://127.0.0.1:$MLFLOW_PORT/health" >/dev/null 2>&1; }

mlflow_env() {
  echo "# at-train tracking=server tracking.tracking_uri=$(mlflow_uri)"
  echo "export MLFLOW_TRACKING_URI=$(mlflow_uri)"
}

mlflow_start() {
  [ -x "$VENV/bin/mlflow" ] || die "MLflow is not installed in $VENV (make setup)"
  if alive "$DIR/mlflow.pid" && mlflow_answers; then say "mlflow is running ($(mlflow_uri))"; mlflow_env; return 0; fi
  mkdir -p "$DIR/log" "$DIR/mlartifacts"
  # A new store starts from the cached empty database of this MLflow version (its migrations take ~10 s).
  "$PY" -c 'import sys; from pathlib import Path; from agent_trainer.tracking import prepare_sqlite
prepare_sqlite(Path(sys.argv[1]))' "$DIR/mlflow.db" || die "could not prepare $DIR/mlflow.db"
  # Reachable from the other nodes by this host's name (MLflow's host check allows localhost and private IPs).
  local host
  host=$(hostname -s)
  nohup "$VENV/bin/mlflow" server --backend-store-uri "sqlite:///$DIR/mlflow.db" \
    --artifacts-destination "$DIR/mlartifacts" --host 0.0.0.0 --port "$MLFLOW_PORT" --workers 1 \
    --allowed-hosts "localhost,localhost:*,127.0.0.1,127.0.0.1:*,$host,$host:*,10.*,192.168.*,172.*" \
    >"$DIR/log/mlflow.log" 2>&1 &
  echo $! >"$DIR/mlflow.pid"
  wait_for 120 "mlflow server (/health)" mlflow_answers
  say "mlflow is up: $(mlflow_uri) (store $DIR/mlflow.db)"
  mlflow_env
}

mlflow_stop() {
  # The server's workers are its children: TERM to the recorded process ends them too.
  local pid
  pid=$(cat "$DIR/mlflow.pid" 2>/dev/null || true)
  [ -n "$pid" ] && pkill -TERM -P "$pid" 2>/dev/null || true
  stop_pid "$DIR/mlflow.pid"
  say "mlflow stopped"
}

mlflow_status() {
  alive "$DIR/mlflow.pid" && mlflow_answers || { say "mlflow is not running"; return 3; }
  say "mlflow is running (pid $(cat "$DIR/mlflow.pid"), store $DIR/mlflow.db)"
  mlflow_env
}

case "$ENGINE" in
  slurm|ray|mlflow) ;;
  *) echo "usage: bash scripts/cluster.sh slurm|ray|mlflow start|stop|status|env" >&2; exit 2 ;;
esac
case "$ACTION" in
  start|stop|status|env) ;;
  kill-worker) [ "$ENGINE" = ray ] || { echo "kill-worker: ray only" >&2; exit 2; }; ACTION=kill_worker ;;
  stop-slurmd) [ "$ENGINE" = slurm ] || { echo "stop-slurmd: slurm only" >&2; exit 2; }; ACTION=stop_slurmd ;;
  *) echo "usage: bash scripts/cluster.sh slurm|ray|mlflow start|stop|status|env" >&2; exit 2 ;;
esac
DIR=$ROOT/$ENGINE
mkdir -p "$ROOT"
"${ENGINE}_${ACTION}"
