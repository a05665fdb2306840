// The CUDA sparse_attn forward and backward against float64 references on fresh random inputs:
// N not a multiple of the tile, rows with -1 slots (and rows with none valid), adjacent queries
// sharing keys (so groups have real unions), every group size G, the DeepSeek-V3.2 shape; the
// backward also against the CPU op's gradients, and the deterministic mode bit for bit across
// runs. Skips without a GPU.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

#include "kernels/torch/ops.h"
#include "tests/kernels/gpu_kernel_test.h"

namespace hyscale::test {
namespace {

class SparseAttnCudaTest : public GpuKernelTest {};

constexpr int64_t kGroups[] = {1, 2, 4, 8, 16};

struct Case {
  int64_t n, m, heads, dqk, dv, topk;
  double scale;
};

struct Inputs {
  torch::Tensor q, key, value, indices;  // fp32 holding bf16 values (CPU); indices int32 (CPU)
};

// Rows of 16 adjacent queries draw most keys from a shared pool (overlapping selections), the
// rest anywhere; each row keeps a random number of valid slots (some none, when allowed), no
// duplicates, -1 elsewhere: in random slot order, or in every third row first, the -1 slots
// after them (a causal query's unused slots, which the kernels skip rather than mask).
Inputs make_inputs(Random& rng, const Case& c, bool allow_empty_rows) {
  auto bf = [](torch::Tensor t) { return t.to(torch::kBFloat16).to(torch::kFloat); };
  Inputs in{bf(torch::randn({c.n, c.heads, c.dqk})), bf(torch::randn({c.m, c.dqk})),
            bf(torch::randn({c.m, c.dv})), torch::full({c.n, c.topk}, -1, torch::kInt)};
  auto idx = in.indices.accessor<int32_t, 2>();
  std::vector<int64_t> pool;
  for (int64_t t = 0; t < c.n; ++t) {
    if (t % 16 == 0) {
      const auto perm = torch::randperm(c.m, torch::kLong);
      pool.assign(perm.data_ptr<int64_t>(),
                  perm.data_ptr<int64_t>() + std::min<int64_t>(c.m, c.topk * 3 / 2));
    }
    const int64_t lo = allow_empty_rows ? 0 : 1;
    const int64_t valid = rng.chance(0.5) ? c.topk : rng.uniform_int(lo, c.topk);
    std::vector<char> used(c.m, 0);
    std::vector<int64_t> keys;
    while (static_cast<int64_t>(keys.size()) < valid) {
      const int64_t s =
          rng.chance(0.8) ? pool[rng.uniform_int(0, pool.size() - 1)] : rng.uniform_int(0, c.m - 1);
      if (!used[s]) {
        used[s] = 1;
        keys.push_back(s);
      }
    }
    const auto slots =
        t % 3 == 0 ? torch::arange(c.topk, torch::kLong) : torch::randperm(c.topk, torch::kLong);
    for (int64_t i = 0; i < valid; ++i) idx[t][slots[i].item<int64_t>()] = keys[i];
  }
  return in;
}

struct Reference {
  torch::Tensor out, lse, grad_q, grad_key, grad_value;
};

// float64 attention by gather; gradients of sum(out * grad_out) when grad_out is defined.
Reference reference(const Inputs& in, double scale, const torch::Tensor& grad_out) {
  auto q = in.q.to(torch::kDouble).requires_grad_(grad_out.defined());
  auto key = in.key.to(torch::kDouble).requires_grad_(grad_out.defined());
  auto value = in.value.to(torch::kDouble).requires_grad_(grad_out.defined());
  const auto idx = in.indices.to(torch::kLong);
  const auto valid = idx.ge(0);
  const auto safe = idx.clamp_min(0);
  const auto logits = torch::einsum("nhd,nkd->nhk", {q, key.index({safe})}) * scale;
  const auto masked = logits.masked_fill(valid.logical_not().unsqueeze(1), -INFINITY);
  const auto lse = torch::logsumexp(masked, -1);
  const auto finite_lse = torch::where(lse.isinf(), torch::zeros_like(lse), lse);
  const auto p = torch::exp(masked - finite_lse.unsqueeze(-1));
  const auto out = torch::einsum("nhk,nkd->nhd", {p, value.index({safe})});
  Reference r{out.detach(), lse.detach(), {}, {}, {}};
  if (grad_out.defined()) {
    (out * grad_out.to(torch::kDouble)).sum().backward();
    r.grad_q = q.grad();
    r.grad_key = key.grad();
    r.grad_value = value.grad();
  }
  return r;
}

std::tuple<torch::Tensor, torch::Tensor> run_fwd(const Inputs& in, double scale, int64_t group) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("hyscale::sparse_attn_grouped", "")
                             .typed<std::tuple<at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, double, int64_t)>();
  auto [out, lse] =
      op.call(in.q.cuda(), in.key.cuda(), in.value.cuda(), in.indices.cuda(), scale, group);
  return {out.cpu(), lse.cpu()};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> run_bwd(const Inputs& in, double scale,
                                                                const torch::Tensor& out,
                                                                const torch::Tensor& lse,
                                                                const torch::Tensor& grad_out,
                                                                int64_t group, bool deterministic) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("hyscale::sparse_attn_backward_grouped", "")
          .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
              const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
              const at::Tensor&, double, const at::Tensor&, const at::Tensor&, int64_t, bool)>();
  auto [gq, gk, gv] =
      op.call(grad_out.cuda(), in.q.cuda(), in.key.cuda(), in.value.cuda(), in.indices.cuda(),
              scale, out.cuda(), lse.cuda(), group, deterministic);
  return {gq.cpu(), gk.cpu(), gv.cpu()};
}

