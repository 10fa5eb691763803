#!/usr/bin/env python3
"""The last line of `scripts/multihost.sh test`: one JSON object from the run's
work directory (docs/multihost.md), and the checks on what each fault did.

Usage: multihost-summary.py WORK_DIR HOSTS RANKS N_FAILURES [FAILURE...]
Prints the JSON line; exit status 1 when a check failed (the shell's or one here).
"""
import json
import os
import sys


def load(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return []


def main():
    work, hosts, ranks, nfail = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    failures = sys.argv[5:5 + nfail]
    nodes = ranks - 1
    calls = compared = wrong = 0
    load_phases = {}
    for backend in ("tcp", "ucx", "etcd"):
        r = load(os.path.join(work, "load-%s.report.json" % backend))
        if r:
            calls += r.get("calls", 0)
            compared += r.get("bytes_compared", 0)
            wrong += r.get("wrong_bytes", 0)
            load_phases[backend] = {"calls": r.get("calls"), "max_call_ms": r.get("max_call_ms"),
                                    "timeout_ms": r.get("timeout_ms"),
                                    "stale_epoch_refusals": r.get("stale_epoch_refusals"),
                                    "resp_commands": r.get("resp", {}).get("commands")}
    throughput = {}
    for backend in ("tcp", "ucx"):
        b = load(os.path.join(work, "bench-%s.json" % backend))
        if b:
            calls += b.get("calls", 0)
            compared += b.get("bytes_compared", 0)
            wrong += b.get("wrong_bytes", 0)
            throughput[backend] = {h["node"]: dict(h["gbps"], put_over_raw_up=round(h["ratio"]["put_over_raw_up"], 3),
                                                   get_over_raw_down=round(h["ratio"]["get_over_raw_down"], 3))
                                   for h in b["hosts"]}
            for v in throughput[backend].values():
                for k in ("put", "get", "raw_up", "raw_down"):
                    v[k] = round(v[k], 3)

    faults, recovery, during = {}, {}, {}
    for f in lines(os.path.join(work, "faults.jsonl")):
        name, d = f["fault"], f["during"]
        faults[name] = faults.get(name, 0) + 1
        recovery[name] = round(f["recovery_ms"], 1)
        during[name] = {k: d[k] for k in ("map_nodes_min", "probes_ok", "probes_failed", "canary_served_min",
                                          "canary_reads", "canary_served_last", "canary_missed",
                                          "canary_copies_at_end")}
        if not f["recovered"]:
            failures.append("%s: the cluster did not recover" % name)
        if name == "coordinator_cut" and (d["probes_failed"] != 0 or d["probes_ok"] == 0 or
                                          d["canary_served_min"] != d["canary_blocks"]):
            failures.append("coordinator cut off: %d probes failed, %d served, %d of %d canary blocks at worst "
                            "(missed: %s); nodes and clients must keep serving on the last map" %
                            (d["probes_failed"], d["probes_ok"], d["canary_served_min"], d["canary_blocks"],
                             json.dumps([d.get("canary_missed"), d.get("canary_copies_when_put"),
                                         d.get("canary_copies_at_end")])))
        # The control plane's faults (scripts/multihost-test-etcd.sh) touch no node: every probe and canary
        # read is served and the clients' map never loses a node (a node joins: 3..4).
        if name in ("leader_killed", "etcd_member_killed", "coordinator_partitioned") and (
                d["probes_failed"] or not d["probes_ok"] or d["map_nodes_min"] < nodes or
                d["canary_served_min"] != d["canary_blocks"]):
            failures.append("etcd %s: %d probes failed, %d served, map down to %d nodes, %d of %d canary blocks at "
                            "worst (missed: %s)" % (name, d["probes_failed"], d["probes_ok"], d["map_nodes_min"],
                                                    d["canary_served_min"], d["canary_blocks"],
                                                    json.dumps(d.get("canary_missed"))))
        if name in ("link_down", "ucx_link_down", "partition"):
            if d["map_nodes_min"] != nodes - 1:
                failures.append("%s: the clients' map went down to %d nodes, expected %d (the coordinator "
                                "drops the node it cannot hear)" % (name, d["map_nodes_min"], nodes - 1))
            # Over UCX the prober's first call to the cut host lasts the whole cut (docs/multihost.md):
            # no canary read may finish during it.
            if d["canary_reads"] == 0 and name != "ucx_link_down":
                failures.append("%s: no canary read finished during the fault" % name)
            if d["canary_reads"] and d["canary_served_last"] != d["canary_blocks"]:
                failures.append("%s: %d of %d replicated blocks served at the end of the fault (missed: %s; "
                                "copies when put: %s; at the end: %s)" %
                                (name, d["canary_served_last"], d["canary_blocks"], json.dumps(d.get("canary_missed")),
                                 json.dumps(d.get("canary_copies_when_put")), json.dumps(d.get("canary_copies_at_end"))))
    limited = load(os.path.join(work, "bench-limited.json"))
    rate_limited = None
    if "rate_limit" in faults:
        if not limited:
            failures.append("rate_limit: no throughput measured under the limit")
        else:
            calls += limited.get("calls", 0)
            compared += limited.get("bytes_compared", 0)
            wrong += limited.get("wrong_bytes", 0)
            g = limited["hosts"][0]["gbps"]
            rate_limited = {k: round(v, 3) for k, v in g.items()}
            # 1 Gbit/s = 0.125 GB/s; tbf's burst lets a little more through in 0.5 s.
            if max(g.values()) > 0.16:
                failures.append("rate_limit: %s GB/s through a 1 Gbit/s limit" % json.dumps(g))
    cut = load(os.path.join(work, "decode-cut.json"))
    if cut:
        faults["decode_rank_cut"] = 1
    threads = load(os.path.join(work, "decode-threads.json"), {})
    mpi = load(os.path.join(work, "decode-mpi.json"), {})
    same = bool(threads) and threads.get("with_reuse", {}).get("token_digest") == \
        mpi.get("with_reuse", {}).get("token_digest")
    lanes = load(os.path.join(work, "ucx-lanes.json"))
    # The etcd phase (scripts/multihost-test-etcd.sh).
    etcd = load(os.path.join(work, "etcd.json"))
    if etcd:
        wrong += etcd["new_clients_wrong_bytes"]
        compared += etcd["new_clients_bytes_compared"]
        for name, ms in etcd["failover_ms"].items():
            if ms is None:
                failures.append("etcd %s: no map was published after the fault" % name)
        if etcd["new_clients_ok"] != etcd["new_clients_during_faults"] or not etcd["new_clients_during_faults"]:
            failures.append("etcd: %d of %d clients started during the faults succeeded" %
                            (etcd["new_clients_ok"], etcd["new_clients_during_faults"]))
        if not etcd["hit_rates_equal"] or etcd["hit_rate_before"] != 1.0:
            failures.append("etcd: hit rates before and after each fault: %s" % json.dumps(etcd["hit_rate"]))
        if not etcd["epochs_unique"] or not etcd["epochs_chained"]:
            failures.append("etcd: published epochs: unique %s, each following the one before %s" %
                            (etcd["epochs_unique"], etcd["epochs_chained"]))
        # Each fault that takes the leader away (killed, cut off from etcd) makes another lead.
        expected = sum(1 for f in ("leader_killed", "coordinator_partitioned") if f in etcd["failover_ms"])
        if etcd["leader_changes"] < expected:
            failures.append("etcd: %d leader changes, expected at least %d (%s)" %
                            (etcd["leader_changes"], expected, ", ".join(etcd["failover_ms"])))
    if wrong:
        failures.append("%d wrong bytes" % wrong)
    out = {
        "hosts": hosts,
        "ranks": ranks,
        "calls": calls,
        "bytes_compared": compared,
        "wrong_bytes": wrong,
        "faults": faults,
        "max_recovery_ms": max(recovery.values()) if recovery else None,
        "recovery_ms": recovery,
        "during_fault": during,
        "load": load_phases,
        "throughput_gbps": throughput,
        "rate_limited_gbps": rate_limited,
        "ucx_lanes": lanes,
        "decode": {"same_tokens_across_hosts": same, "rank_cut": cut},
        "etcd": etcd,
        "passed": not failures,
        "failures": failures,
    }
    print(json.dumps(out, separators=(",", ":")))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
