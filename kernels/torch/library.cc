// Schemas of HyScale's torch ops (namespace `hyscale`). Backends register implementations in
// cpu.cc (and cuda/ when built); autograd.cc wires forward ops to their backward ops.
// Every op accepts one sequence ([N, ...]) or a batch ([B, N, ...]) of independent sequences.
#include <torch/library.h>

TORCH_LIBRARY(hyscale, m) {
  m.def(
      "flash_topk(Tensor q, Tensor k, Tensor w, int topk, int q_offset=0, int tokens_per_key=1,"
      " bool fp8=False) -> (Tensor indices, Tensor scores)");
  // Rows (the last dim) of x to fp8 e4m3 bits (uint8) and one fp32 scale a row, as kernels/fp8.h
  // defines them: the inputs of flash_topk's fp8 scoring.
  m.def("quantize_e4m3(Tensor x) -> (Tensor values, Tensor scales)");
  m.def(
      "index_score_gather(Tensor q, Tensor k, Tensor w, Tensor indices, int q_offset=0,"
      " int tokens_per_key=1) -> Tensor");
  // Scores of rows [row_begin, row_begin + rows) against every key, as an fp32 table (-inf where
  // not visible): the score-table baseline of DESIGN.md section 4 (b), for benchmarks. CUDA only.
  m.def(
      "index_score_table(Tensor q, Tensor k, Tensor w, int row_begin, int rows, int q_offset=0,"
      " int tokens_per_key=1) -> Tensor");
  m.def(
      "index_score_backward(Tensor grad_scores, Tensor q, Tensor k, Tensor w, Tensor indices,"
      " int q_offset=0, int tokens_per_key=1) -> (Tensor grad_q, Tensor grad_k, Tensor grad_w)");
  m.def(
      "sparse_attn(Tensor q, Tensor key, Tensor value, Tensor indices, float scale, int group=0)"
      " -> (Tensor out, Tensor lse)");
  m.def(
      "sparse_attn_backward(Tensor grad_out, Tensor q, Tensor key, Tensor value, Tensor indices,"
      " float scale, Tensor out, Tensor lse, int group=0) -> (Tensor grad_q, Tensor grad_key,"
      " Tensor grad_value)");
  // `group`: the query-group size G of the CUDA kernels (1, 2, 4, 8, 16), 0 for the kernels'
  // default (kernels/cuda/sparse_attn_cuda.h); the CPU reference checks it and computes the same.
  // Absorbed MLA: one tensor kv [.., M, d_qk] is both the keys and, in its first dim_v columns, the
  // values; the backward returns kv's whole gradient (both roles added).
  m.def(
      "sparse_attn_latent(Tensor q, Tensor kv, Tensor indices, float scale, int dim_v,"
      " int group=0) -> (Tensor out, Tensor lse)");
  m.def(
      "sparse_attn_latent_backward(Tensor grad_out, Tensor q, Tensor kv, Tensor indices,"
      " float scale, int dim_v, Tensor out, Tensor lse, int group=0)"
      " -> (Tensor grad_q, Tensor grad_kv)");
  // CUDA only: sparse_attn / its backward with an explicit query-group size G (1, 2, 4, 8, 16)
  // and, for the backward, the accumulation mode; for tests and benchmarks (no autograd).
  m.def(
      "sparse_attn_grouped(Tensor q, Tensor key, Tensor value, Tensor indices, float scale,"
      " int group) -> (Tensor out, Tensor lse)");
  m.def(
      "sparse_attn_backward_grouped(Tensor grad_out, Tensor q, Tensor key, Tensor value,"
      " Tensor indices, float scale, Tensor out, Tensor lse, int group, bool deterministic)"
      " -> (Tensor grad_q, Tensor grad_key, Tensor grad_value)");
  // sparse_attn_latent_backward and, as its by-product, selected_attention_mass's target (the
  // probabilities the backward recomputes, summed over heads, L1-normalised per row).
  m.def(
      "sparse_attn_latent_backward_target(Tensor grad_out, Tensor q, Tensor kv, Tensor indices,"
      " float scale, int dim_v, Tensor out, Tensor lse, int group=0)"
      " -> (Tensor grad_q, Tensor grad_kv, Tensor target)");
  m.def(
      "selected_attention_mass(Tensor q, Tensor key, Tensor indices, Tensor lse, float scale)"
      " -> Tensor");
  // The indexer's KL loss on a selection whose target the attention's backward forms, as two
  // autograd nodes (ops.h): indexer_loss returns two slots, which sparse_attn_indexer_loss
  // (latent when value is None) consumes; its backward returns the target and the loss's
  // gradient as theirs, and indexer_loss's backward turns them into the loss (written into
  // loss_rows) and the gradients of q_I, k_I and w.
  m.def(
      "indexer_loss(Tensor q_I, Tensor k_I, Tensor w, Tensor indices, Tensor score_lse,"
      " Tensor loss_rows) -> (Tensor target_slot, Tensor loss_slot)");
  m.def(
      "sparse_attn_indexer_loss(Tensor q, Tensor key, Tensor? value, Tensor indices,"
      " Tensor target_slot, Tensor loss_slot, float scale, int dim_v, int group=0)"
      " -> (Tensor out, Tensor lse, Tensor loss)");
  m.def("indexer_kl(Tensor score, Tensor target) -> Tensor");
  m.def("indexer_kl_backward(Tensor grad_loss, Tensor score, Tensor target) -> Tensor");
  // The indexer's KL on its selection and the backward of its scores in one op, for a backward
  // that has the target and not the scores (kernels/indexer_kl.h): the index scores s at the
  // slots of `indices` (-1 or a key of k) are formed again, the loss [B?, N] is
  // sum_i target_i (log target_i - s_i + score_lse) over the valid slots, and the gradients of
  // sum(grad_loss * loss) w.r.t. q, k and w are returned. score_lse [B?, N] is each row's
  // log sum_i exp(s_i), as the forward had it (the same scores give the same value). Not
  // differentiable.
  m.def(
      "indexer_loss_backward(Tensor target, Tensor score_lse, Tensor grad_loss, Tensor q,"
      " Tensor k, Tensor w, Tensor indices)"
      " -> (Tensor loss, Tensor grad_q, Tensor grad_k, Tensor grad_w)");
  // The dense warm-up stage's indexer loss over every visible key (kernels/dense_indexer_kl.h):
  // per-row loss [N] and the gradients of sum(loss) w.r.t. q_I, k_I and w; q and key are the frozen
  // main attention's, lse [N, H] its log-sum-exps where already known (computed otherwise). Not
  // differentiable: the caller scales and backpropagates the gradients.
  m.def(
      "dense_indexer_kl(Tensor q, Tensor key, Tensor q_I, Tensor k_I, Tensor w, float scale,"
      " int q_offset=0, int tokens_per_key=1, Tensor? lse=None)"
      " -> (Tensor loss, Tensor grad_q_I, Tensor grad_k_I, Tensor grad_w)");
  // The rows a dense_indexer_kl call on q_I's device (q_I [.., H_I, d_I]) is best a whole multiple
  // of: its query-major kernel's rows a wave on a GPU, 1 on the CPU.
  m.def("dense_indexer_kl_row_multiple(Tensor q_I) -> int");
}