// max |got - want| <= atol + rtol * max |want|, with a message naming the worst element.
void expect_close(const torch::Tensor& got, const torch::Tensor& want, double rtol,
                  const std::string& what) {
  const auto g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  const auto finite = w.isfinite();
  ASSERT_TRUE(torch::equal(g.isinf(), w.isinf())) << what << ": infinities differ";
  const auto diff = (g - w).abs().masked_fill(finite.logical_not(), 0);
  const double scale =
      std::max(1e-3, w.masked_fill(finite.logical_not(), 0).abs().max().item<double>());
  const double worst = diff.max().item<double>();
  EXPECT_LE(worst, rtol * scale) << what << ": max error " << worst << " vs max |ref| " << scale;
}

const Case kCases[] = {
    {37, 300, 5, 64, 64, 24, 0.125},        // tiny head count: groups fill the tile
    {53, 700, 3, 128, 128, 40, 0.09},       // N not a tile multiple, topk not a multiple of 32/64
    {29, 500, 16, 192, 128, 72, 0.07},      // d_qk != d_v
    {45, 900, 64, 192, 128, 100, 0.07},     // whole 64-head tiles at G = 1: the wgmma forward
    {6, 2500, 128, 576, 512, 256, 0.0417},  // DeepSeek-V3.2 absorbed shape, small N
};

TEST_F(SparseAttnCudaTest, ForwardMatchesFloat64ReferenceForEveryGroup) {
  for (const Case& c : kCases) {
    SCOPED_TRACE("d_qk " + std::to_string(c.dqk) + " H " + std::to_string(c.heads));
    const Inputs in = make_inputs(rng_, c, /*allow_empty_rows=*/true);
    const Reference ref = reference(in, c.scale, {});
    torch::Tensor out1, lse1;
    for (int64_t group : kGroups) {
      if (group * c.topk > 32768) continue;
      SCOPED_TRACE("G " + std::to_string(group));
      auto [out, lse] = run_fwd(in, c.scale, group);
      expect_close(out, ref.out, 1e-2, "out");
      expect_close(lse, ref.lse, 1e-5, "lse");
      if (group == 1) {
        out1 = out;
        lse1 = lse;
      } else {
        // Same result up to the summation order (the union is walked in key order): far inside
        // the reference tolerance.
        expect_close(out, out1, 1e-2, "out vs G = 1");
        expect_close(lse, lse1, 1e-5, "lse vs G = 1");
      }
    }
  }
}

