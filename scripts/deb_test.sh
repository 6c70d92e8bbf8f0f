#!/usr/bin/env bash
# Build the dlcp .deb with cargo-deb, install it with apt as on a clean Debian
# 12, check what it installed (binaries, conffile, user, unit, Python client),
# run the installed daemon with the installed Python client for one allreduce,
# then remove and purge it. Also checks the Kubernetes manifest offline.
# Usage: scripts/deb_test.sh   (as root or with sudo; after `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive

if ! cargo deb --version >/dev/null 2>&1; then
  echo "deb: installing cargo-deb (cargo install cargo-deb --locked)"
  cargo install cargo-deb --locked --quiet
fi
cargo deb --version
cargo build --release --locked -p dlcp -p dlcp-client
# cargo and cargo-deb put their output under $CARGO_TARGET_DIR when it is set.
tdir=${CARGO_TARGET_DIR:-target}
rm -f "$tdir"/debian/dlcp_*.deb
# --strip: release builds keep debug info (profile.release debug = 1); the package does not.
cargo deb -p dlcp --no-build --strip
deb=$(ls "$tdir"/debian/dlcp_*.deb)
echo "deb: built $deb ($(du -h "$deb" | cut -f1))"
dpkg-deb --info "$deb" | sed -n '/Package:/,/Description:/p'
dpkg-deb --contents "$deb" | awk '{print "  " $6}'

# A previous run's package would hide problems.
$SUDO apt-get purge -y -qq dlcp >/dev/null 2>&1 || true
cleanup() { $SUDO apt-get purge -y -qq dlcp >/dev/null 2>&1 || true; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true; rm -rf "${tmp:-/nonexistent}"; }
trap cleanup EXIT

