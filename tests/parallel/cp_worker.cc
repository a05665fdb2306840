// One rank of a context-parallel test group (spawned by rank_processes.cc):
//   cp_worker <mode> <rank> <world> <store port> [mode arguments]
// Exit codes: 0 the checks passed, 1 a check failed (stderr says which), 3 a collective failed
// as the lost-rank modes expect.
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "worker/parallel/gloo_communicator.h"
#include "worker/parallel/rendezvous.h"

namespace hyscale::parallel {
namespace {

using Clock = std::chrono::steady_clock;

int fail(const std::string& what) {
  std::cerr << what << "\n";
  return 1;
}

// Every collective against values each rank can predict.
int run_collectives(Communicator& comm) {
  const int rank = comm.rank(), world = comm.world_size();
  const auto opts = at::TensorOptions().dtype(at::kDouble);
  // all_gather: rank r contributes rows filled with r.
  const auto mine = at::full({3, 2}, static_cast<double>(rank), opts);
  auto gathered = at::empty({3 * world, 2}, opts);
  auto work = comm.all_gather_async(gathered, mine);
  if (auto s = work->wait(comm.timeout()); !s.ok()) return fail(s.ToString());
  const auto expected = at::arange(world, opts).repeat_interleave(3).unsqueeze(1).expand({-1, 2});
  if (!at::equal(gathered, expected)) return fail("all_gather: wrong result");
  if (!work->finished_at().has_value() || *work->finished_at() < work->launched_at()) {
    return fail("all_gather: no completion time");
  }
  // reduce_scatter: rank r sends value (r + 1) * (chunk + 1); chunk c gets sum_r (r+1)(c+1).
  const auto chunks = (at::arange(world, opts) + 1).repeat_interleave(2).view({2 * world, 1});
  const auto in = chunks * (rank + 1);
  auto out = at::empty({2, 1}, opts);
  if (auto s = comm.reduce_scatter(out, in); !s.ok()) return fail(s.ToString());
  const double ranks_sum = world * (world + 1) / 2.0;
  if (!at::allclose(out, at::full({2, 1}, ranks_sum * (rank + 1), opts))) {
    return fail("reduce_scatter: wrong result");
  }
  auto t = at::full({5}, static_cast<double>(rank), opts);
  if (auto s = comm.all_reduce(t); !s.ok()) return fail(s.ToString());
  if (!at::allclose(t, at::full({5}, world * (world - 1) / 2.0, opts))) {
    return fail("all_reduce: wrong result");
  }
  if (auto s = comm.barrier(); !s.ok()) return fail(s.ToString());
  return 0;
}

// The last rank dies (SIGKILL) or hangs (stops calling collectives) after joining; the others
// must fail their next collective within the timeout, with an error naming it.
int run_lost_rank(Communicator& comm, bool hang) {
  if (auto s = comm.barrier(); !s.ok()) return fail(s.ToString());
  if (comm.rank() == comm.world_size() - 1) {
    if (!hang) ::raise(SIGKILL);
    std::this_thread::sleep_for(comm.timeout() + std::chrono::seconds(1));
    ::_exit(0);
  }
  const auto start = Clock::now();
  auto t = at::ones({1024});
  for (int i = 0; i < 100; ++i) {
    const auto s = comm.all_reduce(t);
    if (!s.ok()) {
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      std::cerr << "failed after " << seconds << " s: " << s.ToString() << "\n";
      return 3;
    }
  }
  return fail("all_reduce kept succeeding with a dead rank");
}

int run(int argc, char** argv) {
  if (argc < 5) return fail("usage: cp_worker <mode> <rank> <world> <port> [args]");
  const std::string mode = argv[1];
  const int rank = std::atoi(argv[2]), world = std::atoi(argv[3]), port = std::atoi(argv[4]);
  const bool lost_rank = mode == "dead_rank" || mode == "stuck_rank";
  const auto timeout = std::chrono::milliseconds(lost_rank ? 3000 : 30000);
  RendezvousConfig config;
  config.port = port;
  config.rank = rank;
  config.world_size = world;
  config.serve_store = false;
  config.timeout = timeout;
  auto store = ConnectStore(config);
  if (!store.ok()) return fail(store.status().ToString());
  GlooOptions options;
  options.timeout = timeout;
  auto comm = ConnectGloo(*store, rank, world, options);
  if (!comm.ok()) return fail(comm.status().ToString());
  if (mode == "collectives") return run_collectives(**comm);
  if (lost_rank) {
    const int code = run_lost_rank(**comm, mode == "stuck_rank");
    // The group's destructor would wait for the failed peer's connections: leave at once.
    std::cerr.flush();
    ::_exit(code);
  }
  return fail("unknown mode " + mode);
}

}  // namespace
}  // namespace hyscale::parallel

int main(int argc, char** argv) {
  return hyscale::parallel::run(argc, argv);
}
