#!/usr/bin/env bash
# Multi-node pretraining with the DeepSpeed launcher (pdsh/ssh to every host in the hostfile).
#
#   workflows/train_multinode.sh HOSTFILE CONFIG [extra `pretrain train` options, e.g. --resume]
#   HOSTFILE=workflows/hostfile.example, CONFIG=configs/pretrain/xlmr-base.yaml
#
# Requirements: passwordless ssh from this node to every host; the repo and its .venv at the same
# path on every node; the token shards, tokenizer and run directory on a shared filesystem (every
# rank reads shards; checkpoints are written by all ranks into one directory, `latest` by rank 0).
#
# Environment the launcher forwards to every rank: variables named in ~/.deepspeed_env or
# ./.deepspeed_env (one NAME=value a line) plus the ones exported below. Usual settings:
#   NCCL_SOCKET_IFNAME=eth0      the interface the nodes reach each other on (ip -br addr)
#   NCCL_IB_DISABLE=1            no InfiniBand/RoCE (plain TCP); leave unset with IB
#   NCCL_IB_HCA=mlx5             which HCAs to use with IB
#   NCCL_DEBUG=INFO              print the transport NCCL chose (first thing to check when it hangs)
#   NCCL_ASYNC_ERROR_HANDLING=1  / TORCH_NCCL_ASYNC_ERROR_HANDLING=1: a dead rank aborts the job, not a hang
#   GLOO_SOCKET_IFNAME=eth0      the same for gloo (CPU runs and torch's control plane)
#   MASTER_ADDR / MASTER_PORT    rendezvous; the launcher uses the first host and 29500 (--master_addr/--master_port)
#   OMP_NUM_THREADS=8            CPU threads per rank for data loading
#   DS_ENV_FILE=/path/env        an env file of your own instead of .deepspeed_env (an absolute path works)
# Options of this script (environment):
#   SSH_PORT=2222                sshd's port on every host (the launcher's --ssh_port); other ssh options,
#                                e.g. a key: PDSH_SSH_ARGS_APPEND="-i ~/.ssh/cluster_key" (pdsh passes them on)
#   NO_SSH_CHECK=1               skip the launcher's `ssh <first host> hostname` check (it ignores
#                                PDSH_SSH_ARGS_APPEND, so a key named only there fails it); MASTER_ADDR
#                                then defaults to the hostfile's first host (the launcher would ask that
#                                host for its address over ssh the same way)
#   NODE_RANK=<n>                no ssh at all: run this script on every node yourself, with its rank
#                                (0 = the first host of the hostfile; MASTER_ADDR must then be set); the
#                                env file (DS_ENV_FILE, .deepspeed_env) is read here, as the launcher reads
#                                it for the nodes it reaches over ssh
# torchrun alternative (run on every node; NODE_RANK 0..NNODES-1, MASTER_ADDR = node 0):
#   torchrun --nnodes $NNODES --node_rank $NODE_RANK --nproc_per_node 8 \
#            --master_addr $MASTER_ADDR --master_port 29500 -m pretrain train --config CONFIG
# Resuming on another GPU count: see README (DeepSpeed universal checkpoints).
set -euo pipefail
HOSTFILE=${1:?usage: $0 HOSTFILE CONFIG [options]}
CONFIG=${2:?usage: $0 HOSTFILE CONFIG [options]}
shift 2
for file in "$HOSTFILE" "$CONFIG"; do
  [[ -f "$file" ]] || { echo "error: $file: no such file" >&2; exit 2; }
done
HOSTFILE=$(realpath "$HOSTFILE") CONFIG=$(realpath "$CONFIG")
cd "$(dirname "$0")/.."
export NCCL_ASYNC_ERROR_HANDLING=${NCCL_ASYNC_ERROR_HANDLING:-1}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the virtualenv's tools (ninja, which DeepSpeed's JIT-built ops such as FusedAdam need) on PATH: here,
# and on every node the launcher reaches over ssh, where it passes on only a few variables (PYTHON*,
# NCCL_*) but sources --venv_script
export PATH="$PWD/.venv/bin:$PATH"
LAUNCH=(--hostfile "$HOSTFILE" --master_port "${MASTER_PORT:-29500}")
[[ -f .venv/bin/activate ]] && LAUNCH+=(--venv_script "$PWD/.venv/bin/activate")
if [[ -z "${MASTER_ADDR:-}" && "${NO_SSH_CHECK:-0}" == 1 ]]; then
  MASTER_ADDR=$(awk '!/^[[:space:]]*(#|$)/ {print $1; exit}' "$HOSTFILE")
fi
[[ -n "${MASTER_ADDR:-}" ]] && LAUNCH+=(--master_addr "$MASTER_ADDR")
[[ -n "${SSH_PORT:-}" ]] && LAUNCH+=(--ssh_port "$SSH_PORT")
[[ "${NO_SSH_CHECK:-0}" == 1 ]] && LAUNCH+=(--no_ssh_check)
if [[ -n "${NODE_RANK:-}" ]]; then
  [[ -n "${MASTER_ADDR:-}" ]] || { echo "error: NODE_RANK needs MASTER_ADDR (the first host's address)" >&2; exit 2; }
  LAUNCH+=(--no_ssh --node_rank "$NODE_RANK")
  # the env file, where and as the launcher reads it (~ then the repository; KEY=VALUE lines, key and
  # value stripped of surrounding white space, a CR included)
  name=${DS_ENV_FILE:-.deepspeed_env}
  for dir in "$HOME" .; do
    file=$([[ $name == /* ]] && echo "$name" || echo "$dir/$name")
    [[ -f $file ]] || continue
    while IFS= read -r line || [[ -n $line ]]; do
      [[ $line == *=* ]] || continue
      key=${line%%=*} value=${line#*=}
      key=${key#"${key%%[![:space:]]*}"} key=${key%"${key##*[![:space:]]}"}
      value=${value#"${value%%[![:space:]]*}"} value=${value%"${value##*[![:space:]]}"}
      export "$key=$value"
    done < "$file"
  done
fi
exec "${DEEPSPEED:-.venv/bin/deepspeed}" "${LAUNCH[@]}" --no_local_rank --module pretrain train --config "$CONFIG" "$@"
