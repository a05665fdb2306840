// The hyscale torch ops: gradients against central finite differences in double, autograd
// wiring, and argument errors that name the op and the argument.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <random>

#include "kernels/torch/checks.h"
#include "kernels/torch/ops.h"
#include "tests/kernels/e4m3_decode.h"
#include "tests/kernels/op_errors.h"

namespace hyscale {
namespace {

// Checks d(loss)/d(input) from autograd against central differences of `loss` (a scalar
// function of the inputs) for every element of every input that requires grad.
void expect_gradients_match(const std::function<torch::Tensor(std::vector<torch::Tensor>&)>& loss,
                            std::vector<torch::Tensor> inputs, double tol = 1e-6) {
  for (auto& x : inputs) x = x.detach().requires_grad_(true);
  loss(inputs).backward();
  const double h = 1e-6;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto analytic = inputs[i].grad().contiguous();
    auto values = inputs[i].detach().clone();
    auto flat = values.view(-1);
    for (int64_t e = 0; e < flat.numel(); ++e) {
      const double saved = flat[e].item<double>();
      std::vector<torch::Tensor> probe(inputs.begin(), inputs.end());
      for (auto& p : probe) p = p.detach();
      flat[e] = saved + h;
      probe[i] = values.clone();
      const double up = loss(probe).item<double>();
      flat[e] = saved - h;
      probe[i] = values.clone();
      const double down = loss(probe).item<double>();
      flat[e] = saved;
      const double numeric = (up - down) / (2 * h);
      const double got = analytic.view(-1)[e].item<double>();
      ASSERT_NEAR(got, numeric, tol * std::max(1.0, std::abs(numeric)))
          << "input " << i << " element " << e;
    }
  }
}

torch::Tensor randn(std::vector<int64_t> sizes) {
  return torch::randn(sizes, torch::kDouble);
}

class TorchOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto seed = std::random_device{}();
    torch::manual_seed(seed);
    RecordProperty("seed", static_cast<int>(seed));
  }
};

TEST_F(TorchOpsTest, IndexScoresGradientMatchesFiniteDifferences) {
  const int64_t n = 7, heads = 3, dim = 5, topk = 4;
  const auto q = randn({n, heads, dim}), k = randn({n, dim}), w = randn({n, heads});
  // Select once, then hold the selection fixed: scores are smooth in q, k, w away from ReLU kinks.
  const auto indices = ops::flash_topk(q, k, w, topk).indices;
  const auto weights = randn({n, topk});
  const auto valid = indices.ge(0);
  expect_gradients_match(
      [&](std::vector<torch::Tensor>& in) {
        const auto s = ops::index_score_gather(in[0], in[1], in[2], indices);
        return (s.masked_fill(valid.logical_not(), 0) * weights).sum();
      },
      {q, k, w});
  expect_gradients_match(
      [&](std::vector<torch::Tensor>& in) {
        const auto s = ops::flash_topk(in[0], in[1], in[2], topk).scores;
        return (s.masked_fill(valid.logical_not(), 0) * weights).sum();
      },
      {q, k, w});
}

