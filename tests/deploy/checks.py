"""What the deploy checks (check_*.py) share: collecting failures, reporting them, and the
flags a HyScale program accepts."""
import re
import subprocess

failures = []


def check(condition, what):
    """Records `what` as a failure unless `condition`; returns `condition`."""
    if not condition:
        failures.append(what)
    return condition


def finish(summary):
    """Prints the failures, or `summary` when there are none; the exit status."""
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print(summary)
    return 1 if failures else 0


def help_flags(binary):
    """The --flag names a CLI11 program's --help lists."""
    out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=30)
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout))
