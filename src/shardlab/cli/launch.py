"""``shardlab launch``: a job file (``shardlab plan --emit-config``) as a Slurm batch script,
or as the torchrun command of each node.

Either way each node runs one torchrun agent that starts the node's ranks, and the agents
meet through c10d rendezvous on the first node (torch's elastic launch): the job's global
ranks are given out by the rendezvous, so every node runs the same command. ``python -m
shardlab.train --config FILE`` is the program, the job file read on every node; torchrun's
``--max-restarts`` is the file's ``max_restarts``, and a restarted job resumes from the
last complete checkpoint in the file's ``checkpoint_dir`` (docs/guide/checkpoint.md).

The node and process counts must give the layout's world size (dp x tp x pp): anything
else is refused (exit 2, one line) before anything is written.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from shardlab.cli.args import positive_int
from shardlab.cli.job import read_job
from shardlab.cli.job_file import comment_lines
from shardlab.config.files import check_output, write_atomic
from shardlab.errors import SpecError
from shardlab.train.config import TrainConfig

EMITS = ("slurm", "torchrun")
SUFFIX = {"slurm": ".sbatch", "torchrun": ".torchrun"}
"""The file written into ``--out DIR``: the job file's name with this suffix."""

NCCL_ENV = (
    ("NCCL_DEBUG", "WARN",
     "NCCL's own log: warnings only. INFO prints, per communicator, the transport and "
     "network interface it chose: the first thing to read when the job hangs at start."),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1",
     "A collective that fails or outlasts the job's timeout aborts its communicator and "
     "ends the rank, so torchrun sees the failure and restarts (or ends) the job instead "
     "of every rank hanging (torchrun sets 1 when unset; written here to be seen)."),
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000",
     "The flight recorder: each rank keeps its last 2000 collectives (kind, sizes, state)."),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1",
     "On a timeout each rank writes that record to /tmp/nccl_trace_rank_<rank> "
     "(TORCH_NCCL_DEBUG_INFO_TEMP_FILE names another place): the rank whose collectives "
     "stopped early is the one that stalled."),
)
"""The NCCL settings of a GPU job: (name, value, why), each written with its comment."""

NCCL_COMMENTED = (
    ("NCCL_SOCKET_IFNAME", "ib0",
     "The network interface NCCL's bootstrap (and its socket transport) uses. Unset, NCCL "
     "picks one, on some clusters a management or container interface the other nodes "
     "cannot reach: name the fabric's (ib0, eth0, ...) when the job hangs at its start."),
)


