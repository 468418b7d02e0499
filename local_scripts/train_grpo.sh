#!/usr/bin/env bash
# Launch GRPO training with torchrun, on one node or several.
#
#   bash local_scripts/train_grpo.sh RECIPE.yaml [--field value ...]
#
# Environment (defaults for a single node):
#   NNODES=1 NODE_RANK=0 NPROC_PER_NODE=<GPUs on this node> MASTER_ADDR=127.0.0.1 MASTER_PORT=29500
#   DEEPSPEED=local_scripts/zero3.json   (set DEEPSPEED= to train without DeepSpeed, e.g. plain DDP)
#   SHUTDOWN_TIMEOUT=120   seconds torchrun waits for its workers after forwarding SIGTERM/SIGUSR1 (preemption:
#                          they finish the step and write a checkpoint) before it kills them; cover one step + save
# Two nodes: run the same command on both, with NNODES=2, NODE_RANK=0 / 1 and MASTER_ADDR=<node 0's address>.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 RECIPE.yaml [--field value ...]" >&2
  exit 2
fi
RECIPE=$1
shift

NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
if [ -z "${NPROC_PER_NODE:-}" ]; then
  NPROC_PER_NODE=$(python -c "import torch; print(max(torch.cuda.device_count(), 1))")
fi
DEEPSPEED=${DEEPSPEED-local_scripts/zero3.json}
EXTRA=()
if [ -n "$DEEPSPEED" ]; then
  EXTRA+=(--deepspeed "$DEEPSPEED")
fi

SHUTDOWN_TIMEOUT=${SHUTDOWN_TIMEOUT:-120}

# torchrun forwards SIGTERM (and, listed here, SLURM's SIGUSR1) to every worker; each then checkpoints and exits 75.
exec torchrun \
  --signals_to_handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
  --shutdown_timeout "$SHUTDOWN_TIMEOUT" \
  --nnodes "$NNODES" \
  --node_rank "$NODE_RANK" \
  --nproc_per_node "$NPROC_PER_NODE" \
  --master_addr "$MASTER_ADDR" \
  --master_port "$MASTER_PORT" \
  -m vlm_grpo.train "$RECIPE" "${EXTRA[@]}" "$@"
