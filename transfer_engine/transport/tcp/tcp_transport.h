#ifndef MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_TRANSPORT_H_
#define MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_TRANSPORT_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "transfer_engine/transport/tcp/client_lane.h"
#include "transfer_engine/transport/tcp/io_loop.h"
#include "transfer_engine/transport/tcp/server_connection.h"
#include "transfer_engine/transport/transport.h"

namespace mooncake::te::tcp {

/// TCP transport: `MC_TCP_IO_THREADS` epoll loops; per peer `MC_TCP_LANES_PER_PEER` pooled, pipelined
/// connections over which a transfer's slices are spread; zero-copy from/to registered memory on both ends.
/// Descriptor fields: `tcp_data_port` (Mooncake's) and `tcp_data_ip`.
class TcpTransport : public Transport {
 public:
  TcpTransport();
  ~TcpTransport() override;

  std::string name() const override { return "tcp"; }
  TransportCapabilities capabilities() const override;
  Status Start(const TransportContext& ctx) override;
  void Stop() override;
  void Describe(nlohmann::json& descriptor) const override;
  bool CanReach(const SegmentDescriptor& peer) const override;
  void Submit(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void SubmitAndDrive(const SegmentDescriptor& peer, const std::vector<Slice*>& slices) override;
  void ForgetPeer(const std::string& segment_name) override;
  size_t slice_size() const override;
  nlohmann::json Stats() const override;

  uint16_t data_port() const { return data_port_; }

 private:
  struct Peer {
    PeerEndpoint endpoint;
    std::vector<std::unique_ptr<ClientLane>> lanes;
    std::atomic<uint32_t> next_lane{0};
  };
  class Acceptor;

  Peer* GetPeer(const SegmentDescriptor& desc, Status* error);
  static ClientLane* LeastBusyLane(Peer* peer);
  void OnAccept(int fd);
  void OnTick(size_t loop_index);

  TransportContext ctx_;
  const EngineConfig* config_ = nullptr;
  std::vector<std::unique_ptr<IoLoop>> loops_;
  std::unique_ptr<Acceptor> acceptor_;
  int listen_fd_ = -1;
  uint16_t data_port_ = 0;
  std::atomic<size_t> next_loop_{0};
  std::atomic<bool> stopped_{false};

  mutable std::mutex peers_mu_;
  std::map<std::string, std::unique_ptr<Peer>> peers_;  // by "ip:port"; never erased before Stop()
  std::map<std::string, std::string> segment_to_peer_;  // segment name -> peers_ key

  std::mutex conns_mu_;
  std::unordered_set<ServerConnection*> conns_;
};

}  // namespace mooncake::te::tcp

#endif  // MOONCAKE_TRANSFER_ENGINE_TRANSPORT_TCP_TCP_TRANSPORT_H_
