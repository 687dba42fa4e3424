#!/usr/bin/env python3
"""Submit-to-finished latency of a scripted survey run three ways (docs/PERFORMANCE.md, "HTTP API"):
a local `keel run` (one process per run), the HTTP API (POST /v1/runs, then the run's event stream
until `finished`, on one `keel serve`), and `keel --server URL run` (a client process per run).
Usage: scripts/api-latency.py PATH/TO/keel N. Works in /tmp/keel-api-latency; the spawn rate limit is lifted in
both homes so that N runs on one server are not throttled by the supervisor's token bucket."""
import http.client, json, os, subprocess, sys, time, statistics
K = os.path.abspath(sys.argv[1]); N = int(sys.argv[2])
def folder(name):
    d = f"/tmp/keel-api-latency/{name}"
    subprocess.run(["rm", "-rf", d]); os.makedirs(d)
    os.makedirs(f"{d}/.keel"); open(f"{d}/.keel/keel.toml","w").write("[supervisor]\nspawns_per_minute = 1000000\nspawn_burst = 100000\n")
    open(f"{d}/main.rs","w").write("// TODO\nfn main(){}\n"); open(f"{d}/lib.rs","w").write("pub fn f(){}\n")
    return d
env = dict(os.environ, KEEL_LOG="error")
# local: one process per run
d = folder("local"); local = []
for _ in range(N):
    t = time.monotonic(); subprocess.run([K, "run", "--quiet", "survey this folder"], cwd=d, env=env, check=True, capture_output=True); local.append(time.monotonic() - t)
# server
d = folder("served")
srv = subprocess.Popen([K, "serve", "--listen", "127.0.0.1:0"], cwd=d, env=env, stdout=subprocess.PIPE, text=True)
line = srv.stdout.readline()
while "listening on" not in line: line = srv.stdout.readline()
url = line.split("listening on ")[1].split()[0]
host, port = url[len("http://"):].split(":")
token = open(f"{d}/.keel/api-token").read().strip()
api = []
for _ in range(N):
    t = time.monotonic()
    c = http.client.HTTPConnection(host, int(port)); c.request("POST", "/v1/runs", json.dumps({"brief": "survey this folder"}), {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    run = json.loads(c.getresponse().read())["run"]
    c = http.client.HTTPConnection(host, int(port)); c.request("GET", f"/v1/runs/{run}/events", headers={"Authorization": f"Bearer {token}"})
    r = c.getresponse()
    for raw in r:
        if raw.startswith(b"event: finished"): break
    api.append(time.monotonic() - t); c.close()
cli = []
for _ in range(N):
    t = time.monotonic(); subprocess.run([K, "--server", url, "--token-file", f"{d}/.keel/api-token", "run", "--quiet", "survey this folder"], cwd="/tmp/keel-api-latency", env=env, check=True, capture_output=True); cli.append(time.monotonic() - t)
srv.terminate(); srv.wait()
for name, xs in [("local keel run", local), ("API POST+SSE", api), ("keel --server run", cli)]:
    xs = sorted(xs); print(f"{name}: median {statistics.median(xs)*1000:.0f} ms, min {xs[0]*1000:.0f}, max {xs[-1]*1000:.0f} (n={len(xs)})")
