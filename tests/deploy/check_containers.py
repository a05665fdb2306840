#!/usr/bin/python3
"""Keeps deploy/docker/*.Dockerfile correct without a container engine: each one installs
dependencies through scripts/install-deps.sh on the Debian release that script is for, builds
with scripts/build.sh using only CMake options the build defines, copies binaries that CMake
targets produce, installs in its runtime stage the packages deploy/docker/runtime-packages.sh
derives from exactly those binaries, runs as a non-root user, has a HEALTHCHECK, and passes its
programs only flags they accept (their --help). runtime-packages.sh itself is run on this build.

Usage: check_containers.py BUILD_DIR
"""
import re
import shlex
import subprocess
import sys
from pathlib import Path

from checks import check, finish, help_flags

ROOT = Path(__file__).resolve().parents[2]


def instructions(path):
    """[(KEYWORD, text)] with continuation lines joined and comments dropped."""
    out, current = [], ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        current += line.rstrip("\\").strip() + " " if line.endswith("\\") else line.strip()
        if not line.endswith("\\"):
            if current:
                keyword, _, rest = current.partition(" ")
                out.append((keyword.upper(), rest.strip()))
            current = ""
    return out


def cmake_options():
    text = "\n".join(p.read_text() for p in ROOT.rglob("CMakeLists.txt")
                     if "build" not in p.relative_to(ROOT).parts[0])
    text += (ROOT / "cmake" / "HyscaleCuda.cmake").read_text()
    return set(re.findall(r"option\((\w+)", text)) | set(
        re.findall(r"set\((\w+) [^)]*CACHE", text))


def target_exists(build_path):
    """/build/<dir>/<file> is what a CMake target in <dir> produces."""
    rel = Path(build_path).relative_to("/build")
    lists = ROOT / rel.parent / "CMakeLists.txt"
    if not lists.exists():
        return False
    text = lists.read_text()
    name = rel.name
    if name.startswith("lib") and name.endswith(".so"):
        return re.search(rf"add_library\({re.escape(name[3:-3])} SHARED", text) is not None
    return re.search(rf"add_executable\({re.escape(name)}[ )]", text) is not None


def check_dockerfile(path, options, programs):
    name = path.name
    steps = instructions(path)
    froms = [rest for keyword, rest in steps if keyword == "FROM"]
    check(len(froms) >= 2, f"{name}: not multi-stage")
    check(froms and froms[0].split()[0] == "debian:12", f"{name}: build stage not on debian:12")
    check(froms and froms[-1].split()[0] == "debian:12-slim", f"{name}: runtime not debian:12-slim")
    # Instructions of the build stages and of the last (runtime) stage.
    last_from = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    build, runtime = steps[:last_from], steps[last_from:]
    build_runs = " ".join(rest for k, rest in build if k == "RUN")
    check(("COPY", "scripts/install-deps.sh /src/scripts/install-deps.sh") in build and
          "/src/scripts/install-deps.sh" in build_runs,
          f"{name}: the build stage does not install through scripts/install-deps.sh")
    check("/src/scripts/build.sh" in build_runs, f"{name}: not built with scripts/build.sh")
    for option in re.findall(r"-D(\w+)=", build_runs):
        check(option in options or option.startswith("CMAKE_"),
              f"{name}: -D{option} is no option of the CMake build")
    copied = re.findall(r"cp ((?:/build/\S+ )+)", build_runs)
    binaries = [p for group in copied for p in group.split()]
    check(binaries, f"{name}: copies nothing from /build")
    for binary in binaries:
        check(target_exists(binary), f"{name}: no CMake target makes {binary}")
    packages_call = re.search(r"runtime-packages\.sh ((?:/\S+ ?)+)>", build_runs)
    scanned = {Path(p).name for p in packages_call.group(1).split()} if packages_call else set()
    executables = {Path(b).name for b in binaries if not b.endswith(".so")}
    check(scanned == executables,
          f"{name}: runtime-packages.sh scans {sorted(scanned)}, the image runs {sorted(executables)}")

    runtime_runs = " ".join(rest for k, rest in runtime if k == "RUN")
    check("$(cat /tmp/packages)" in runtime_runs, f"{name}: runtime does not install the packages")
    users = [rest for k, rest in runtime if k == "USER"]
    check(users and users[-1].split(":")[0] not in ("0", "root"), f"{name}: runs as root")
    check(any(k == "HEALTHCHECK" and " CMD " in f" {rest} " for k, rest in runtime),
          f"{name}: no HEALTHCHECK")

    entry = [shlex.split(rest.strip("[]").replace(",", " ")) for k, rest in runtime
             if k == "ENTRYPOINT"]
    cmd = [shlex.split(rest.strip("[]").replace(",", " ")) for k, rest in runtime if k == "CMD"]
    if check(entry, f"{name}: no ENTRYPOINT"):
        program = Path(entry[-1][0]).name
        if check(program in programs, f"{name}: ENTRYPOINT {program} is not built here"):
            args = entry[-1][1:] + (cmd[-1] if cmd else [])
            for arg in args:
                flag = arg.split("=")[0]
                check(flag in programs[program], f"{name}: {program} has no flag {flag}")
            ports = {a.split(":")[-1] for a in args if re.match(r"--(listen|metrics-listen)=", a)}
            exposed = {p for k, rest in runtime if k == "EXPOSE" for p in rest.split()}
            check(ports <= exposed, f"{name}: listens on {ports}, exposes {exposed}")
            health = " ".join(rest for k, rest in runtime if k == "HEALTHCHECK")
            for port in re.findall(r"127\.0\.0\.1:(\d+)", health):
                check(port in ports, f"{name}: HEALTHCHECK probes {port}, not a port it listens on")


def main():
    build = Path(sys.argv[1])
    install_deps = (ROOT / "scripts" / "install-deps.sh").read_text()
    check("Debian 12" in install_deps, "install-deps.sh no longer says it is for Debian 12")
    programs = {
        "hyscaled": help_flags(build / "server" / "hyscaled"),
        "hyscale-worker": help_flags(build / "worker" / "agent" / "hyscale-worker"),
    }
    options = cmake_options()
    check({"HYSCALE_WITH_TORCH", "HYSCALE_CUDA"} <= options, "no HYSCALE_* options found")
    dockerfiles = sorted((ROOT / "deploy" / "docker").glob("*.Dockerfile"))
    check({p.name for p in dockerfiles} >= {"coordinator.Dockerfile", "worker.Dockerfile"},
          "the coordinator or worker Dockerfile is missing")
    for path in dockerfiles:
        check_dockerfile(path, options, programs)

    # The runtime package list of this build's coordinator image: complete and installable.
    result = subprocess.run([str(ROOT / "deploy" / "docker" / "runtime-packages.sh"),
                             str(build / "server" / "hyscaled"), str(build / "client" / "hyscale")],
                            capture_output=True, text=True, timeout=60)
    packages = result.stdout.split()
    check(result.returncode == 0 and "libgrpc++1.51" in packages and "libsqlite3-0" in packages,
          f"runtime-packages.sh: {result.returncode} {packages} {result.stderr}")

    return finish(f"containers: {', '.join(p.name for p in dockerfiles)} match install-deps.sh, "
                  f"the CMake build and the programs' flags; coordinator runtime: "
                  f"{' '.join(packages)}")


if __name__ == "__main__":
    sys.exit(main())