TEST_F(SparseAttnCudaTest, BackwardMatchesFloat64ReferenceAndTheCpuOp) {
  for (const Case& c : kCases) {
    SCOPED_TRACE("d_qk " + std::to_string(c.dqk) + " H " + std::to_string(c.heads));
    const Inputs in = make_inputs(rng_, c, /*allow_empty_rows=*/false);
    const auto grad_out = torch::randn({c.n, c.heads, c.dv}).to(torch::kBFloat16).to(torch::kFloat);
    const Reference ref = reference(in, c.scale, grad_out);
    const auto cpu =
        ops::sparse_attn_backward(grad_out, in.q, in.key, in.value, in.indices, c.scale,
                                  ref.out.to(torch::kFloat), ref.lse.to(torch::kFloat));
    auto [out, lse] = run_fwd(in, c.scale, 1);
    for (int64_t group : kGroups) {
      if (group * c.topk > 32768) continue;
      for (bool det : {false, true}) {
        SCOPED_TRACE("G " + std::to_string(group) + (det ? " deterministic" : " atomic"));
        auto [gq, gk, gv] = run_bwd(in, c.scale, out, lse, grad_out, group, det);
        // bf16 P, dS and O in the products: errors of a few bf16 ulps of the largest entry.
        expect_close(gq, ref.grad_q, 2e-2, "grad_q");
        expect_close(gk, ref.grad_key, 2e-2, "grad_key");
        expect_close(gv, ref.grad_value, 2e-2, "grad_value");
        expect_close(gk, cpu.key, 2e-2, "grad_key vs CPU op");
        expect_close(gv, cpu.value, 2e-2, "grad_value vs CPU op");
        expect_close(gq, cpu.q, 2e-2, "grad_q vs CPU op");
      }
    }
  }
}

TEST_F(SparseAttnCudaTest, DeterministicBackwardIsBitIdenticalAcrossRuns) {
  const Case c{300, 4000, 128, 576, 512, 512, 0.0417};
  const Inputs in = make_inputs(rng_, c, false);
  const auto grad_out = torch::randn({c.n, c.heads, c.dv}).to(torch::kBFloat16).to(torch::kFloat);
  auto [out, lse] = run_fwd(in, c.scale, 1);
  for (int64_t group : {1, 4}) {
    auto [gq0, gk0, gv0] = run_bwd(in, c.scale, out, lse, grad_out, group, true);
    for (int run = 0; run < 3; ++run) {
      auto [gq, gk, gv] = run_bwd(in, c.scale, out, lse, grad_out, group, true);
      EXPECT_TRUE(torch::equal(gq, gq0)) << "grad_q differs, run " << run;
      EXPECT_TRUE(torch::equal(gk, gk0)) << "grad_key differs, run " << run;
      EXPECT_TRUE(torch::equal(gv, gv0)) << "grad_value differs, run " << run;
    }
  }
}

TEST_F(SparseAttnCudaTest, TorchOpAutogradOnCudaMatchesTheCpuOp) {
  const Case c{40, 400, 8, 64, 64, 32, 0.125};
  const Inputs in = make_inputs(rng_, c, false);
  const auto weights = torch::randn({c.n, c.heads, c.dv}).to(torch::kBFloat16).to(torch::kFloat);
  auto grads = [&](const torch::Device& device) {
    auto q = in.q.to(device).requires_grad_(true), key = in.key.to(device).requires_grad_(true);
    auto value = in.value.to(device).requires_grad_(true);
    const auto attn = ops::sparse_attn(q, key, value, in.indices.to(device), c.scale);
    (attn.out * weights.to(device)).sum().backward();
    return std::vector<torch::Tensor>{attn.out.cpu(), attn.lse.cpu(), q.grad().cpu(),
                                      key.grad().cpu(), value.grad().cpu()};
  };
  const auto gpu = grads(torch::kCUDA), cpu = grads(torch::kCPU);
  const char* names[] = {"out", "lse", "grad_q", "grad_key", "grad_value"};
  for (int i = 0; i < 5; ++i) expect_close(gpu[i], cpu[i], i == 1 ? 1e-5 : 2e-2, names[i]);
}

