#!/usr/bin/env python3
"""The shape of the tree (DESIGN.md section 7), checked on every #include of our code.

Each folder may include only the folders its rule lists (our headers by their path from the
root, "hyscale/v1/..." for the generated protobuf code). The rules form a graph without cycles:

  kernels <- worker/model <- worker/parallel <- worker/trainer <- worker/calibrate
  proto <- planner <- server, client, worker/calibrate, worker/trainer
  proto <- worker/agent, bench/service
  util (subprocess, files, temp folders, logging): a leaf every folder may include

The coordinator, the agent, the CLI and the planner never include libtorch or CUDA; the model,
context parallelism, the trainer and the kernels never include gRPC. Tests and benchmarks may
include anything. Prints every violation with file and line; exit 1 if there is any.

    python3 tests/layout/check_includes.py [ROOT]
"""

import re
import sys
from pathlib import Path

UTIL = ["util"]
PROTO = ["proto", "hyscale/v1"] + UTIL
RULES = {
    "util": UTIL,
    "kernels": ["kernels"] + UTIL,
    "proto": PROTO,
    "planner": ["planner"] + PROTO,
    "worker/model": ["worker/model", "kernels"] + PROTO,
    "worker/parallel": ["worker/parallel", "worker/model", "kernels"] + PROTO,
    "worker/trainer": ["worker/trainer", "worker/model", "worker/parallel", "planner",
                       "kernels"] + PROTO,
    # The calibration measures the trainer's own optimizer step.
    "worker/calibrate": ["worker/calibrate", "worker/trainer", "planner", "kernels"] + PROTO,
    "worker/agent": ["worker/agent"] + PROTO,
    "server": ["server", "planner"] + PROTO,
    "client": ["client", "planner"] + PROTO,
    "bench/service": ["bench/service"] + PROTO,
}
NO_TORCH = ["util", "proto", "planner", "server", "client", "worker/agent", "bench/service"]
NO_GRPC = ["util", "kernels", "worker/model", "worker/parallel", "worker/trainer",
           "worker/calibrate"]

SOURCES = {".cc", ".h", ".cu", ".cuh"}
OUR_ROOTS = {"kernels", "proto", "planner", "worker", "server", "client", "bench", "tests",
             "hyscale", "util"}
OURS = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SYSTEM = re.compile(r"^\s*#\s*include\s+<([^>]+)>")
TORCH = ("torch/", "ATen/", "c10/", "cuda_runtime", "cuda.h", "cuda_bf16", "cublas", "nccl")
GRPC = ("grpc/", "grpcpp/", "grpc++/")


def folder_of(path):
    """The longest rule folder holding `path` (relative to the root), or None."""
    best = None
    for folder in RULES:
        if (path == folder or path.startswith(folder + "/")) and (
                best is None or len(folder) > len(best)):
            best = folder
    return best


def check(root):
    problems = []
    for file in sorted(root.rglob("*")):
        if file.suffix not in SOURCES or not file.is_file():
            continue
        rel = file.relative_to(root).as_posix()
        if rel.startswith(("build", ".")):
            continue
        folder = folder_of(rel)
        if folder is None:
            continue
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            where = f"{rel}:{number}"
            ours = OURS.match(line)
            if ours:
                target = ours.group(1)
                if target.split("/")[0] not in OUR_ROOTS:
                    continue  # a file beside it (generated assets), or a library's ("absl/...")
                if not any(target == a or target.startswith(a + "/") for a in RULES[folder]):
                    problems.append(f"{where}: {folder} may not include \"{target}\" "
                                    f"(allowed: {', '.join(RULES[folder])})")
                if folder in NO_GRPC and target.endswith(".grpc.pb.h"):
                    problems.append(f"{where}: {folder} never uses gRPC (\"{target}\")")
                continue
            system = SYSTEM.match(line)
            if not system:
                continue
            target = system.group(1)
            if folder in NO_TORCH and target.startswith(TORCH):
                problems.append(f"{where}: {folder} never includes libtorch or CUDA (<{target}>)")
            if folder in NO_GRPC and target.startswith(GRPC):
                problems.append(f"{where}: {folder} never uses gRPC (<{target}>)")
    return problems


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    problems = check(root)
    for p in problems:
        print(p)
    print(f"check_includes: {len(problems)} violation(s) of the tree's dependency rules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
