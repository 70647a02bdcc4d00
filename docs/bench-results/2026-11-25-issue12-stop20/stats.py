#!/usr/bin/env python3
"""Medians and ranges of alt.sh and verify.sh output (data/*.txt).

usage: stats.py alt|verify FILE
"""
import statistics
import sys


def rows(path):
    """(tag of the run, the row's fields) for every table row of path."""
    cur = None
    for line in open(path):
        if line.startswith("=="):
            cur = line.split()[1]
            continue
        t = line.replace("|", " ").split()
        if t:
            yield cur, t


def alt(cur, t, d):
    if t[0] in ("get", "put"):
        d.setdefault((cur, t[0], "GB/s"), []).append(float(t[4]))
        d.setdefault((cur, t[0], "vs-redis"), []).append(float(t[-1].rstrip("x")))
    elif t[0] == "64K":  # the shm table's row
        d.setdefault((cur, "shm-put", "GB/s"), []).append(float(t[10]))
        if len(t) > 12:
            d.setdefault((cur, "shm-put", "vs-redis-set"), []).append(float(t[12].rstrip("x")))


def verify(cur, t, d):
    if t[0] != "get":
        return
    d.setdefault((cur, t[1], "conns=" + t[3], "vs-raw%"), []).append(float(t[8].rstrip("%")))
    if t[1] == "64K":
        d.setdefault((cur, t[1], "conns=" + t[3], "vs-redis"), []).append(float(t[-1].rstrip("x")))


if __name__ == "__main__":
    pick = {"alt": alt, "verify": verify}[sys.argv[1]]
    d = {}
    for cur, t in rows(sys.argv[2]):
        pick(cur, t, d)
    for k in sorted(d):
        v = d[k]
        print(" ".join(k), "median %.2f" % statistics.median(v), "range %.2f-%.2f" % (min(v), max(v)), "n", len(v))