// fp8 scoring selects exactly what bf16-path scoring selects on the dequantized inputs, with the
// query rows' scales in the weights; its gradient is the unquantized scores' (straight-through).
TEST_F(TorchOpsTest, Fp8SelectionIsTheSelectionOfTheDequantizedInputs) {
  const int64_t n = 40, heads = 4, dim = 16, topk = 6;
  const auto q = torch::randn({n, heads, dim}), k = torch::randn({n, dim}) * 3,
             w = torch::randn({n, heads});
  const auto qq = ops::quantize_e4m3(q), kq = ops::quantize_e4m3(k);
  ASSERT_EQ(qq.values.scalar_type(), torch::kByte);
  ASSERT_EQ(qq.scales.sizes(), (std::vector<int64_t>{n, heads}));
  const auto fp8 = ops::flash_topk(q, k, w, topk, 0, 1, true);
  const auto again = ops::flash_topk(q, k, w, topk, 0, 1, true);
  EXPECT_TRUE(torch::equal(fp8.indices, again.indices));
  // Every selected score is a score of the quantized problem: recompute it from the codes.
  const auto q8 = test::decode_e4m3(qq.values), k8 = test::decode_e4m3(kq.values);
  const auto dots = torch::einsum("nhd,md->nhm", {q8, k8}).clamp_min(0);
  const auto table = ((w * qq.scales).to(torch::kDouble).unsqueeze(-1) * dots).sum(1) *
                     kq.scales.to(torch::kDouble).unsqueeze(0);
  const auto causal = torch::ones({n, n}, torch::kBool).tril();
  const auto expected = torch::topk(table.masked_fill(causal.logical_not(), -INFINITY), topk);
  // Compared as the reference scores of the chosen keys, so that ties may go either way.
  for (int64_t row = topk; row < n; ++row) {  // rows with at least topk visible keys
    const auto chosen = table[row].index_select(0, fp8.indices[row].to(torch::kLong));
    const auto got = std::get<0>(chosen.sort(0, /*descending=*/true));
    EXPECT_TRUE(torch::allclose(got, std::get<0>(expected)[row], 1e-5, 1e-6)) << "row " << row;
  }
  // (The selection is in key order, torch::topk's in score order.)
  const auto fp8_scores = std::get<0>(fp8.scores.slice(0, topk).sort(1, /*descending=*/true));
  EXPECT_TRUE(torch::allclose(fp8_scores.to(torch::kDouble), std::get<0>(expected).slice(0, topk),
                              1e-5, 1e-5));
  // Straight-through: the gradient of the fp8 scores is that of the bf16 formula.
  const auto qd = q.to(torch::kDouble).requires_grad_(true);
  ops::flash_topk(qd, k.to(torch::kDouble), w.to(torch::kDouble), topk, 0, 1, true)
      .scores.masked_fill(fp8.indices.lt(0), 0)
      .sum()
      .backward();
  const auto reference =
      ops::index_score_gather(qd, k.to(torch::kDouble), w.to(torch::kDouble), fp8.indices);
  const auto grad =
      torch::autograd::grad({reference.masked_fill(fp8.indices.lt(0), 0).sum()}, {qd})[0];
  EXPECT_TRUE(torch::allclose(qd.grad(), grad));
}

TEST_F(TorchOpsTest, SparseAttentionGradientMatchesFiniteDifferences) {
  const int64_t batch = 2, n = 6, heads = 2, dqk = 4, dv = 3, topk = 3;
  const auto q = randn({batch, n, heads, dqk}), key = randn({batch, n, dqk});
  const auto value = randn({batch, n, dv});
  // Causal selections with a -1 slot in early rows.
  auto indices = torch::full({batch, n, topk}, -1, torch::kInt);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < std::min<int64_t>(topk, t + 1); ++i) indices[b][t][i] = t - i;
    }
  }
  const auto weights = randn({batch, n, heads, dv});
  expect_gradients_match(
      [&](std::vector<torch::Tensor>& in) {
        return (ops::sparse_attn(in[0], in[1], in[2], indices, 0.5).out * weights).sum();
      },
      {q, key, value});
}

// The latent op is sparse_attn with the values a view of kv's first dim_v columns: the same
// outputs, and kv's gradient is the sum of both roles' (checked against finite differences).
TEST_F(TorchOpsTest, LatentAttentionIsAttentionWithTheValuesInsideTheKeys) {
  const int64_t batch = 2, n = 5, heads = 2, dqk = 5, dv = 3, topk = 3;
  const auto q = randn({batch, n, heads, dqk}), kv = randn({batch, n, dqk});
  auto indices = torch::full({batch, n, topk}, -1, torch::kInt);
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < std::min<int64_t>(topk, t + 1); ++i) indices[b][t][i] = t - i;
    }
  }
  const auto weights = randn({batch, n, heads, dv});
  const auto latent = ops::sparse_attn_latent(q, kv, indices, 0.5, dv);
  const auto apart = ops::sparse_attn(q, kv, kv.narrow(-1, 0, dv), indices, 0.5);
  EXPECT_TRUE(torch::allclose(latent.out, apart.out));
  EXPECT_TRUE(torch::allclose(latent.lse, apart.lse));
  expect_gradients_match(
      [&](std::vector<torch::Tensor>& in) {
        return (ops::sparse_attn_latent(in[0], in[1], indices, 0.5, dv).out * weights).sum();
      },
      {q, kv});
}

