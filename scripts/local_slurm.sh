#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for testing the workflow's SLURM profile for real.
#
#   scripts/local_slurm.sh install          # Debian/Ubuntu packages: slurmctld, slurmd, slurm-client, munge (root)
#   scripts/local_slurm.sh start DIR        # write DIR/slurm.conf, start munged, slurmctld and slurmd
#   scripts/local_slurm.sh stop DIR         # stop the three daemons by the process ids recorded in DIR
#
# After `start`, sbatch/squeue/scancel talk to the cluster (its slurm.conf is DIR/slurm.conf, linked from
# /etc/slurm/slurm.conf, where jobs look for it): one node (this host, all its CPUs, 3/4 of its memory and
# $LOCAL_SLURM_GPUS (default 2) device-less GRES "gpu" slots, so GPU rules can be scheduled), one partition `local`. It needs no cgroups, no accounting database
# and no systemd: processes are tracked by Linux process groups (proctrack/linuxproc, task/none), accounting is
# off, so `sacct` has nothing to say and Snakemake's SLURM plugin must query job states with
# `--slurm-status-command squeue` (completed jobs stay visible to squeue for MinJobAge = 600 s). The daemons run
# as root (this is a test cluster) and listen on ports 6817/6818 of this host only.
set -euo pipefail

cmd=${1:?usage: $0 install|start DIR|stop DIR}

if [ "$cmd" = install ]; then
  command -v slurmctld >/dev/null && command -v munged >/dev/null && exit 0
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
  exit 0
fi

dir=$(mkdir -p "${2:?usage: $0 $cmd DIR}" && cd "$2" && pwd)

if [ "$cmd" = stop ]; then
  for name in slurmd slurmctld munged; do
    pidfile="$dir/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
  [ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" = "$dir/slurm.conf" ] && rm -f /etc/slurm/slurm.conf
  [ "$(readlink /etc/slurm/gres.conf 2>/dev/null)" = "$dir/gres.conf" ] && rm -f /etc/slurm/gres.conf
  exit 0
fi

[ "$cmd" = start ] || { echo "unknown command $cmd" >&2; exit 2; }
host=$(hostname -s)
cpus=$(nproc)
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 3 / 4 ))
gpus=${LOCAL_SLURM_GPUS:-2}  # GRES "gpu" slots without devices: lets GPU rules (sbatch --gpus=N) be scheduled here
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"

# munge: the key the Debian package generated, a private socket so that a system munged is left alone
key=/etc/munge/munge.key
[ -f "$key" ] || { mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of="$key" 2>/dev/null; chmod 400 "$key"; }
cat > "$dir/slurm.conf" <<CONF
ClusterName=dscout-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MinJobAge=600
ReturnToService=2
MpiDefault=none
SlurmctldTimeout=30
SlurmdTimeout=30
GresTypes=gpu
NodeName=$host CPUs=$cpus RealMemory=$mem_mb Gres=gpu:$gpus State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

# Jobs read the default path: Snakemake's SLURM jobstep plugin clears every SLURM_* variable (SLURM_CONF too)
# before its nested `srun`, so a config that only SLURM_CONF names is invisible inside a job.
mkdir -p /etc/slurm
if [ -e /etc/slurm/slurm.conf ] && ! grep -q '^ClusterName=dscout-local$' /etc/slurm/slurm.conf; then
  echo "/etc/slurm/slurm.conf exists and is not this test cluster's: refusing to replace it" >&2
  exit 1
fi
ln -sfn "$dir/slurm.conf" /etc/slurm/slurm.conf
gpu_files=""
if [ "$gpus" -gt 0 ]; then  # stand-in device files (no driver): SLURM only needs something to hand out
  mkdir -p "$dir/dev"
  for i in $(seq 0 $((gpus - 1))); do : > "$dir/dev/fakegpu$i"; done
  gpu_files="File=$dir/dev/fakegpu[0-$((gpus - 1))]"
fi
cat > "$dir/gres.conf" <<CONF
NodeName=$host Name=gpu Count=$gpus $gpu_files
CONF
ln -sfn "$dir/gres.conf" /etc/slurm/gres.conf
export SLURM_CONF="$dir/slurm.conf"
munged --socket="$dir/munge/munge.socket" --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
  --seed-file="$dir/munge/munge.seed" --key-file="$key" --force
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N "$host"
for _ in $(seq 60); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    echo "SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.5
done
echo "the local SLURM did not come up; see $dir/*.log" >&2
exit 1