// Absorbed MLA: the value is a view of each key row's first d_v columns. The forward then gathers
// each row once (value == key in the kernel: the warp-specialized forward); results match the
// float64 reference and a separate copy of the values (up to summation order), and the gradient
// reaches the key through the view. Odd and even counts of 64-key blocks, every supported shape.
TEST_F(SparseAttnCudaTest, ValuesInsideKeysMatchSeparateValues) {
  const Case cases[] = {
      {37, 1500, 128, 576, 512, 200, 0.0417},  // 4 blocks: two pairs
      {21, 900, 128, 576, 512, 130, 0.0417},   // 3 blocks: the last pair's second block empty
      // Scores of standard deviation 24 and 21: rows' references move after their first block
      // (a later block's maximum exceeds theirs by more than 8 log2 units), some rows of a warp
      // moving while others do not.
      {37, 1500, 128, 576, 512, 256, 1.0},
      // More items (query, head block) than a GPU has SMs: the persistent forward's blocks take
      // several in turn, each item's Q and first blocks loading while the previous one ends.
      {300, 2000, 128, 576, 512, 130, 0.0417},
      {29, 700, 64, 192, 128, 200, 1.5},
      {29, 700, 64, 192, 128, 100, 0.07},
      {19, 600, 64, 128, 128, 72, 0.09},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("d_qk " + std::to_string(c.dqk) + " topk " + std::to_string(c.topk));
    Inputs in = make_inputs(rng_, c, /*allow_empty_rows=*/true);
    in.value = in.key.narrow(1, 0, c.dv).contiguous();
    const auto weights = torch::randn({c.n, c.heads, c.dv}).to(torch::kBFloat16).to(torch::kFloat);
    const auto q = in.q.to(torch::kCUDA, torch::kBFloat16);
    auto run = [&](bool inside) {
      auto key = in.key.to(torch::kCUDA, torch::kBFloat16).requires_grad_(true);
      auto value = inside ? key.narrow(1, 0, c.dv)
                          : key.detach().narrow(1, 0, c.dv).contiguous().requires_grad_(true);
      const auto attn = ops::sparse_attn(q, key, value, in.indices.cuda(), c.scale);
      (attn.out.to(torch::kFloat) * weights.cuda()).sum().backward();
      auto grad_key = key.grad().to(torch::kFloat).cpu();
      if (!inside) grad_key.narrow(1, 0, c.dv).add_(value.grad().to(torch::kFloat).cpu());
      return std::vector<torch::Tensor>{attn.out.to(torch::kFloat).cpu(), attn.lse.cpu(), grad_key};
    };
    const auto inside = run(true), apart = run(false);
    const Reference ref = reference(in, c.scale, {});
    expect_close(inside[0], ref.out, 1e-2, "out vs float64");
    expect_close(inside[1], ref.lse, 1e-5, "lse vs float64");
    expect_close(inside[0], apart[0], 1e-2, "out vs separate values");
    expect_close(inside[1], apart[1], 1e-5, "lse vs separate values");
    // fp32 atomics: any order. At the peaked scales the bf16 dS = scale * P * (dP - D) of the two
    // backwards differ by more (1.1 % of the largest gradient measured at scale 1.5).
    expect_close(inside[2], apart[2], c.scale >= 1.0 ? 2e-2 : 1e-2, "grad_key");
  }
}

