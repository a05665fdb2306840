#!/usr/bin/python3
"""Renders every overlay of deploy/k8s with `kubectl kustomize` and checks the objects against
each other and against the flags hyscaled and hyscale-worker really accept (their --help).

Usage: check_k8s.py BUILD_DIR. Exits 77 (ctest: skipped) only when kubectl is not installed: it
is not a Debian package, so a fresh CI machine may lack it.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from checks import check, finish, help_flags

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"


def args_map(container):
    """{'--flag': 'value'} of `--flag=value` arguments."""
    out = {}
    for arg in container.get("args", []):
        name, _, value = arg.partition("=")
        out[name] = value
    return out


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def check_overlay(overlay, hyscaled_flags, worker_flags):
    rendered = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True,
                              text=True, timeout=60)
    if not check(rendered.returncode == 0, f"{overlay.name}: kubectl kustomize: {rendered.stderr}"):
        return
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    by_kind = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    where = overlay.name

    kinds = ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "StatefulSet",
             "DaemonSet", "PersistentVolumeClaim", "NetworkPolicy", "PodMonitor"]
    if not all([check(kind in by_kind, f"{where}: no {kind}") for kind in kinds]):
        return
    namespaces = {d["metadata"].get("namespace") for d in docs}
    check(len(namespaces) == 1 and None not in namespaces, f"{where}: namespaces {namespaces}")

    sts = by_kind["StatefulSet"]["hyscaled"]
    ds = by_kind["DaemonSet"]["hyscale-worker"]
    service = by_kind["Service"]["hyscaled"]
    config = by_kind["ConfigMap"]["hyscale-config"]["data"]

    for workload in (sts, ds):
        name = workload["metadata"]["name"]
        spec = workload["spec"]
        pod = spec["template"]["spec"]
        labels = spec["template"]["metadata"]["labels"]
        check(matches(spec["selector"]["matchLabels"], labels), f"{where}: {name} selector")
        check(pod.get("securityContext", {}).get("runAsNonRoot") is True, f"{where}: {name} root")
        check(pod.get("serviceAccountName") in by_kind["ServiceAccount"], f"{where}: {name} SA")
        for c in pod["containers"]:
            res = c.get("resources", {})
            for part in ("requests", "limits"):
                check({"cpu", "memory"} <= set(res.get(part, {})),
                      f"{where}: {name} {part} lack cpu or memory")
            # Every $(VAR) in args comes from the ConfigMap or the container's env.
            env = {e["name"] for e in c.get("env", [])}
            for var in re.findall(r"\$\((\w+)\)", " ".join(c.get("args", []))):
                check(var in config or var in env, f"{where}: {name} uses $({var}), not defined")
            # The token Secret is mounted where --token-file points.
            mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
            secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
            token_file = args_map(c).get("--token-file", "")
            check(any(secrets.get(v) == "hyscale-token" and token_file.startswith(p + "/")
                      for v, p in mounts.items()), f"{where}: {name} token file not mounted")

    # The coordinator: flags it knows, ports, probes, PVC at the data dir, Service and monitor.
    c = sts["spec"]["template"]["spec"]["containers"][0]
    args = args_map(c)
    for flag in args:
        check(flag in hyscaled_flags, f"{where}: hyscaled has no flag {flag}")
    grpc_port, metrics_port = port_of(args["--listen"]), port_of(args["--metrics-listen"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports == {"grpc": grpc_port, "metrics": metrics_port}, f"{where}: hyscaled ports {ports}")
    for probe in ("readinessProbe", "livenessProbe"):
        check(c.get(probe, {}).get("grpc", {}).get("port") == grpc_port, f"{where}: {probe}")
    check(sts["spec"]["replicas"] == 1, f"{where}: hyscaled replicas")
    claims = {t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]}
    check(any(m["name"] in claims and m["mountPath"] == args["--data-dir"]
              for m in c["volumeMounts"]), f"{where}: --data-dir is not on the PVC")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    check(matches(service["spec"]["selector"], pod_labels), f"{where}: Service selects no pod")
    for p in service["spec"]["ports"]:
        check(ports.get(p["targetPort"]) == p["port"], f"{where}: Service port {p['name']}")
    monitor = by_kind["PodMonitor"]["hyscaled"]["spec"]
    check(matches(monitor["selector"]["matchLabels"], pod_labels), f"{where}: PodMonitor selector")
    check([e["port"] for e in monitor["podMetricsEndpoints"]] == ["metrics"],
          f"{where}: PodMonitor port")

    # The workers: flags, the coordinator's address, GPUs, /dev/shm, NCCL.
    w = ds["spec"]["template"]["spec"]["containers"][0]
    wargs = args_map(w)
    for flag in wargs:
        check(flag in worker_flags, f"{where}: hyscale-worker has no flag {flag}")
    check(wargs["--server"] == f"hyscaled:{grpc_port}", f"{where}: --server {wargs['--server']}")
    gpus = [w["resources"][part].get("nvidia.com/gpu") for part in ("requests", "limits")]
    check(gpus[0] is not None and gpus[0] == gpus[1] and int(gpus[0]) > 0, f"{where}: gpus {gpus}")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    shm = [m["name"] for m in w["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    check(shm and volumes[shm[0]].get("emptyDir", {}).get("medium") == "Memory",
          f"{where}: /dev/shm is not a memory emptyDir")
    check(any(e["name"].startswith("NCCL_") for e in w.get("env", [])), f"{where}: no NCCL env")
    ckpt = args.get("--checkpoint-root", "")
    check(any(ckpt.startswith(m["mountPath"] + "/") and
              "persistentVolumeClaim" in volumes[m["name"]] for m in w["volumeMounts"]),
          f"{where}: workers do not mount the checkpoint root {ckpt}")
    for v in volumes.values():
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            check(claim in by_kind["PersistentVolumeClaim"], f"{where}: no PVC {claim}")

    # Network policies select the pods they are about, and admit the gRPC and metrics ports.
    worker_labels = ds["spec"]["template"]["metadata"]["labels"]
    policies = by_kind["NetworkPolicy"]
    check(matches(policies["hyscaled"]["spec"]["podSelector"]["matchLabels"], pod_labels),
          f"{where}: hyscaled NetworkPolicy selects no pod")
    check(matches(policies["hyscale-worker"]["spec"]["podSelector"]["matchLabels"], worker_labels),
          f"{where}: worker NetworkPolicy selects no pod")
    admitted = {p["port"] for rule in policies["hyscaled"]["spec"]["ingress"]
                for p in rule.get("ports", [])}
    check(admitted == {grpc_port, metrics_port}, f"{where}: NetworkPolicy ports {admitted}")
    grpc_from = [f.get("podSelector", {}).get("matchLabels")
                 for rule in policies["hyscaled"]["spec"]["ingress"]
                 if grpc_port in [p["port"] for p in rule["ports"]] for f in rule["from"]]
    check(any(matches(selector, worker_labels) for selector in grpc_from),
          f"{where}: workers may not reach hyscaled's gRPC port")

    # RBAC binds the service accounts; the Secret is in the overlay or documented as external.
    binding = by_kind["RoleBinding"]["hyscale-config-reader"]
    check(binding["roleRef"]["name"] in by_kind["Role"], f"{where}: RoleBinding to no Role")
    check({s["name"] for s in binding["subjects"]} == set(by_kind["ServiceAccount"]),
          f"{where}: RoleBinding subjects")
    secret = by_kind.get("Secret", {}).get("hyscale-token")
    if secret is not None:
        check("token" in secret.get("data", {}), f"{where}: the Secret has no token key")
    else:
        text = (overlay / "kustomization.yaml").read_text()
        check("create secret generic hyscale-token" in text,
              f"{where}: no hyscale-token Secret and no instructions to create it")


def main():
    build = Path(sys.argv[1])
    if shutil.which("kubectl") is None:
        print("SKIPPED: kubectl is not installed (not a Debian package); deploy/k8s unchecked")
        return 77
    hyscaled_flags = help_flags(build / "server" / "hyscaled")
    worker_flags = help_flags(build / "worker" / "agent" / "hyscale-worker")
    check("--listen" in hyscaled_flags and "--server" in worker_flags, "--help lists no flags")
    overlays = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
    check(len(overlays) >= 2, "fewer than two overlays")
    for overlay in overlays:
        check_overlay(overlay, hyscaled_flags, worker_flags)
    return finish(f"k8s: {', '.join(o.name for o in overlays)} render and check out")


if __name__ == "__main__":
    sys.exit(main())
