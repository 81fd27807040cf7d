#!/usr/bin/env python3
# CPU of a Herd cluster (the supervisor process, and it plus every PostgreSQL process of its
# nodes) over a window, from /proc/PID/stat utime+stime. Usage: dash-cpu.py STATUS_URL SECONDS
import json, os, sys, time, urllib.request
tck = os.sysconf("SC_CLK_TCK")
status = json.load(urllib.request.urlopen(sys.argv[1], timeout=5))
secs = float(sys.argv[2])
herd = status["supervisor"]["pid"]
posts = [n["pid"] for n in status["nodes"] if n["pid"]]
def ticks(pid):
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    except Exception:
        return 0
def children(pids):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except Exception:
                continue
            if ppid in pids:
                out.append(int(d))
    return out
def snap():
    procs = posts + children(set(posts))
    return ticks(herd), {p: ticks(p) for p in procs}
h0, p0 = snap(); t0 = time.time()
time.sleep(secs)
h1, p1 = snap(); t1 = time.time()
dt = t1 - t0
pg = sum(v - p0.get(p, 0) for p, v in p1.items() if p in p0)
print(json.dumps({"seconds": round(dt, 1),
                  "herd_cpu_pct": round(100 * (h1 - h0) / tck / dt, 2),
                  "cluster_cpu_pct": round(100 * ((h1 - h0) + pg) / tck / dt, 2)}))