// The latent op (kv both keys and values): its backward forms kv's whole gradient in one kernel
// for whole 64-head tiles with d_qk >= 192 (partial last tiles, -1 slots, empty rows; H a multiple
// of 128: the query's head blocks in pairs exchanging partials, where the shape allows), else it
// takes the separate values' kernels and adds the value gradient (H = 8: G > 1; d_qk = 128; the
// deterministic mode, bit-identical across runs). Against the float64 reference, where kv's
// gradient is the key gradient plus the value gradient in the first d_v columns.
TEST_F(SparseAttnCudaTest, LatentBackwardMatchesFloat64Reference) {
  const Case cases[] = {
      {37, 1500, 128, 576, 512, 200, 0.0417},  // one kernel: 4 tiles, the last partial
      {21, 900, 128, 576, 512, 130, 0.0417},   // one kernel: 3 tiles
      {29, 700, 64, 192, 128, 100, 0.07},      // one kernel, the small latent shape
      {17, 500, 256, 576, 512, 150, 0.0417},   // one kernel: two pairs of head blocks a query
      {11, 300, 128, 192, 128, 70, 0.07},      // one kernel, H = 128, chunks not pairable
      {19, 600, 64, 128, 128, 72, 0.09},       // d_qk = 128: separate values' kernels
      {23, 300, 8, 192, 128, 40, 0.07},        // H = 8 (G = 8): separate values' kernels
  };
  auto& context = at::globalContext();
  for (const Case& c : cases) {
    for (const bool deterministic : {false, true}) {
      SCOPED_TRACE("d_qk " + std::to_string(c.dqk) + " H " + std::to_string(c.heads) +
                   (deterministic ? " deterministic" : " atomic"));
      Inputs in = make_inputs(rng_, c, /*allow_empty_rows=*/true);
      in.value = in.key.narrow(1, 0, c.dv).contiguous();
      const auto grad_out =
          torch::randn({c.n, c.heads, c.dv}).to(torch::kBFloat16).to(torch::kFloat);
      const Reference ref = reference(in, c.scale, grad_out);
      auto want_kv = ref.grad_key.clone();
      want_kv.narrow(1, 0, c.dv).add_(ref.grad_value);
      const auto q = in.q.to(torch::kCUDA, torch::kBFloat16);
      const auto kv = in.key.to(torch::kCUDA, torch::kBFloat16);
      const auto attn = ops::sparse_attn_latent(q, kv, in.indices.cuda(), c.scale, c.dv);
      expect_close(attn.out.to(torch::kFloat).cpu(), ref.out, 1e-2, "out");
      const bool was = context.deterministicAlgorithms();
      context.setDeterministicAlgorithms(deterministic, false);
      auto backward = [&] {
        return ops::sparse_attn_latent_backward(grad_out.to(torch::kCUDA, torch::kBFloat16), q, kv,
                                                in.indices.cuda(), c.scale, c.dv, attn.out,
                                                attn.lse);
      };
      const auto grads = backward();
      const auto again = deterministic ? backward() : grads;
      context.setDeterministicAlgorithms(was, false);
      expect_close(grads.q.to(torch::kFloat).cpu(), ref.grad_q, 2e-2, "grad_q");
      expect_close(grads.kv.to(torch::kFloat).cpu(), want_kv, 2e-2, "grad_kv");
      if (deterministic) {
        EXPECT_TRUE(torch::equal(grads.q, again.q) && torch::equal(grads.kv, again.kv))
            << "deterministic latent backward differs between runs";
      }
      // The indexer's target as the backward's by-product (the latent kernel's mass, else
      // selected_attention_mass after the backward), against the float64 mass.
      context.setDeterministicAlgorithms(deterministic, false);
      const auto with_target = ops::sparse_attn_latent_backward_target(
          grad_out.to(torch::kCUDA, torch::kBFloat16), q, kv, in.indices.cuda(), c.scale, c.dv,
          attn.out, attn.lse);
      context.setDeterministicAlgorithms(was, false);
      expect_close(with_target.q.to(torch::kFloat).cpu(), ref.grad_q, 2e-2, "grad_q with target");
      expect_close(with_target.kv.to(torch::kFloat).cpu(), want_kv, 2e-2, "grad_kv with target");
      const auto want_target = ops::selected_attention_mass(
          in.q.to(torch::kDouble), in.key.to(torch::kDouble), in.indices, ref.lse, c.scale);
      expect_close(with_target.target.cpu(), want_target, 2e-3, "target");
    }
  }
}

TEST_F(SparseAttnCudaTest, RejectsUnsupportedShapesAndGroups) {
  const auto q = torch::randn({4, 2, 96}, torch::kCUDA), key = torch::randn({8, 96}, torch::kCUDA);
  const auto idx = torch::zeros({4, 2}, torch::TensorOptions(torch::kCUDA).dtype(torch::kInt));
  try {
    ops::sparse_attn(q, key, key, idx, 1.0);
    FAIL() << "d_qk = 96 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("(d_qk, d_v)"), std::string::npos) << e.what();
  }
  const Case c{8, 64, 2, 64, 64, 4, 1.0};
  const Inputs in = make_inputs(rng_, c, false);
  try {
    run_fwd(in, 1.0, 3);
    FAIL() << "group 3 accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("group must be"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyscale::test
