#!/usr/bin/python3
"""Offline checks of deploy/k8s/dlcpd-daemonset.yaml (no cluster needed):
the documents parse, the DaemonSet keeps the settings the README promises,
and the init container's script, run for each peer's host IP, produces a
config that `dlcpd check-config` accepts with that rank, the metrics endpoint
bound to the pod's IP (never 0.0.0.0), and a copy of the secret only the
daemon's user can read.

Usage: deploy/k8s/check.py path/to/dlcpd
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

here = os.path.dirname(os.path.abspath(__file__))
dlcpd = sys.argv[1]
docs = [d for d in yaml.safe_load_all(open(os.path.join(here, "dlcpd-daemonset.yaml"))) if d]
kinds = {d["kind"]: d for d in docs}
assert set(kinds) == {"ConfigMap", "DaemonSet"}, kinds.keys()
ds = kinds["DaemonSet"]["spec"]["template"]["spec"]
assert ds["hostNetwork"] is True
main = ds["containers"][0]
sc = main["securityContext"]
assert sc["capabilities"]["drop"] == ["ALL"] and sc["allowPrivilegeEscalation"] is False
assert sc["readOnlyRootFilesystem"] is True and ds["securityContext"]["runAsNonRoot"] is True
assert "dlcpctl" in main["readinessProbe"]["exec"]["command"][0]
toml = kinds["ConfigMap"]["data"]["dlcp.toml"]
init = ds["initContainers"][0]
script = init["args"][0]
env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in init["env"]}
assert env == {"HOST_IP": "status.hostIP", "POD_IP": "status.podIP"}, env
assert "0.0.0.0" not in toml and "::]:" not in toml, "metrics must not listen on every address"
# Only the init container reads the Secret; the daemon reads its private copy.
assert not any(m["name"] == "secret" for m in main["volumeMounts"]), main["volumeMounts"]
peers = re.findall(r'rank = (\d+)\naddress = "([^"]+)"', toml)
assert len(peers) >= 2, peers

with tempfile.TemporaryDirectory() as tmp:
    cfgdir, outdir = os.path.join(tmp, "config"), os.path.join(tmp, "etc")
    os.makedirs(cfgdir)
    os.makedirs(outdir)
    secretdir = os.path.join(tmp, "secret")
    os.makedirs(secretdir)
    # As Kubernetes mounts it: group-readable (defaultMode 0440, group fsGroup).
    secret = os.path.join(secretdir, "job.secret")
    open(secret, "w").write("0123456789abcdef0123456789abcdef")
    os.chmod(secret, 0o440)
    open(os.path.join(cfgdir, "dlcp.toml"), "w").write(toml.replace("/run/dlcp/", tmp + "/"))
    s = (script.replace("/config/", cfgdir + "/").replace("/etc/dlcp-secret/", secretdir + "/")
         .replace("/etc/dlcp/", outdir + "/"))
    for rank, ip in peers:
        r = subprocess.run(["sh", "-c", s], env={"HOST_IP": ip, "POD_IP": ip, "PATH": os.environ["PATH"]},
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        copy = os.path.join(outdir, "job.secret")
        assert os.stat(copy).st_mode & 0o777 == 0o600, oct(os.stat(copy).st_mode)
        out = subprocess.run([dlcpd, "check-config", os.path.join(outdir, "dlcp.toml")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        got = re.search(r"^\[node\]\nrank = (\d+)", out.stdout, re.M)
        assert got and got.group(1) == rank, (ip, rank, out.stdout[:400])
        got = re.search(r"^\[metrics\]\n(?:.*\n)*?address = \"([^\"]+)\"", out.stdout, re.M)
        assert got and got.group(1) == f"{ip}:9464", (ip, got and got.group(1))
        print(f"k8s: host {ip} -> rank {rank}, metrics on {ip}:9464 only: check-config OK")
    # An IPv6 pod IP is bracketed.
    r = subprocess.run(["sh", "-c", s], env={"HOST_IP": peers[0][1], "POD_IP": "fd00::7", "PATH": os.environ["PATH"]},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert 'address = "[fd00::7]:9464"' in open(os.path.join(outdir, "dlcp.toml")).read()
    bad = subprocess.run(["sh", "-c", s], env={"HOST_IP": "192.0.2.99", "POD_IP": "192.0.2.99",
                                               "PATH": os.environ["PATH"]},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "in no [[peers]] entry" in bad.stderr, bad
print("k8s manifest: OK")
