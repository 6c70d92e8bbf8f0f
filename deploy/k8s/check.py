#!/usr/bin/python3
"""Offline checks of deploy/k8s/dlcpd-daemonset.yaml (no cluster needed):
the documents parse, the DaemonSet keeps the settings the README promises,
and the init container's rank script, run for each peer's host IP, produces a
config that `dlcpd check-config` accepts with that rank.

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
script = ds["initContainers"][0]["args"][0]
peers = re.findall(r'rank = (\d+)\naddress = "([^"]+)"', toml)
assert len(peers) >= 2, peers

with tempfile.TemporaryDirectory() as tmp:
    cfgdir, outdir = os.path.join(tmp, "config"), os.path.join(tmp, "etc")
    os.makedirs(cfgdir)
    os.makedirs(outdir)
    secret = os.path.join(tmp, "job.secret")
    open(secret, "w").write("0123456789abcdef0123456789abcdef")
    open(os.path.join(cfgdir, "dlcp.toml"), "w").write(
        toml.replace("/etc/dlcp-secret/job.secret", secret).replace("/run/dlcp/", tmp + "/"))
    s = script.replace("/config/", cfgdir + "/").replace("/etc/dlcp/", outdir + "/")
    for rank, ip in peers:
        r = subprocess.run(["sh", "-c", s], env={"HOST_IP": ip, "PATH": os.environ["PATH"]},
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out = subprocess.run([dlcpd, "check-config", os.path.join(outdir, "dlcp.toml")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        got = re.search(r"^\[node\]\nrank = (\d+)", out.stdout, re.M)
        assert got and got.group(1) == rank, (ip, rank, out.stdout[:400])
        print(f"k8s: host {ip} -> rank {rank}: check-config OK")
    bad = subprocess.run(["sh", "-c", s], env={"HOST_IP": "192.0.2.99", "PATH": os.environ["PATH"]},
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "in no [[peers]] entry" in bad.stderr, bad
print("k8s manifest: OK")
