"""Multi-NIC benchmark: hosts made of network namespaces joined by rate-limited veth links (needs root).

Prints, measured in one run: one link vs two equal links (striping gain), unequal links vs the sum of their
rates, and the time a large write takes when one of two links goes down in the middle (failover).
Run with `bazel run //python:multinic_bench -- [--link_mbit 200] [--size_mib 96]`.
"""

import argparse
import json
import sys

from mooncake.testing import multihost, netns


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--link_mbit", type=float, default=200, help="rate of each link (default %(default)s)")
    p.add_argument("--size_mib", type=int, default=96, help="bytes per striping run (default %(default)s MiB)")
    p.add_argument("--failover_mib", type=int, default=256, help="failover transfer size (default %(default)s MiB)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    why = netns.available()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    mib = 1 << 20
    print("measuring two equal links ...", file=sys.stderr)
    equal = multihost.striping([args.link_mbit, args.link_mbit], args.size_mib * mib)
    print("measuring unequal links ...", file=sys.stderr)
    unequal = multihost.striping([args.link_mbit, args.link_mbit / 2], args.size_mib * mib, measure_single=False)
    print("measuring failover ...", file=sys.stderr)
    fo = multihost.failover(args.link_mbit, args.failover_mib * mib, cut_after_s=2)
    result = {
        "one_link_mbps": equal.single_link_mbps, "two_links_mbps": equal.all_links_mbps,
        "two_over_one": equal.all_links_mbps / equal.single_link_mbps,
        "unequal_mbps": unequal.all_links_mbps, "unequal_limit_mbps": unequal.limit_mbps,
        "unequal_over_sum": unequal.all_links_mbps / unequal.limit_mbps, "unequal_bytes_by_nic": unequal.by_nic,
        "failover_seconds": fo.seconds, "failover_slices": fo.failed_over_slices,
        "failover_ideal_seconds": None,
        "verified": equal.verified and unequal.verified and fo.verified, "recovered": fo.recovered,
    }
    # Ideal failover time: 2 s on both links, the rest on one, no detection delay.
    link = args.link_mbit * 1e6 / 8
    rest = args.failover_mib * mib - 2 * 2 * link
    result["failover_ideal_seconds"] = 2 + max(0.0, rest) / link
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"\nTCP multi-NIC, 2 hosts (network namespaces), links of {args.link_mbit:g} Mbit/s (tc tbf)\n")
    print(f"  one link            {result['one_link_mbps']:7.1f} MB/s")
    print(f"  two links           {result['two_links_mbps']:7.1f} MB/s   {result['two_over_one']:.2f}x one link")
    print(f"  {args.link_mbit:g} + {args.link_mbit / 2:g} Mbit/s    {result['unequal_mbps']:7.1f} MB/s   "
          f"{result['unequal_over_sum']:.2f}x the sum ({result['unequal_limit_mbps']:.1f} MB/s); "
          f"bytes by NIC {unequal.by_nic}")
    print(f"  failover            {args.failover_mib} MiB with a link lost after 2 s: {fo.seconds:.1f} s "
          f"(ideal {result['failover_ideal_seconds']:.1f} s), {fo.failed_over_slices} slices moved, "
          f"link back in service: {fo.recovered}")
    print(f"  all data verified: {result['verified']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
