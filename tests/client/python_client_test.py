"""The Python client (client/python/hyscale) against real processes: hyscaled with a token and a
hyscale-worker agent whose trainer is a script. Submit, get, the job list, watch to the end, the
rank's log, plan, the workers' list, a request_id retry, cancel of a queued job, and the errors:
a bad spec names its field, a wrong token is UNAUTHENTICATED, an unknown job NOT_FOUND; a watch
that outlives kill -9 and a restart of hyscaled; then TLS against a second hyscaled (with the CA:
answered; plaintext: UNAVAILABLE).

    python3 tests/client/python_client_test.py BUILD_DIR
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time

build = pathlib.Path(sys.argv[1]).resolve()
sys.path.insert(0, str(build / "python"))
import hyscale  # noqa: E402
from hyscale.v1 import service_pb2  # noqa: E402

checks = 0


def check(condition, what):
    global checks
    if not condition:
        raise AssertionError(what)
    checks += 1


def wait_for(seconds, what, probe):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {seconds} s waiting for {what}")


def trainer_user(trainer):
    """nobody under root where nobody can start the trainer (as tests/e2e/lib.sh decides)."""
    if os.getuid() != 0:
        return subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    probe = subprocess.run(["runuser", "-u", "nobody", "--", str(trainer)],
                           capture_output=True)
    return "nobody" if probe.returncode == 0 else "root"


def start_hyscaled(work, listen, log_name):
    """The coordinator with the test's token and data, logging to work/log_name."""
    return subprocess.Popen(
        [str(build / "server/hyscaled"), "--listen", listen, "--data-dir", str(work / "data"),
         "--metrics-listen", "127.0.0.1:0", "--token-file", str(work / "token"),
         "--heartbeat-interval-ms", "250"], stdout=open(work / log_name, "w"),
        stderr=subprocess.STDOUT)


def try_cancel(client, job_id):
    try:
        client.cancel(job_id, "the watch resumed")
        return True
    except hyscale.HyScaleError as error:
        if error.code != "UNAVAILABLE":
            raise
        return False


def tls_checks(work, processes):
    """A second hyscaled serving TLS: the client with its CA gets answers, without it none."""
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout",
         str(work / "key.pem"), "-out", str(work / "cert.pem")], capture_output=True)
    check(made.returncode == 0, f"openssl: {made.stderr[-300:]!r}")
    log = open(work / "hyscaled-tls.log", "w")
    processes.append(subprocess.Popen(
        [str(build / "server/hyscaled"), "--listen", "127.0.0.1:0", "--data-dir",
         str(work / "data-tls"), "--metrics-listen", "127.0.0.1:0", "--tls-cert", str(work / "cert.pem"), "--tls-key",
         str(work / "key.pem")], stdout=log, stderr=subprocess.STDOUT))
    port = wait_for(30, "the TLS hyscaled to listen", lambda: (re.findall(
        r"listening on 127\.0\.0\.1:(\d+)", (work / "hyscaled-tls.log").read_text()) or [None])[0])
    with hyscale.Client(f"localhost:{port}", tls_ca=work / "cert.pem") as client:
        try:
            client.get("job-none")
            check(False, "an unknown job was found over TLS")
        except hyscale.HyScaleError as error:
            check(error.code == "NOT_FOUND", f"over TLS: {error}")
    with hyscale.Client(f"127.0.0.1:{port}", timeout=3) as plaintext:
        try:
            plaintext.get("job-none")
            check(False, "a plaintext call was answered by the TLS server")
        except hyscale.HyScaleError as error:
            check(error.code == "UNAVAILABLE", f"plaintext to TLS: {error}")


SPEC = """
name: {name}
seed: 7
model: {{vocab_size: 64, d_model: 32, layers: 1, heads: 2, head_dim_qk: 16, rope_dim: 8,
        head_dim_v: 16, d_ff: 64, indexer: {{heads: 2, dim: 16, rope_dim: 8, topk: 8}}}}
data: {{seq_len: 64, batch_size: 2, recall: {{pairs: 4, queries: 4, key_vocab: 16, value_vocab: 16}}}}
stages: [{{name: sparse, steps: 5, lr: 0.003, warmup_steps: 1, attention: SPARSE}}]
threads: 1
"""


