"""transfer_engine_topology_dump: prints the NIC priority matrix the Transfer Engine builds for this host.

Mooncake's JSON shape: {"cpu:N": [[NICs on NUMA node N], [other NICs]]}. Honours --device_name (a comma-
separated allow-list), else MC_TE_FILTERS, else the NICs of MC_CUSTOM_TOPO_JSON, else all NICs that are up
with an IPv4 address (loopback excluded). Save the output, edit it, and point MC_CUSTOM_TOPO_JSON at it to pin
the NICs an engine uses.

It also lists the transport and platform plugins this installation has (linked in, or .so files in
mooncake/_plugins/ and MC_PLUGIN_DIR) and their state: a table on stderr, and with --plugins a "plugins" section
in the JSON (a list of {name, kind, origin, protocols, state, reason}; remove it before using the file as
MC_CUSTOM_TOPO_JSON).
"""

import argparse
import json
import sys


def plugin_table(plugins) -> str:
    """A human table of plugin_states(): kind, name, state, protocols, origin, and the reason when not loaded."""
    rows = [("KIND", "NAME", "STATE", "PROTOCOLS", "ORIGIN / REASON")]
    for pl in plugins:
        where = pl["origin"] + (f": {pl['reason']}" if pl["reason"] else "")
        rows.append((pl["kind"], pl["name"], pl["state"], ",".join(pl["protocols"]) or "-", where))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["plugins:"] + ["  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4] for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="transfer_engine_topology_dump", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device_name", default="", help="comma-separated NIC allow-list (default: all)")
    p.add_argument("--verbose", action="store_true",
                   help="also print each NIC's address, NUMA node and speed, and each NUMA node's CPUs (stderr)")
    p.add_argument("--plugins", action="store_true",
                   help='add a "plugins" section (every plugin and its state) to the JSON')
    args = p.parse_args(argv)
    from mooncake._native import local_host, local_topology, plugin_states

    matrix = json.loads(local_topology(args.device_name))
    plugins = plugin_states()
    print(json.dumps({**matrix, "plugins": plugins} if args.plugins else matrix, indent=2))
    print(plugin_table(plugins), file=sys.stderr)
    if args.verbose:
        host = json.loads(local_host(args.device_name))
        for nic in host["nics"]:
            speed = f"{nic['speed_mbps']} Mbit/s" if nic["speed_mbps"] > 0 else "speed unknown"
            print(f"nic {nic['name']}: {nic['ipv4']}/{nic['prefix_len']}, NUMA node {nic['numa_node']}, {speed}",
                  file=sys.stderr)
        for node, info in host["numa_nodes"].items():
            print(f"NUMA node {node}: CPUs {info['cpus']}", file=sys.stderr)
    if not any(lists[0] or lists[1] for lists in matrix.values()):
        print("note: no NIC matched (only loopback?); engines then use the address of their local_hostname",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
