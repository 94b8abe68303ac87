#!/bin/bash
# Single-host Slurm 22.05 with 4 fake GPUs for the marble executor tests (root, no systemd).
# From the tested recipe ../shared/recipes/slurm_ci.sh. Usage: NNODES=1|3 bash .ci/slurm_start.sh
set -euo pipefail
S=${S:-/tmp/slurm-ci}; NNODES=${NNODES:-1}; NGPU=${NGPU:-4}; CPUS=${CPUS:-8}
el(){ echo "[${SECONDS}s] $*"; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
el "apt install done"
# --- munge (postinst normally creates /etc/munge/munge.key; create if missing)
[ -s /etc/munge/munge.key ] || { mungekey --create --force; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged      # daemonizes itself
munge -n | unmunge >/dev/null && el "munged ok"
# --- fake GPU char devices (major 195 = nvidia); any path works, /dev not required
rm -rf $S/state $S/spool; mkdir -p $S/dev $S/state $S/log $S/jobs
for i in $(seq 0 $((NGPU-1))); do [ -e $S/dev/nvidia$i ] || mknod $S/dev/nvidia$i c 195 $i; done
H=$(hostname -s)
if [ "$NNODES" = 1 ]; then
  NODES=$H; NODELINE="NodeName=$H NodeAddr=127.0.0.1"
else
  NODES="n[1-$NNODES]"; NODELINE="NodeName=$NODES NodeHostname=$H NodeAddr=127.0.0.1 Port=[17001-$((17000+NNODES))]"
fi
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
MailProg=/bin/true
SlurmdParameters=config_overrides
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool/slurmd-%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd-%n.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=sched_interval=1
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$S/log/jobcomp.txt
ReturnToService=2
MinJobAge=300
GresTypes=gpu
$NODELINE CPUs=$CPUS RealMemory=1000 Gres=gpu:$NGPU State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
cat > /etc/slurm/gres.conf <<CONF
AutoDetect=off
NodeName=$NODES Name=gpu File=$S/dev/nvidia[0-$((NGPU-1))]
CONF
TD=$(date +%s.%N)
slurmctld -D -i >$S/log/slurmctld.out 2>&1 & echo $! >$S/slurmctld.bgpid
if [ "$NNODES" = 1 ]; then
  mkdir -p $S/spool/slurmd-$H
  slurmd -D >$S/log/slurmd-$H.out 2>&1 & echo $! >$S/slurmd-$H.bgpid
else
  for k in $(seq 1 $NNODES); do mkdir -p $S/spool/slurmd-n$k
    slurmd -D -N n$k >$S/log/slurmd-n$k.out 2>&1 & echo $! >$S/slurmd-n$k.bgpid; done
fi
end=$((SECONDS+30))
until [ "$(timeout 3 sinfo -h -o %T 2>/dev/null | sort -u)" = idle ]; do
  [ $SECONDS -lt $end ] || { echo "slurm not ready"; sinfo -N -o '%N %T %E' || true; tail $S/log/*.out; exit 1; }
  kill -0 $(cat $S/slurmctld.bgpid) || { tail $S/log/slurmctld.out; exit 1; }
  sleep 0.2
done
el "daemons ready"; sinfo -N -o '%N %c %G %T'
