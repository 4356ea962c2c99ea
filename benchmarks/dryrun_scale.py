"""``shardlab dryrun`` at the sizes people plan for, on this CPU: wall time, host memory,
and the dry run beside the cost model (issue 15's figures).

    .venv/bin/python benchmarks/dryrun_scale.py            # every case
    .venv/bin/python benchmarks/dryrun_scale.py --only 8b  # the Llama-3-8B cases

Each case is one ``shardlab dryrun ... --json`` process (its roles in their own
processes); the host memory is the largest resident set of any process it started
(``RUSAGE_CHILDREN``'s ``ru_maxrss``, the largest so far). Ratios are dry run / cost
model per category of the busiest role; states should be 1.000, bytes per dim equal.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

from shardlab.config.host import cpu_model

CASES = {
    "8b-fsdp": ["llama-3-8b", "--gpus", "64", "--layout", "dp=64", "--seq", "8192",
                "--global-batch", "64"],
    "8b-tp8-sp-selective": ["llama-3-8b", "--gpus", "64", "--layout",
                            "dp=8 tp=8 sp=1 recompute=selective", "--seq", "8192",
                            "--global-batch", "8"],
    "70b-1f1b-all-roles": ["llama-3-70b", "--gpus", "512", "--layout",
                           "dp=8 tp=8 pp=8 sp=1 recompute=selective micro_batch=1",
                           "--seq", "8192", "--global-batch", "64", "--all-roles"],
    "70b-interleaved-all-roles": ["llama-3-70b", "--gpus", "512", "--layout",
                                  "dp=8 tp=8 pp=8 virtual=2 sp=1 recompute=selective "
                                  "micro_batch=1", "--seq", "8192", "--global-batch", "64",
                                  "--all-roles"],
}


def run(argv: list[str]) -> tuple[dict, float, float]:
    start = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "shardlab", "dryrun", *argv, "--gpu", "h100",
                        "--json"], capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"dryrun {' '.join(argv)} failed: {r.stderr.strip()[-2000:]}")
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    return json.loads(r.stdout), wall, rss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="", help="run the cases whose name contains this")
    args = p.parse_args()
    print(f"processor: {cpu_model() or 'unknown CPU'}")
    for name, argv in CASES.items():
        if args.only not in name:
            continue
        doc, wall, rss = run(argv)
        ratio = doc["ratio"]
        dims = {d: f"{v['measured'] / v['predicted']:.4f}" if v["predicted"] else "-"
                for d, v in doc["by_dim"].items()}
        print(f"{name}: wall {wall:.1f} s (dry run {doc['seconds']:.1f} s, "
              f"{len(doc['roles_run'])} role(s)), largest role process "
              f"{doc['host_peak_rss_bytes'] / 1e9:.2f} GB, the command {rss / 1e9:.2f} GB")
        print(f"  busiest rank {doc['busiest_rank']}: peak {doc['peak_bytes'] / 1e9:.2f} GB "
              f"vs predicted {doc['predicted']['peak_bytes'] / 1e9:.2f} GB; ratios "
              + ", ".join(f"{k} {v:.3f}" for k, v in ratio.items() if v is not None)
              + f"; bytes per dim dry/predicted {dims}; fits h100: {doc['fit']['fits']}")


if __name__ == "__main__":
    main()