TEST_F(TorchOpsTest, IndexerKlGradientMatchesFiniteDifferences) {
  const int64_t rows = 5, topk = 4;
  auto target = torch::rand({rows, topk}, torch::kDouble);
  target = target / target.sum(-1, true);
  const auto weights = randn({rows});
  expect_gradients_match(
      [&](std::vector<torch::Tensor>& in) {
        return (ops::indexer_kl(in[0], target) * weights).sum();
      },
      {randn({rows, topk})});
}

TEST_F(TorchOpsTest, SparseAttentionWithAllKeysEqualsDenseAttention) {
  const int64_t n = 9, heads = 3, d = 8;
  const auto q = randn({n, heads, d}), key = randn({n, d}), value = randn({n, d});
  auto indices = torch::full({n, n}, -1, torch::kInt);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s <= t; ++s) indices[t][s] = s;
  }
  const auto attn = ops::sparse_attn(q, key, value, indices, 0.25);
  const auto logits = torch::einsum("thd,sd->hts", {q, key}) * 0.25;
  const auto mask = torch::ones({n, n}, torch::kBool).tril().logical_not();
  const auto dense = torch::einsum(
      "hts,sv->thv", {torch::softmax(logits.masked_fill(mask, -INFINITY), -1), value});
  EXPECT_TRUE(torch::allclose(attn.out, dense, 1e-10, 1e-12));
  EXPECT_TRUE(torch::allclose(
      attn.lse, torch::logsumexp(logits.masked_fill(mask, -INFINITY), -1).t(), 1e-10, 1e-12));
}

TEST_F(TorchOpsTest, SelectedAttentionMassIsTheHeadSummedProbabilityAtTheSelection) {
  const int64_t n = 6, heads = 2, d = 4, topk = 3;
  const auto q = randn({n, heads, d}), key = randn({n, d}), value = randn({n, d});
  const auto indices =
      ops::flash_topk(randn({n, 2, d}), randn({n, d}), randn({n, 2}), topk).indices;
  const auto attn = ops::sparse_attn(q, key, value, indices, 0.5);
  const auto mass = ops::selected_attention_mass(q, key, indices, attn.lse, 0.5);
  for (int64_t t = 0; t < n; ++t) {
    double total = 0;
    for (int64_t i = 0; i < topk; ++i) {
      const int s = indices[t][i].item<int>();
      double expected = 0;
      if (s >= 0) {
        for (int64_t h = 0; h < heads; ++h) {
          const double logit = (q[t][h] * key[s]).sum().item<double>() * 0.5;
          expected += std::exp(logit - attn.lse[t][h].item<double>());
        }
      }
      expected /= heads;  // every head's probabilities over the selection sum to 1
      EXPECT_NEAR(mass[t][i].item<double>(), expected, 1e-12);
      total += mass[t][i].item<double>();
    }
    EXPECT_NEAR(total, 1.0, 1e-12);
  }
}

