#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_VERBS_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_VERBS_H_

// A FAKE verbs provider for tests without an RDMA NIC: a VerbsApi table (../verbs_api.h) with RC semantics
// between processes of one machine. Never used unless a test selects it (MC_RDMA_FAKE_LIBRARY names the
// libfake_ibverbs.so built from this folder, or a test calls FakeVerbs()).
//
// Configuration, read from the environment at the first call of get_device_list:
//   MC_RDMA_FAKE_STATE    a directory shared by every process of the fake "fabric" (required: without it
//                         get_device_list fails with ENOSYS, as libibverbs does on a host without RDMA);
//   MC_RDMA_FAKE_HOST     this process's fake host (default "host0"); devices are named per host;
//   MC_RDMA_FAKE_DEVICES  the devices: comma-separated `name[:opt]...` with opts `netdev=<ifname>` (the port is
//                         ACTIVE only while that interface has carrier; its IPv4 address gives the RoCEv2 GID),
//                         `ib` (InfiniBand link layer, a LID, one GID), `down` (port DOWN), `nogid` (empty GID
//                         table), `switch` (node type switch), `max_mr=<bytes>` (max_mr_size), `mbps=<MB/s>`
//                         (an emulated link rate: the worker sleeps after each WR), `numa=<node>` (the NUMA node
//                         its sysfs entry reports: <ibdev_path>/device/numa_node, under MC_RDMA_FAKE_STATE),
//                         `pcie_root=<hex bus>` (the PCIe root it is under: <ibdev_path>/device links to
//                         sysfs/<host>/devices/pci0000:<bus>/<its address> under MC_RDMA_FAKE_STATE);
//                         default "fake_mlx5_0,fake_mlx5_1";
//   MC_RDMA_FAKE_DMABUF   0: reg_dmabuf_mr fails with EOPNOTSUPP (a provider without dma-buf); default 1;
//   MC_RDMA_FAKE_PEERMEM  1: peer_memory() says a peer-memory client is loaded; default 0;
//   MC_RDMA_FAKE_RETRY_MS how long a WR keeps retrying an unreachable peer before IBV_WC_RETRY_EXC_ERR (500).
//
// Semantics: devices with one port; PDs; MRs with one key as lkey and rkey (as mlx5 gives them) and access
// flags: a peer may use any MR's key, and the responder checks the MR's remote access flags; dma-buf MRs (reg_dmabuf_mr: EBADF for a closed fd; EINVAL for a zero
// or oversized length, a null iova, remote write without local write, offset + length beyond the file, or an
// iova where this process does not map the fd at `offset` -- the fake moves bytes by address); CQs that overrun
// when a completion finds them full (every poll then fails and their QPs move to ERR); completion channels
// whose fd (a pipe) becomes readable once a completion arrives on an armed CQ; RC QPs with the state machine
// RESET -> INIT -> RTR -> RTS (ERR and RESET from any state) and the required attribute masks checked; at each WR
// the two QPs of the connection must agree (each one's sq_psn is the other's rq_psn, else IBV_WC_RETRY_EXC_ERR;
// one path MTU, else a message above the smaller one is IBV_WC_REM_INV_REQ_ERR);
// IBV_WR_RDMA_WRITE and IBV_WR_RDMA_READ (nothing else) with up to max_send_wr in flight, executed in order by
// one thread per context with process_vm_writev/readv into the peer process. The responder side checks that
// the destination QP exists, is RTR/RTS, is connected back to the requester, owns the destination GID, and that
// the rkey names one of its MRs in the QP's PD with the right remote access covering the range
// (IBV_WC_REM_ACCESS_ERR otherwise). Local SGEs are checked against local MRs (IBV_WC_LOC_PROT_ERR). Any error
// completion moves the QP to ERR; WRs behind it complete with IBV_WC_WR_FLUSH_ERR. An unreachable peer (port
// down, link without carrier, QP or process gone) is retried for MC_RDMA_FAKE_RETRY_MS, then
// IBV_WC_RETRY_EXC_ERR.
//
// Shared state under MC_RDMA_FAKE_STATE: qp/<qpn> (one line per QP: owner pid, state, peer, PD, rq_psn, sq_psn,
// path MTU, host, device, GIDs), sysfs/<host>.<device>/device/numa_node, mr/<pid> (the MRs of a process), port/<host>.<device> (the port state as the device's own process sees
// it, refreshed every 20 ms: a responder whose link is down is unreachable), fault/<host>.<device> (fault
// injection, below). Files are replaced
// atomically (write + rename). QP numbers are unique across the state directory.
//
// Not covered: SEND/RECV and immediate data, atomics, SRQ, UD/UC, async events, memory windows, real dma-buf
// exporters, PSN advance per packet and other packet-level behaviour, more than one port.

#include <string>

#include "transfer_engine/transport/rdma/verbs_api.h"

namespace mooncake::te::rdma::fake {

/// The fake provider's table (the same one libfake_ibverbs.so exports).
const VerbsApi* FakeVerbs();

/// Fault injection for device `device` of fake host `host`, seen by every process of the state directory:
/// the words of `faults` (replacing the previous ones, "" clears):
///   port_down        the port is DOWN (query_port), and WRs to or from it time out (IBV_WC_RETRY_EXC_ERR);
///   wc_error[=N]     every WR completes with status N (default IBV_WC_RETRY_EXC_ERR) at once;
///   qp_error=G       once per new generation G, every QP of the device (in every process) moves to ERR.
/// Returns false (with errno) when the file cannot be written.
bool SetFault(const std::string& state_dir, const std::string& host, const std::string& device,
              const std::string& faults);

/// How many WRs this process's fake devices executed (successful or not), for tests.
unsigned long long ExecutedWorkRequests();

}  // namespace mooncake::te::rdma::fake

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_RDMA_TESTING_FAKE_VERBS_H_