echo "deb: apt install ./$deb"
case "$deb" in /*) ;; *) deb="./$deb" ;; esac
$SUDO apt-get install -y -qq --no-install-recommends "$deb"
dlcpd --version
dlcpctl --version
dpkg-query -W -f='${Conffiles}\n' dlcp | grep -q '/etc/dlcp/dlcp.toml' || { echo "dlcp.toml is not a conffile" >&2; exit 1; }
getent passwd dlcp >/dev/null || { echo "no dlcp user" >&2; exit 1; }
getent group dlcp-train >/dev/null || { echo "no dlcp-train group" >&2; exit 1; }
# The secret is the daemon's alone (dlcpd refuses one its group or others may read).
test "$(stat -c '%U:%G %a' /etc/dlcp/job.secret)" = "dlcp:dlcp 600"
# A secret left group-readable by an earlier package is made private on upgrade.
chown root:dlcp /etc/dlcp/job.secret && chmod 0640 /etc/dlcp/job.secret
out=$(/var/lib/dpkg/info/dlcp.postinst configure 0.0.9 2>&1)
grep -q "now dlcp:dlcp 0600" <<<"$out" || { echo "deb: postinst did not fix the secret: $out" >&2; exit 1; }
test "$(stat -c '%U:%G %a' /etc/dlcp/job.secret)" = "dlcp:dlcp 600"
echo "deb: /etc/dlcp/job.secret dlcp:dlcp 0600 (fixed from an earlier package's root:dlcp 0640)"
# The Python client: the package and its PyTorch hook, next to the library.
for f in __init__.py torch.py libdlcp_client.so; do
  test -f "/usr/lib/python3/dist-packages/dlcp/$f" || { echo "deb: dlcp/$f is not installed" >&2; exit 1; }
done
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  (cd / && env -u PYTHONPATH /usr/bin/python3 -c \
    "import dlcp.torch; assert dlcp.torch.__file__ == '/usr/lib/python3/dist-packages/dlcp/torch.py', dlcp.torch.__file__")
  echo "deb: import dlcp.torch (the DDP hook) from the installed package"
else
  echo "deb: dlcp/torch.py installed (python3-torch absent: not imported)"
fi
echo "deb: dlcpd check-config /etc/dlcp/dlcp.toml"
cfg_out=$(dlcpd check-config /etc/dlcp/dlcp.toml)
head -3 <<<"$cfg_out"
test -f /lib/systemd/system/dlcpd.service
if command -v systemd-analyze >/dev/null; then
  out=$(systemd-analyze verify /lib/systemd/system/dlcpd.service 2>&1) || { echo "$out"; exit 1; }
  [ -z "$out" ] || { echo "systemd-analyze verify: $out" >&2; exit 1; }
  echo "deb: systemd-analyze verify of the installed unit: clean"
fi

# The installed daemon, as the dlcp user, with the installed Python client.
tmp=$(mktemp -d /tmp/dlcp-deb-XXXXXX)
chmod 755 "$tmp"
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'deb test secret 0123456789' > "$tmp/job.secret"
cat > "$tmp/dlcp.toml" <<TOML
[node]
rank = 0
job_id = 7
job_secret_file = "job.secret"
[[peers]]
rank = 0
address = "127.0.0.1"
port = $port
[control]
socket_path = "$tmp/dlcpd.sock"
socket_mode = "0660"
[metrics]
address = "127.0.0.1:0"
TOML
chown -R dlcp:dlcp "$tmp"
chmod 755 "$tmp"
chmod 600 "$tmp/job.secret"
# As the unit runs it: user dlcp, group dlcp-train (the sockets' group).
setpriv --reuid=dlcp --regid=dlcp-train --init-groups /usr/bin/dlcpd --config "$tmp/dlcp.toml" 2>"$tmp/log" &
pid=$!
for _ in $(seq 100); do dlcpctl --socket "$tmp/dlcpd.sock" status >/dev/null 2>&1 && break; sleep 0.1; done
dlcpctl --socket "$tmp/dlcpd.sock" status
# The trainer: another user (nobody) with dlcp-train as a supplementary group
# only, as a training user added to group dlcp-train would be.
train_gid=$(getent group dlcp-train | cut -d: -f3)
trainer=(setpriv --reuid=nobody --regid=nogroup --groups="$train_gid")
if out=$(cd / && setpriv --reuid=nobody --regid=nogroup --clear-groups env -u PYTHONPATH /usr/bin/python3 -c \
    "import dlcp,sys; dlcp.attach(sys.argv[1], 7, 0, 1)" "$tmp/dlcpd.sock" 2>&1); then
  echo "deb: a user outside group dlcp-train could attach" >&2; exit 1
fi
grep -qi "permission" <<<"$out" || { echo "deb: unexpected failure: $out" >&2; exit 1; }
echo "deb: a user outside group dlcp-train is refused (permission denied)"
# A trainer reads the daemon's status but cannot reload it, nor read the secret.
"${trainer[@]}" dlcpctl --socket "$tmp/dlcpd.sock" stats --json >/dev/null
if out=$("${trainer[@]}" dlcpctl --socket "$tmp/dlcpd.sock" reload 2>&1); then
  echo "deb: a member of dlcp-train could reload: $out" >&2; exit 1
fi
grep -q "permission denied: reload" <<<"$out" || { echo "deb: unexpected reload failure: $out" >&2; exit 1; }
if "${trainer[@]}" cat /etc/dlcp/job.secret >/dev/null 2>&1; then
  echo "deb: a member of dlcp-train can read the job secret" >&2; exit 1
fi
echo "deb: a member of dlcp-train reads stats, cannot reload, cannot read the secret"
(cd / && "${trainer[@]}" env -u PYTHONPATH /usr/bin/python3 - "$tmp/dlcpd.sock" <<'PY'
import sys
import numpy as np
import dlcp
assert dlcp.__file__.startswith("/usr/lib/python3/dist-packages/"), dlcp.__file__
with dlcp.attach(sys.argv[1], 7, 0, 1) as c:
    assert (c.rank, c.world_size) == (0, 1), c.world
    g = c.tensor("grad", 1000)
    g[:] = np.arange(1000, dtype=np.float32)
    r = c.allreduce(g, budget=0)
    assert (g == np.arange(1000, dtype=np.float32)).all() and r.delivered == 1.0, r
print("deb: installed Python client: allreduce through the installed dlcpd OK")
PY
)
kill -TERM "$pid"; wait "$pid"; pid=""

echo "deb: apt remove (conffile stays) and purge (it goes)"
$SUDO apt-get remove -y -qq dlcp >/dev/null
test ! -e /usr/bin/dlcpd && test -e /etc/dlcp/dlcp.toml
$SUDO apt-get purge -y -qq dlcp >/dev/null
test ! -e /etc/dlcp/dlcp.toml && test ! -e /etc/dlcp/job.secret

echo "deb: Kubernetes manifest (offline checks; no cluster here)"
/usr/bin/python3 deploy/k8s/check.py "$tdir/release/dlcpd"
echo "deb: OK"