def register(sub: Any) -> None:
    """Add the ``launch`` sub-command."""
    p = sub.add_parser("launch", help="a job file as a Slurm script or per-node torchrun "
                       "commands", description="Write the sbatch script (srun starting one "
                       "torchrun per node, c10d rendezvous on the first node) or the plain "
                       "torchrun command of each node for a job file (shardlab plan "
                       "--emit-config). NODES x GPUS-PER-NODE must be the layout's ranks.")
    p.add_argument("config", metavar="FILE", help="the job file (TOML)")
    p.add_argument("--nodes", type=positive_int, required=True, help="nodes in the job")
    p.add_argument("--gpus-per-node", type=positive_int, required=True,
                   help="ranks (processes) per node: one per GPU, or CPU processes with "
                   "--device cpu")
    p.add_argument("--emit", choices=EMITS, required=True,
                   help="slurm: an sbatch script; torchrun: the command of each node")
    p.add_argument("--out", metavar="PATH", help="write here (a folder: FILE's name with "
                   ".sbatch or .torchrun) instead of printing")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="gpu (NCCL; the script asks Slurm for the GPUs) or cpu (gloo)")
    p.add_argument("--port", type=positive_int, default=29500,
                   help="the rendezvous port on the first node")
    p.add_argument("--host", help="torchrun: the first node's address (default: the "
                   "commands read $MASTER_ADDR; 127.0.0.1 on one node)")
    g = p.add_argument_group("slurm")
    g.add_argument("--job-name", help="default: shardlab-FILE's name")
    g.add_argument("--partition", help="#SBATCH --partition (default: the cluster's)")
    g.add_argument("--time", help="#SBATCH --time, e.g. 04:00:00 (default: the partition's)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Check the file and the counts, then print the script or write it whole."""
    if args.port > 65535:
        raise SpecError("port", args.port, "must be a TCP port (1-65535)")
    for field in ("host", "job_name", "partition", "time"):
        _check_word(field, getattr(args, field))
    out = _out_path(args)
    job, cfg = read_job(args.config)
    ranks = args.nodes * args.gpus_per_node
    if ranks != cfg.world:
        raise SpecError("nodes x gpus_per_node", ranks, f"must equal the {cfg.world} ranks of "
                        f"{args.config}'s layout (dp={cfg.dp} tp={cfg.tp} pp={cfg.pp})"
                        f"{_counts_hint(cfg.world, args.nodes, args.gpus_per_node)}")
    for line in notes(job, cfg, args.gpus_per_node):
        sys.stderr.write(f"shardlab launch: note: {line}\n")
    text = (slurm_script if args.emit == "slurm" else torchrun_commands)(args, job, cfg)
    if out is None:
        sys.stdout.write(text)
    else:
        write_atomic(out, text.encode())
        sys.stdout.write(f"wrote {out} ({args.nodes} nodes x {args.gpus_per_node} "
                         f"ranks)\n")
    return 0


_WORD = re.compile(r"[A-Za-z0-9._:@%+=,/-]+")


def _check_word(field: str, value: str | None) -> None:
    """A value written into the script as it is (a host, an #SBATCH value): one word of
    the characters names, addresses and times use, so it can end no line and start no
    command."""
    if value is not None and not _WORD.fullmatch(value):
        raise SpecError(field, value, "must be one word of letters, digits and . _ : @ % + "
                        "= , / - (a host name or address, a Slurm name or time)")


def _counts_hint(world: int, nodes: int, per_node: int) -> str:
    """A count that fits, keeping what the user gave: the GPUs per node, else the nodes."""
    if world % per_node == 0:
        return f"; e.g. --nodes {world // per_node} --gpus-per-node {per_node}"
    if world % nodes == 0:
        return f"; e.g. --nodes {nodes} --gpus-per-node {world // nodes}"
    return ""


def _out_path(args: argparse.Namespace) -> Path | None:
    if args.out is None:
        return None
    out = Path(args.out)
    if out.is_dir():
        out = out / (Path(args.config).stem + SUFFIX[args.emit])
    return check_output(out, "out")


def notes(job: argparse.Namespace, cfg: TrainConfig, per_node: int) -> list[str]:
    """What the script cannot fix but the user should know: tensor parallelism across
    nodes, restarts with no checkpoint to restart from."""
    out = []
    if per_node % cfg.tp:
        out.append(f"tp={cfg.tp} does not divide the {per_node} ranks of a node: some "
                   "tensor-parallel groups span nodes, their collectives on the network")
    if job.max_restarts and not job.checkpoint_dir:
        out.append(f"max_restarts={job.max_restarts} without a checkpoint_dir: a restarted "
                   "job begins again at step 0")
    return out


def train_program(config: str) -> str:
    """What every rank runs: train as a module, the job file by its absolute path."""
    return f"-m shardlab.train --config {shlex.quote(str(Path(config).resolve()))}"


def _torchrun(args: argparse.Namespace, job: argparse.Namespace, endpoint: str,
              rdzv_id: str, sep: str = " ") -> str:
    """The torchrun command line, its parts joined by ``sep`` (a space, or a backslash and
    a new line)."""
    return sep.join([f"torchrun --nnodes={args.nodes} --nproc-per-node={args.gpus_per_node}",
                     f"--rdzv-backend=c10d --rdzv-endpoint={endpoint} --rdzv-id={rdzv_id}",
                     f"--max-restarts={job.max_restarts}", train_program(args.config)])


def _title(args: argparse.Namespace, cfg: TrainConfig) -> str:
    nodes = f"{args.nodes} node{'s' if args.nodes > 1 else ''}"
    return (f"shardlab launch: {Path(args.config).name} on {nodes} x {args.gpus_per_node} "
            f"{args.device.upper()} rank{'s' if args.gpus_per_node > 1 else ''} (dp={cfg.dp} "
            f"tp={cfg.tp} pp={cfg.pp}: {cfg.world} ranks), {cfg.shape.describe()}")


def torchrun_commands(args: argparse.Namespace, job: argparse.Namespace,
                      cfg: TrainConfig) -> str:
    """The torchrun command of each node, one block per node: the same command on every
    node (c10d rendezvous numbers the nodes as they arrive); the first node hosts the
    rendezvous at ``--host`` (or ``$MASTER_ADDR``). Train flags added after a command
    override the job file's keys."""
    host = args.host or ("127.0.0.1" if args.nodes == 1 else None)
    endpoint = (f"{host}:{args.port}" if host is not None else
                f'"${{MASTER_ADDR:?set MASTER_ADDR to the address of the first node}}:{args.port}"')
    rdzv_id = "shardlab-" + "".join(c if c.isalnum() else "-" for c in Path(args.config).stem)
    command = _torchrun(args, job, endpoint, rdzv_id)
    if args.device == "gpu":  # the NCCL settings of --emit slurm, where each is explained
        command = " ".join(f"{k}={v}" for k, v, _ in NCCL_ENV) + " " + command
    where = (f"{host}:{args.port}" if host is not None else
             f"$MASTER_ADDR:{args.port} (set MASTER_ADDR to its address as the others reach it)")
    lines = [*comment_lines(_title(args, cfg)),
             *comment_lines("Run each node's command on that node (the lines are the same: "
                            "c10d rendezvous numbers the nodes as they arrive). The first "
                            f"node hosts the rendezvous store at {where}. Train flags added "
                            "at the end of a command override the job file's keys."
                            + (" The NCCL settings are those of --emit slurm, which says "
                               "what each does." if args.device == "gpu" else ""))]
    for node in range(args.nodes):
        first = " (first: hosts the rendezvous)" if node == 0 and args.nodes > 1 else ""
        lines += ["", f"# node {node} of {args.nodes}{first}", command]
    return "\n".join(lines) + "\n"


def slurm_script(args: argparse.Namespace, job: argparse.Namespace, cfg: TrainConfig) -> str:
    """The sbatch script: the allocation, the NCCL environment (each setting with why), the
    first node's address from ``scontrol``, and srun starting one torchrun per node."""
    stem = Path(args.config).stem
    name = args.job_name or f"shardlab-{stem}"
    head = ["#!/bin/bash", *comment_lines(_title(args, cfg)),
            *comment_lines(f"Submit: sbatch {shlex.quote(stem + SUFFIX['slurm'])} (the job "
                           "starts in the environment it is submitted from: activate "
                           "shardlab's first)"),
            f"#SBATCH --job-name={name}",
            f"#SBATCH --nodes={args.nodes}",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --exclusive",
            "#SBATCH --output=%x-%j.out"]
    if args.device == "gpu":
        head.insert(-1, f"#SBATCH --gpus-per-node={args.gpus_per_node}")
    head += [f"#SBATCH --{k}={v}" for k, v in (("partition", args.partition),
                                              ("time", args.time)) if v]
    body = ["", *comment_lines("--ntasks-per-node=1: one task per node, the node's torchrun "
                               f"agent, which starts its {args.gpus_per_node} ranks. "
                               "--exclusive: the whole node, so Slurm does not bind that "
                               "one task (and every rank it starts) to one core."),
            "", "set -euo pipefail", "",
            *comment_lines("Each rank sets its own torch thread count; torchrun sets "
                           "OMP_NUM_THREADS=1 when it is unset, and prints a warning that "
                           "says so."),
            "export OMP_NUM_THREADS=1", ""]
    if args.device == "gpu":
        for k, v, why in NCCL_ENV:
            body += [*comment_lines(why), f"export {k}={v}"]
        for k, v, why in NCCL_COMMENTED:
            body += [*comment_lines(why), f"# export {k}={v}"]
        body.append("")
    body += ["# The rendezvous store lives on the first node of the allocation: its name from",
             "# scontrol, its address as Slurm reaches it (NodeAddr; the name itself when the",
             "# cluster sets none).",
             'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             'head_addr=$(scontrol show node "$head_node" | tr " " "\\n" '
             "| sed -n 's/^NodeAddr=//p')",
             'head_addr=${head_addr:-$head_node}',
             f'echo "shardlab launch: {args.nodes} node(s) x {args.gpus_per_node} ranks, '
             f'rendezvous at $head_addr:{args.port}"', "",
             *comment_lines(f"--max-restarts={job.max_restarts}: torchrun restarts every "
                            "rank that many times after a failure; train resumes from the "
                            "last complete checkpoint of the job file's checkpoint_dir (step "
                            "0 without one). --kill-on-bad-exit=1: a node whose agent gives "
                            "up ends the whole job."),
             "srun --kill-on-bad-exit=1 " + _torchrun(args, job, f'"$head_addr:{args.port}"',
                                                       '"$SLURM_JOB_ID"', " \\\n    ")]
    return "\n".join(head + body) + "\n"
