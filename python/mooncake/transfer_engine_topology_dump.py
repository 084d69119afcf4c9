"""transfer_engine_topology_dump: prints the NIC priority matrix the Transfer Engine builds for this host.

Mooncake's JSON shape: {"cpu:N": [[NICs on NUMA node N], [other NICs]]}. Honours --device_name (a comma-
separated allow-list), else MC_TE_FILTERS, else the NICs of MC_CUSTOM_TOPO_JSON, else all NICs that are up
with an IPv4 address (loopback excluded). Save the output, edit it, and point MC_CUSTOM_TOPO_JSON at it to pin
the NICs an engine uses.
"""

import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="transfer_engine_topology_dump", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device_name", default="", help="comma-separated NIC allow-list (default: all)")
    args = p.parse_args(argv)
    from mooncake._native import local_topology

    matrix = json.loads(local_topology(args.device_name))
    print(json.dumps(matrix, indent=2))
    if not any(lists[0] or lists[1] for lists in matrix.values()):
        print("note: no NIC matched (only loopback?); engines then use the address of their local_hostname",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
