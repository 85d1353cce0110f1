// ShardServer: one server shard. Holds its part of every table in host memory and answers
// requests from workers on a single ZeroMQ ROUTER socket.
//
// The request thread (the one that calls Serve()) receives, verifies and dispatches every
// message; table work is split across the EnginePool. Any malformed message gets an error
// reply naming the problem and the shard keeps serving. Pushes carry (worker, incarnation,
// seq) and a resent push is acknowledged without being applied again.
// Thread-safety: Bind() and Serve() are called from one thread; `stop` may be set from any.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <zmq.hpp>

#include "common/manifest.hpp"
#include "common/status.hpp"
#include "common/wire.hpp"
#include "server/dense_table.hpp"
#include "server/engine_pool.hpp"
#include "server/push_dedup.hpp"
#include "server/sparse_table.hpp"

namespace parasol {

class ShardServer {
 public:
  // REQUIRES: rank < manifest.cluster.servers.size().
  ShardServer(const Manifest& manifest, uint32_t rank);
  ~ShardServer();

  // Binds the ROUTER socket to this shard's address (or cluster.bind's host).
  Status Bind();
  const std::string& endpoint() const { return endpoint_; }

  // Serves requests until `stop` becomes true or a Shutdown request arrives.
  Status Serve(const std::atomic<bool>& stop);

  // Counters and table sizes as a JSON object (the Stats op's reply).
  std::string StatsJson() const;

 private:
  struct Counters {
    uint64_t requests = 0;
    uint64_t bad_messages = 0;
    uint64_t errors = 0;
    uint64_t duplicate_pushes = 0;
    uint64_t rows_pulled = 0;
    uint64_t rows_pushed = 0;
    uint64_t dense_elements_pulled = 0;
    uint64_t dense_elements_pushed = 0;
  };
  struct HeldReply {
    zmq::message_t identity;
    Header request;
  };

  void HandleMessage(std::vector<zmq::message_t>& frames);
  Status Dispatch(const Header& req, std::span<zmq::message_t> payload_frames,
                  const zmq::message_t& identity, Header* reply,
                  std::vector<zmq::message_t>* payload, bool* held);

  Status HandleHello(const Header& req, Header* reply);
  Status HandlePullSparse(const Header& req, const PayloadView& p, Header* reply,
                          std::vector<zmq::message_t>* payload);
  Status HandlePushSparse(const Header& req, const PayloadView& p);
  Status HandlePullDense(const Header& req, Header* reply, std::vector<zmq::message_t>* payload);
  Status HandlePushDense(const Header& req, const PayloadView& p);
  Status HandleClock(const Header& req);
  Status HandleBarrier(const Header& req, const zmq::message_t& identity);

  // The shard's clock: the newest clock any worker has reported.
  uint32_t ShardClock() const;
  // Runs a bounded eviction sweep when one is due.
  void MaybeSweep();

  // Positions of the request's keys owned by each engine, in request order; reused buffers.
  void SplitByEngine(const PayloadView& p);

  Result<SparseTable*> SparseTableFor(const Header& req);
  Result<DenseTable*> DenseTableFor(const Header& req, uint64_t count);
  void SendReply(const zmq::message_t& identity, const Header& reply,
                 std::vector<zmq::message_t> payload);

  const Manifest manifest_;
  const uint32_t rank_;
  const uint32_t num_shards_;
  const uint64_t fingerprint_;
  std::string endpoint_;

  zmq::context_t context_;
  zmq::socket_t router_;
  EnginePool engines_;

  std::vector<std::unique_ptr<SparseTable>> sparse_;  // by table id; null for dense tables
  std::vector<std::unique_ptr<DenseTable>> dense_;    // by table id; null for sparse tables
  std::vector<std::vector<uint32_t>> engine_positions_;  // per engine, see SplitByEngine
  PushDedup dedup_;
  std::vector<int64_t> worker_clocks_;
  std::map<int64_t, std::vector<HeldReply>> barriers_;  // by barrier id
  Counters counters_;
  uint64_t op_counts_[16] = {};
  bool shutdown_requested_ = false;
  std::chrono::steady_clock::time_point last_sweep_{};
};

}  // namespace parasol