def main():
    work = pathlib.Path(tempfile.mkdtemp(prefix="hyscale-python-client."))
    work.chmod(0o755)  # a root worker's trainers run as nobody
    processes = []
    try:
        (work / "token").write_text("python-client-token\n")
        trainer = work / "trainer.sh"
        trainer.write_text(
            "#!/bin/sh\n"
            "echo '{\"time\":1,\"job_started\":{\"name\":\"py\",\"total_steps\":1}}'\n"
            "echo 'hello from the trainer' >&2\n"
            "echo '{\"time\":2,\"job_finished\":{\"ok\":true,\"elapsed_seconds\":1}}'\n")
        trainer.chmod(0o755)
        processes.append(start_hyscaled(work, "127.0.0.1:0", "hyscaled.log"))
        port = wait_for(30, "hyscaled to listen", lambda: (re.findall(
            r"listening on 127\.0\.0\.1:(\d+)", (work / "hyscaled.log").read_text()) or [None])[0])
        server = f"127.0.0.1:{port}"
        agent_log = open(work / "w1.log", "w")
        processes.append(subprocess.Popen(
            [str(build / "worker/agent/hyscale-worker"), "--server", server, "--token-file",
             str(work / "token"), "--name", "w1", "--devices", "cpu:1", "--work-dir",
             str(work / "w1"), "--checkpoint-root", str(work / "data/checkpoints"), "--trainer",
             str(trainer), "--run-as", trainer_user(trainer), "--heartbeat-interval-ms", "250"],
            stdout=agent_log, stderr=subprocess.STDOUT))

        with hyscale.Client(server, token_file=work / "token") as client:
            workers = wait_for(30, "w1 online", lambda: [
                w for w in client.workers()
                if w.id == "w1" and w.state == service_pb2.WORKER_STATE_ONLINE])
            check(len(workers) == 1, "the workers' list has w1 online")

            spec = hyscale.load_spec(SPEC.format(name="python-job"))
            plan = client.plan(spec, device="cpu")
            check(plan.feasible, f"plan: {plan.reason}")

            job = client.submit(spec, device="cpu", request_id="python-1")
            check(job.id and job.name == "python-job", f"submitted: {job}")
            check(client.submit(spec, device="cpu", request_id="python-1").id == job.id,
                  "a request_id retry returns the first job")
            events = list(client.watch(job.id))
            lines = [hyscale.describe(e) for e in events]
            check(lines[-1].startswith("state JOB_STATE_SUCCEEDED"), f"watch: {lines}")
            done = client.get(job.id)
            check(done.state == service_pb2.JOB_STATE_SUCCEEDED, f"get: {done.state}")
            check(done.state in hyscale.TERMINAL_STATES, "terminal")
            log_bytes = b"".join(client.logs(job.id))
            check(b"hello from the trainer" in log_bytes, f"logs: {log_bytes[:200]!r}")
            check(job.id in [j.id for j in client.jobs()], "the job list has the job")
            check(job.id in [j.id for j in client.jobs(
                states=[service_pb2.JOB_STATE_SUCCEEDED])], "listed by state")

            # No GPU worker: a GPU job waits, and is cancelled.
            queued = client.submit(SPEC.format(name="waits"), device="gpu")
            check(queued.state == service_pb2.JOB_STATE_PENDING, f"queued: {queued.state}")
            cancelled = client.cancel(queued.id, "not needed")
            check(client.wait(cancelled.id).state == service_pb2.JOB_STATE_CANCELLED, "cancel")

            # A watch outlives a coordinator restart: hyscaled is killed and started again on its
            # port; the watch reopens its stream and sees the waiting job's cancellation.
            survivor = client.submit(SPEC.format(name="survives"), device="gpu")
            events = client.watch(survivor.id)
            first = next(events)
            check(first.state_change.to == service_pb2.JOB_STATE_PENDING, f"first: {first}")
            processes[0].kill()
            processes[0].wait()
            processes[0] = start_hyscaled(work, f"127.0.0.1:{port}", "hyscaled-2.log")
            wait_for(30, "the restarted hyscaled", lambda: "listening on" in (
                work / "hyscaled-2.log").read_text())
            wait_for(30, "the cancel after the restart", lambda: try_cancel(client, survivor.id))
            rest = [hyscale.describe(e) for e in events]
            check(rest and rest[-1].startswith("state JOB_STATE_CANCELLED"), f"resumed: {rest}")

            bad = spec.__class__()
            bad.CopyFrom(spec)
            bad.data.seq_len = 0
            try:
                client.submit(bad, device="cpu")
                check(False, "a spec with seq_len 0 was accepted")
            except hyscale.HyScaleError as error:
                check(error.code == "INVALID_ARGUMENT" and "seq_len" in error.message,
                      f"bad spec: {error}")
            try:
                client.get("job-does-not-exist")
                check(False, "an unknown job was found")
            except hyscale.HyScaleError as error:
                check(error.code == "NOT_FOUND", f"unknown job: {error}")
            try:
                hyscale.load_spec("model: {d_modl: 3}")
                check(False, "an unknown field was accepted")
            except ValueError as error:
                check("d_modl" in str(error), f"unknown field: {error}")

        with hyscale.Client(server, token="wrong") as intruder:
            try:
                intruder.get(job.id)
                check(False, "a wrong token was accepted")
            except hyscale.HyScaleError as error:
                check(error.code == "UNAUTHENTICATED", f"wrong token: {error}")
        tls_checks(work, processes)
        print(f"{checks} passed, 0 failed")
    except BaseException:
        for name in ("hyscaled.log", "hyscaled-2.log", "w1.log"):
            path = work / name
            if path.exists():
                print(f"--- {path} (last 25 lines)", file=sys.stderr)
                print("\n".join(path.read_text().splitlines()[-25:]), file=sys.stderr)
        raise
    finally:
        for process in processes:
            process.kill()
            process.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