// indexer_loss_backward is the KL of the scores formed again, then the scores' backward: the same
// as index_score_gather, indexer_kl(_backward) and index_score_backward one after the other, with
// the normalizer given instead of computed (a batch of two; -1 slots, a row without any).
TEST_F(TorchOpsTest, IndexerLossBackwardIsTheKlOfTheScoresThenTheirBackward) {
  const int64_t batch = 2, n = 9, heads = 3, dim = 5, topk = 4;
  const auto q = randn({batch, n, heads, dim}), k = randn({batch, n, dim});
  const auto w = randn({batch, n, heads});
  auto indices = torch::randint(0, n, {batch, n, topk}, torch::kInt);
  indices.masked_fill_(torch::rand({batch, n, topk}).lt(0.25), -1);
  indices[1][4].fill_(-1);
  const auto valid = indices.ge(0);
  auto target = torch::rand({batch, n, topk}, torch::kDouble).masked_fill(valid.logical_not(), 0);
  target = target / target.sum(-1, true).clamp_min(1e-300);
  const auto grad_loss = randn({batch, n});
  // Every row sees every key for the reference ops (q_offset n): their visibility check is not
  // this op's.
  const auto scores = ops::index_score_gather(q, k, w, indices, n);
  const auto want_loss = ops::indexer_kl(scores, target);
  const auto want = ops::index_score_backward(ops::indexer_kl_backward(grad_loss, scores, target),
                                              q, k, w, indices, n);
  const auto got =
      ops::indexer_loss_backward(target, scores.logsumexp(-1), grad_loss, q, k, w, indices);
  EXPECT_TRUE(torch::allclose(got.loss, want_loss, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(got.q, want.q, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(got.k, want.k, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(got.w, want.w, 1e-12, 1e-12));
  EXPECT_EQ(got.loss[1][4].item<double>(), 0);
  EXPECT_EQ(got.w[1][4].abs().sum().item<double>(), 0);
}

// The indexer loss whose target the attention's backward forms (indexer_loss and
// sparse_attn_indexer_loss):
// the forward's loss is a handle of zeros; the backward writes each row's KL(target ||
// softmax(scores)) and gives q_I, k_I and w the gradient that the scores' own autograd
// (index_score_gather, selected_attention_mass, indexer_kl) gives, and the attention's inputs that
// of sparse_attn; for the latent too (the values inside the keys).
TEST_F(TorchOpsTest, TheIndexerLossTakesItsTargetFromTheAttentionBackward) {
  const int64_t n = 8, heads = 2, d = 4, heads_i = 3, dim_i = 5, topk = 3, dim_v = 3;
  const double scale = 0.5;
  const auto q = randn({n, heads, d}), key = randn({n, d}), separate = randn({n, d});
  const auto q_i = randn({n, heads_i, dim_i}), k_i = randn({n, dim_i}), w = randn({n, heads_i});
  const auto indices = ops::flash_topk(q_i, k_i, w, topk).indices;
  const auto loss_weights = randn({n});
  const auto leaves = [](std::vector<torch::Tensor> ts) {
    for (auto& t : ts) t = t.detach().requires_grad_(true);
    return ts;
  };
  for (const bool latent : {false, true}) {
    SCOPED_TRACE(latent ? "latent" : "separate values");
    const auto out_weights = randn({n, heads, latent ? dim_v : d});
    auto fused = leaves({q, key, separate, q_i, k_i, w});
    const auto score_lse = ops::index_score_gather(q_i, k_i, w, indices).logsumexp(-1);
    auto loss_rows = torch::zeros({n}, torch::kDouble);
    const auto slots =
        ops::indexer_loss(fused[3], fused[4], fused[5], indices, score_lse, loss_rows);
    const auto attn =
        ops::sparse_attn_indexer_loss(fused[0], fused[1], latent ? torch::Tensor() : fused[2],
                                      indices, slots, scale, latent ? dim_v : 0);
    EXPECT_EQ(attn.loss.abs().sum().item<double>(), 0);
    const auto& out = attn.out;
    ((out * out_weights).sum() + (attn.loss * loss_weights).sum()).backward();

    auto plain = leaves({q, key, separate, q_i, k_i, w});
    const auto reference = latent
                               ? ops::sparse_attn_latent(plain[0], plain[1], indices, scale, dim_v)
                               : ops::sparse_attn(plain[0], plain[1], plain[2], indices, scale);
    const auto target = ops::selected_attention_mass(q, key, indices, reference.lse, scale);
    const auto kl =
        ops::indexer_kl(ops::index_score_gather(plain[3], plain[4], plain[5], indices), target);
    ((reference.out * out_weights).sum() + (kl * loss_weights).sum()).backward();

    EXPECT_TRUE(torch::allclose(out, reference.out, 1e-12, 1e-12));
    EXPECT_TRUE(torch::allclose(loss_rows, kl, 1e-12, 1e-12));
    for (size_t i = 0; i < fused.size(); ++i) {
      if (latent && i == 2) continue;  // the values are the keys'
      EXPECT_TRUE(torch::allclose(fused[i].grad(), plain[i].grad(), 1e-10, 1e-12)) << "input " << i;
    }
  }
}

// The absorbed-MLA layout the CUDA forward reads values from: only a view of the first d_v
// columns of contiguous bf16 keys, with the keys' rows and batch.
TEST_F(TorchOpsTest, ValueInsideKeyRecognisesOnlyKeyPrefixViews) {
  const auto key = torch::randn({2, 10, 576}).to(torch::kBFloat16);
  EXPECT_TRUE(torch_ops::value_inside_key(key, key.narrow(-1, 0, 512)));
  EXPECT_TRUE(torch_ops::value_inside_key(key[1], key[1].narrow(-1, 0, 512)));
  EXPECT_FALSE(torch_ops::value_inside_key(key, key.narrow(-1, 0, 512).contiguous()));
  EXPECT_FALSE(torch_ops::value_inside_key(key, key.narrow(-1, 64, 512)));
  EXPECT_FALSE(torch_ops::value_inside_key(key, key.narrow(1, 0, 9).narrow(-1, 0, 512)));
  EXPECT_FALSE(torch_ops::value_inside_key(key[0], key[1].narrow(-1, 0, 512)));
  const auto fp32 = key.to(torch::kFloat);
  EXPECT_FALSE(torch_ops::value_inside_key(fp32, fp32.narrow(-1, 0, 512)));
  const auto strided = torch::randn({10, 1152}).to(torch::kBFloat16).narrow(1, 0, 576);
  EXPECT_FALSE(torch_ops::value_inside_key(strided, strided.narrow(1, 0, 512)));
}

TEST_F(TorchOpsTest, BadArgumentsNameTheOpAndTheArgument) {
  const auto q = torch::randn({4, 2, 8}), k = torch::randn({4, 8}), w = torch::randn({4, 2});
  test::expect_op_error(
      [&] {
        ops::flash_topk(q, torch::randn({4, 7}), w, 2);
      },
      "hyscale::flash_topk: k must be");
  test::expect_op_error(
      [&] {
        ops::flash_topk(q, k, torch::randn({4, 3}), 2);
      },
      "hyscale::flash_topk: w must be");
  test::expect_op_error([&] { ops::flash_topk(q, k, w, 0); }, "topk must be > 0");
  test::expect_op_error([&] { ops::flash_topk(q, k, w, 2, -1); }, "q_offset must be >= 0");
  test::expect_op_error(
      [&] {
        ops::quantize_e4m3(torch::zeros({4, 0}));
      },
      "hyscale::quantize_e4m3: x must be [..., d] with d > 0");
  test::expect_op_error(
      [&] {
        ops::quantize_e4m3(torch::zeros({4, 2}, torch::kInt));
      },
      "hyscale::quantize_e4m3: x must be floating");
  test::expect_op_error(
      [&] {
        ops::index_score_gather(q, k, w, torch::zeros({4, 2}, torch::kLong));
      },
      "indices must be int32");
  test::expect_op_error(
      [&] {
        ops::sparse_attn(q, k, torch::randn({4, 8}), torch::full({4, 2}, 9, torch::kInt), 1.0);
      },
      "indices must be -1 or in [0, 4)");
  test::expect_op_error(
      [&] {
        ops::sparse_attn(q, k, torch::randn({3, 8}), torch::zeros({4, 2}, torch::kInt), 1.0);
      },
      "value must have as many rows as key");
  {
    const auto indices = torch::zeros({4, 2}, torch::kInt), rows = torch::zeros({4});
    const auto target = torch::zeros({4, 2});
    test::expect_op_error(
        [&] {
          ops::indexer_loss_backward(torch::zeros({4, 3}), rows, rows, q, k, w, indices);
        },
        "hyscale::indexer_loss_backward: target must have shape [4, 2]");
    test::expect_op_error(
        [&] { ops::indexer_loss_backward(target, torch::zeros({3}), rows, q, k, w, indices); },
        "hyscale::indexer_loss_backward: score_lse must have shape [4]");
    test::expect_op_error(
        [&] {
          ops::indexer_loss_backward(target, rows, torch::zeros({4}, torch::kInt), q, k, w,
                                     indices);
        },
        "hyscale::indexer_loss_backward: grad_loss must be a floating tensor");
    test::expect_op_error(
        [&] {
          ops::indexer_loss_backward(target, rows, rows, q, torch::randn({4, 7}), w, indices);
        },
        "hyscale::indexer_loss_backward: k_I must be");
    test::expect_op_error(
        [&] {
          ops::indexer_loss_backward(target, rows, rows, q, k, w,
                                     torch::full({4, 2}, 4, torch::kInt));
        },
        "indices must be -1 or in [0, 4)");
  }
  for (const int64_t dim_v : {0, 9}) {
    test::expect_op_error(
        [&] {
          ops::sparse_attn_latent(q, k, torch::zeros({4, 2}, torch::kInt), 1.0, dim_v);
        },
        "hyscale::sparse_attn_latent: dim_v must be in [1, d_qk = 8]");
  }
}

}  // namespace
}  // namespace hyscale
