"""The table of scripts/device-check.sh: reads OUT/raw.csv and OUT/cuda.json,
writes OUT/device-check.md (one markdown page: the targets, measured or not
run, then a table per step) and prints it.  Standard library only."""

import argparse
import collections
import csv
import json
import os
import statistics


def fnum(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def size_label(n):
    n = int(n)
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return "%d%s" % (n >> shift, unit)
    return str(n)


def verdict(value, target):
    if value is None:
        return "not run"
    return "met" if value >= target else "missed"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="run")
    ap.add_argument("--cuda-registered", default="not run")
    ap.add_argument("--status", default="")
    a = ap.parse_args()
    rows = []
    raw_path = os.path.join(a.out, "raw.csv")
    if os.path.exists(raw_path):
        with open(raw_path) as f:
            rows = list(csv.DictReader(f))
    cuda = None
    cj = os.path.join(a.out, "cuda.json")
    if os.path.exists(cj):
        with open(cj) as f:
            cuda = json.load(f)
    # (step, threads, op, size, batch, conns, path) -> gbps
    cell = {}
    for r in rows:
        cell[(r["step"], r["threads"], r["op"], r["size"], r["batch"], r["conns"], r["path"])] = fnum(r["gbps"])
    md = []
    dry = a.mode == "dry"
    md.append("# device check: %s" % ("dry run (no GPU; 2-core smoke test, figures mean nothing)" if dry else "GPU run"))
    md.append("")
    targets = []  # (target, value text, verdict)

    # gets of 1 MiB and up vs the raw stream
    big = [r for r in rows if r["step"] == "big" and r["op"] == "get" and r["path"] == "ecstore-tcp"]
    if big:
        md.append("## tcp gets vs the raw stream (batch 8; server --threads = raw stream's threads)")
        md.append("")
        md.append("| threads | size | conns | ecstore GB/s | raw GB/s | ecs/raw | >= 90% |")
        md.append("|---:|---:|---:|---:|---:|---:|---|")
        worst = collections.defaultdict(lambda: None)
        for r in big:
            e = fnum(r["gbps"])
            raw = cell.get(("big", r["threads"], "get", r["size"], r["batch"], r["conns"], "raw-tcp"))
            ratio = e / raw if e is not None and raw else None
            md.append("| %s | %s | %s | %.2f | %s | %s | %s |" % (
                r["threads"], size_label(r["size"]), r["conns"], e or 0, "%.2f" % raw if raw else "-",
                "%.0f%%" % (100 * ratio) if ratio is not None else "-", verdict(ratio, 0.9)))
            if r["threads"] == r["conns"] and ratio is not None:  # the diagonal: threads = connections
                k = r["conns"]
                worst[k] = ratio if worst[k] is None else min(worst[k], ratio)
        md.append("")
        for k in ("1", "2", "4", "8"):
            w = worst.get(k)
            targets.append(("gets >= 90%% of the raw stream, %s conn(s), threads = conns" % k,
                            "%.0f%% (worst size)" % (100 * w) if w is not None else "-", verdict(w, 0.9)))
    else:
        targets.append(("gets >= 90% of the raw stream at 1, 2, 4, 8 connections", "-", "not run"))

    # 64 KiB x 32 vs Redis
    small = [r for r in rows if r["step"] == "small" and r["path"] == "ecstore-tcp"]
    if small:
        md.append("## 64 KiB x 32 vs Redis (pipelined GET / SET, same connections)")
        md.append("")
        md.append("| threads | conns | op | ecstore GB/s | Redis GB/s | ecs/Redis | target |")
        md.append("|---:|---:|---|---:|---:|---:|---|")
        best = {}
        for r in small:
            e = fnum(r["gbps"])
            red = cell.get(("small", r["threads"], r["op"], r["size"], r["batch"], r["conns"], "redis"))
            ratio = e / red if e is not None and red else None
            tgt = 3.0 if r["op"] == "get" else 1.5
            md.append("| %s | %s | %s | %.2f | %s | %s | %s (%.1fx) |" % (
                r["threads"], r["conns"], r["op"], e or 0, "%.2f" % red if red else "-",
                "%.2fx" % ratio if ratio is not None else "-", verdict(ratio, tgt), tgt))
            if ratio is not None:
                best.setdefault(r["op"], []).append(ratio)
        md.append("")
        for op, tgt, name in (("put", 1.5, "64 KiB x 32 puts >= 1.5x Redis SET"), ("get", 3.0, "64 KiB x 32 gets >= 3x Redis GET")):
            if op in best:
                v = statistics.median(best[op])
                targets.append((name, "median %.2fx over the cells (%.2f-%.2fx)" % (v, min(best[op]), max(best[op])),
                                verdict(v, tgt)))
            else:
                targets.append((name, "-", "not run"))
    else:
        targets.append(("64 KiB x 32 puts >= 1.5x Redis SET, gets >= 3x Redis GET", "-", "not run"))

    # shm copy vs memcpy
    shm = [r for r in rows if r["step"] == "shm" and r["path"] == "ecstore-shm-copy"]
    if shm:
        md.append("## shm copy gets vs memcpy (batch 8)")
        md.append("")
        md.append("| size | conns | copy GB/s | memcpy GB/s | copy/memcpy |")
        md.append("|---:|---:|---:|---:|---:|")
        for r in shm:
            e = fnum(r["gbps"])
            m = cell.get(("shm", r["threads"], "get", r["size"], r["batch"], r["conns"], "memcpy"))
            md.append("| %s | %s | %.2f | %s | %s |" % (size_label(r["size"]), r["conns"], e or 0,
                                                        "%.2f" % m if m else "-", "%.0f%%" % (100 * e / m) if e and m else "-"))
        md.append("")

    # located get
    loc = {r["path"]: fnum(r["p50_us"]) for r in rows if r["step"] == "located"}
    if loc:
        one, two = loc.get("one-server"), loc.get("two-servers")
        md.append("## located get (keys looked up in Redis), one server vs two")
        md.append("")
        md.append("| batch | size | one server ms | two servers ms | two/one |")
        md.append("|---:|---:|---:|---:|---:|")
        r0 = next(r for r in rows if r["step"] == "located")
        md.append("| %s | %s | %s | %s | %s |" % (r0["batch"], r0["size"], one, two,
                                                "%.2f" % (two / one) if one and two else "-"))
        md.append("")
        md.append("(the p50_us column of raw.csv holds these medians in ms)")
        md.append("")

    # CUDA
    md.append("## CUDA")
    md.append("")
    md.append("- server pool registered with CUDA (/metrics ecstore_pool_cuda_registered): %s" % a.cuda_registered)
    if cuda is None:
        md.append("- device_cuda.py: no cuda.json (not run, or it failed before writing one: see the steps and the log)")
        targets.append(("H2D from the pinned pool and shm views >= 90% of torch pinned", "-", "not run"))
    else:
        md.append("- torch %s, CUDA %s, device %s" % (cuda.get("torch"), cuda.get("cuda"), cuda.get("device")))
        h = cuda.get("h2d", {})
        if "gbps" in h:
            md.append("- %s, %d x %s per round, %s rounds; pool block registered in-process: %s; client transport: %s; %s" % (
                h.get("what"), h.get("objects", 0), size_label(h.get("size_bytes", 0)), h.get("rounds"),
                h.get("pool_cuda_registered"), h.get("client_transport"), h.get("view_register") or ""))
            md.append("")
            md.append("| source | GB/s median | min-max | vs torch pinned | wrong bytes |")
            md.append("|---|---:|---:|---:|---:|")
            for k, v in h["gbps"].items():
                md.append("| %s | %.2f | %.2f-%.2f | %.0f%% | %s |" % (k, v["median"], v["min"], v["max"],
                                                                  100 * v["vs_torch_pinned"], h.get("wrong_bytes", {}).get(k, "-")))
            md.append("")
            if not dry:
                for k in ("pinned pool", "shm view", "shm view, registered"):
                    if k in h["gbps"]:
                        v = h["gbps"][k]["vs_torch_pinned"]
                        targets.append(("H2D from the %s >= 90%% of torch pinned" % k, "%.0f%%" % (100 * v), verdict(v, 0.9)))
            wb = sum(h.get("wrong_bytes", {}).values())
            targets.append(("zero wrong bytes (H2D)", "%d wrong" % wb, "met" if wb == 0 else "missed"))
        else:
            md.append("- H2D: %s" % h.get("result", "not run"))
        for ck in sorted(k for k in cuda if k.startswith("connector")):
            c = cuda[ck]
            md.append("- connector over %s: %s" % (c.get("protocol", "tcp"), c.get("path", "-")))
            md.append("  - vLLM: %s" % c.get("vllm", "-"))
            for k, v in (c.get("features") or {}).items():
                md.append("  - %s: %s" % (k, "yes" if v else "not available"))
            if "save" in c:
                md.append("  - save: %s" % json.dumps(c["save"]))
            for rnd in ("load", "load_again", "load_staged"):
                if rnd in c:
                    md.append("  - %s: %s" % (rnd.replace("_", " "), json.dumps(c[rnd])))
            if "stats" in c:
                md.append("  - the connector's stats: %s" % json.dumps(c["stats"]))
            md.append("  - result: %s" % c.get("result", "-"))
            if "load" in c:
                wb = sum(c[r].get("wrong_bytes", 0) for r in ("load", "load_again", "load_staged") if r in c)
                targets.append(("zero wrong bytes (connector save/load, %s)" % c.get("protocol", "tcp"), "%s wrong" % wb,
                                "met" if wb == 0 else "missed"))
    md.append("")

    head = ["## Targets (%s)" % ("dry run: a verdict here says only that the step ran" if dry else "this run"), "",
            "| target | measured | verdict |", "|---|---|---|"]
    head += ["| %s | %s | %s |" % t for t in targets]
    head += ["", "## Steps", ""] + ["- %s" % s for s in a.status.splitlines() if s.strip()] + [""]
    text = "\n".join(md[:2] + head + md[2:]) + "\n"
    with open(os.path.join(a.out, "device-check.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
