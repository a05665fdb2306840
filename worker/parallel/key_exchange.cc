#include "worker/parallel/key_exchange.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>

namespace hyscale::parallel {

struct ContextParallelExchange::State : torch::CustomClassHolder {
  std::shared_ptr<Communicator> comm;
  torch::Tensor rank_order;    // [N] global position of each gathered row, ranks in order
  torch::Tensor global_order;  // [N] its inverse: gathered row of each global position
  std::mutex mutex;            // times: backward may run on autograd's thread
  CommTimes times;

  void add(double overlapped_s, double exposed_s) {
    std::lock_guard<std::mutex> lock(mutex);
    times.overlapped_s += overlapped_s;
    times.exposed_s += exposed_s;
  }
};

namespace {

using Clock = std::chrono::steady_clock;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

void throw_if_error(const absl::Status& status) {
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

// [B, N, F] in global order from the gathered rows [N, B, F] (rank order); its backward sums
// every rank's gradient of this rank's rows (reduce-scatter).
struct GatheredKeys : torch::autograd::Function<GatheredKeys> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& local,
                               const torch::Tensor& gathered,
                               const c10::intrusive_ptr<ContextParallelExchange::State>& state) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    ctx->saved_data["local_rows"] = local.size(1);
    return gathered.index_select(0, state->global_order.to(gathered.device())).transpose(0, 1);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<ContextParallelExchange::State>(
        ctx->saved_data["state"].toCapsule());
    const int64_t rows = ctx->saved_data["local_rows"].toInt();
    const auto in = grads[0]
                        .transpose(0, 1)
                        .index_select(0, state->rank_order.to(grads[0].device()))
                        .contiguous();
    auto out = torch::empty({rows, in.size(1), in.size(2)}, in.options());
    const auto start = Clock::now();
    throw_if_error(state->comm->reduce_scatter(out, in));
    state->add(0, seconds(Clock::now() - start));
    return {out.transpose(0, 1), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

absl::StatusOr<std::shared_ptr<ContextParallelExchange>> ContextParallelExchange::Create(
    std::shared_ptr<Communicator> comm, v1::CpLayout layout, int64_t seq_len) {
  std::vector<int64_t> rank_order;
  std::vector<int64_t> mine;
  for (int r = 0; r < comm->world_size(); ++r) {
    auto positions = ShardPositions(layout, seq_len, comm->world_size(), r);
    if (!positions.ok()) return positions.status();
    rank_order.insert(rank_order.end(), positions->begin(), positions->end());
    if (r == comm->rank()) mine = *positions;
  }
  auto state = c10::make_intrusive<State>();
  state->comm = std::move(comm);
  state->rank_order = torch::tensor(rank_order, torch::kLong);
  state->global_order = state->rank_order.argsort();
  return std::shared_ptr<ContextParallelExchange>(
      new ContextParallelExchange(std::move(state), torch::tensor(mine, torch::kLong)));
}

ContextParallelExchange::ContextParallelExchange(c10::intrusive_ptr<State> state,
                                                 torch::Tensor positions)
    : state_(std::move(state)), positions_(std::move(positions)) {}

ContextParallelExchange::~ContextParallelExchange() = default;

void ContextParallelExchange::start(const torch::Tensor& local) {
  if (work_) throw std::logic_error("ContextParallelExchange::start called twice without finish");
  local_ = local;
  // Rows first, so that every rank's block is contiguous in the gathered buffer.
  const auto rows = local.detach().transpose(0, 1).contiguous();
  gathered_ = torch::empty({rows.size(0) * state_->comm->world_size(), rows.size(1), rows.size(2)},
                           rows.options());
  work_ = state_->comm->all_gather_async(gathered_, rows);
}

torch::Tensor ContextParallelExchange::finish() {
  if (!work_) throw std::logic_error("ContextParallelExchange::finish called before start");
  const auto waiting_since = Clock::now();
  const auto status = work_->wait(state_->comm->timeout());
  const auto done = Clock::now();
  const auto finished = work_->finished_at().value_or(done);
  const auto hidden_until = std::min(finished, waiting_since);
  state_->add(std::max(0.0, seconds(hidden_until - work_->launched_at())),
              seconds(done - waiting_since));
  work_.reset();
  throw_if_error(status);
  auto out = GatheredKeys::apply(local_, gathered_, state_);
  local_ = gathered_ = torch::Tensor();
  return out;
}

CommTimes ContextParallelExchange::take_times() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  CommTimes times = state_->times;
  state_->times = CommTimes();
  return times;
}

absl::StatusOr<torch::Tensor> MeanAcrossRanks(Communicator& comm, const torch::Tensor& local_mean) {
  auto total = local_mean.detach().clone();
  if (auto status = comm.all_reduce(total); !status.ok()) return status;
  return total / comm.world_size();
}

}  // namespace hyscale::parallel
