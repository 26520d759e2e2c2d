// Token-tree verification (stochastic and greedy) over trees given as parent and token arrays.

#include <string>
#include <vector>

#include "common.hpp"

namespace specula::python {

namespace {

/// Builds the batch's token trees from parents and tokens: (B, n) arrays (every tree has n
/// nodes), or 1-D arrays of all nodes with node_offsets (B + 1 entries), or 1-D arrays of one
/// tree. Each tree is validated by token_tree's constructor (a copy of parents and tokens).
std::vector<token_tree> make_trees(const array& parents, const array& tokens,
                                   const array& node_offsets) {
  if (parents.ndim() != tokens.ndim() || element_count(parents) != element_count(tokens))
    value_error("specula: parents and tokens must have the same shape");
  if (parents.ndim() != 1 && parents.ndim() != 2)
    value_error("specula: parents must have shape (B, n) or (N,)");
  std::vector<token_t> token_copy;
  const auto tok = token_array(tokens, "tokens", token_copy);
  require_contiguous(parents, "parents");
  const index_t total = element_count(parents);
  std::vector<index_t> par(static_cast<std::size_t>(total));
  if (has_dtype<std::int64_t>(parents)) {
    const auto* p = static_cast<const std::int64_t*>(parents.data());
    par.assign(p, p + total);
  } else if (has_dtype<std::int32_t>(parents)) {
    const auto* p = static_cast<const std::int32_t*>(parents.data());
    par.assign(p, p + total);
  } else {
    type_error("specula: parents must have dtype int32 or int64 (got " +
               dtype_name(parents.dtype()) + ")");
  }
  std::vector<index_t> offsets;
  if (parents.ndim() == 2) {
    if (node_offsets.is_valid())
      value_error("specula: node_offsets is only for 1-D parents and tokens");
    const auto batch = static_cast<index_t>(parents.shape(0));
    const auto n = static_cast<index_t>(parents.shape(1));
    for (index_t b = 0; b <= batch; ++b) offsets.push_back(b * n);
  } else if (node_offsets.is_valid()) {
    const index_view o = index_array(node_offsets, "node_offsets");
    if (o.size < 1 || o[0] != 0 || o[o.size - 1] != total)
      value_error("specula: node_offsets must start at 0 and end at the number of nodes (" +
                  std::to_string(total) + ")");
    for (index_t b = 0; b < o.size; ++b) {
      if (b > 0 && o[b] <= o[b - 1])
        value_error("specula: node_offsets must be increasing (every tree has its root)");
      offsets.push_back(o[b]);
    }
  } else {
    offsets = {0, total};
  }
  std::vector<token_tree> trees;
  trees.reserve(offsets.size() - 1);
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b) {
    const auto lo = static_cast<std::size_t>(offsets[b]);
    const auto hi = static_cast<std::size_t>(offsets[b + 1]);
    std::vector<index_t> p(par.begin() + static_cast<std::ptrdiff_t>(lo),
                           par.begin() + static_cast<std::ptrdiff_t>(hi));
    std::vector<token_t> t(tok.data + lo, tok.data + hi);
    // The root's token is not verified: -1 (unset) is accepted there.
    trees.emplace_back(std::move(p), std::move(t));
  }
  return trees;
}

sibling_sampling parse_sampling(const std::string& s) {
  if (s == "without_replacement") return sibling_sampling::without_replacement;
  if (s == "with_replacement") return sibling_sampling::with_replacement;
  value_error("specula: sampling must be 'without_replacement' or 'with_replacement' (got '" + s +
              "')");
}

void tree(nb::handle parents_arg, nb::handle tokens_arg, nb::handle node_offsets_arg,
          nb::handle target_probs_arg, nb::handle draft_probs_arg, nb::handle seeds,
          nb::handle request_ids, nb::handle steps, nb::handle output_tokens_arg,
          nb::handle num_accepted_arg, nb::handle accepted_nodes_arg, nb::handle flags_arg,
          nb::handle rule_arg, const std::string& sampling, double sum_tolerance,
          double residual_floor, const std::string& check, int threads, bool greedy) {
  clear_pointers();
  const char* target_name = greedy ? "target_logits" : "target_probs";
  const array parents = import_array(parents_arg, "parents");
  const array tokens = import_array(tokens_arg, "tokens");
  const array offsets = import_optional(node_offsets_arg, "node_offsets");
  const array target = import_array(target_probs_arg, target_name);
  const array draft = import_optional(draft_probs_arg, "draft_probs");
  const array output = import_array(output_tokens_arg, "output_tokens", true);
  const array counts = import_array(num_accepted_arg, "num_accepted", true);
  const array nodes = import_optional(accepted_nodes_arg, "accepted_nodes", true);
  const array flags = import_optional(flags_arg, "flags", true);
  const std::vector<token_tree> trees = make_trees(parents, tokens, offsets);
  const auto batch = static_cast<index_t>(trees.size());
  if (target.ndim() >= 1) {  // one target row per node, named before the seeds are read
    index_t rows = 1;
    for (std::size_t d = 0; d + 1 < target.ndim(); ++d)
      rows *= static_cast<index_t>(target.shape(d));
    index_t nodes_total = 0;
    for (const token_tree& t : trees) nodes_total += t.size();
    if (rows != nodes_total)
      value_error(std::string("specula: ") + target_name + " has " + std::to_string(rows) +
                  " rows, but the trees have " + std::to_string(nodes_total) +
                  " nodes: one row per node");
  }
  const auto rng =
      greedy ? row_view<const request_rng>{} : make_rng(seeds, request_ids, steps, batch);
  const tree_batch_output out{int32_output(output, "output_tokens"),
                              int32_output(counts, "num_accepted"),
                              int64_output(nodes, "accepted_nodes"), flags_output(flags, "flags")};
  tree_options options;
  options.sum_tolerance = sum_tolerance;
  options.residual_floor = residual_floor;
  options.sampling = parse_sampling(sampling);
  options.check = parse_check(check);
  with_prob_type(target, target_name, [&](auto element) {
    using T = decltype(element);
    const auto target_rows = prob_rows<T>(target, target_name, wide_rows_buffer(0));
    batch_view<const T> draft_rows{};
    if (draft.is_valid()) {
      if (draft.dtype() != target.dtype())
        type_error("specula: draft_probs must have the dtype of target_probs (" +
                   dtype_name(target.dtype()) + "; got " + dtype_name(draft.dtype()) + ")");
      draft_rows = prob_rows<T>(draft, "draft_probs", wide_rows_buffer(1));
    }
    const tree_batch_input<T> in{
        target_rows.cols, {trees.data(), batch}, target_rows, draft_rows, rng};
    record_pointer("target_probs", in.target_probs.data);
    record_pointer("draft_probs", in.draft_probs.data);
    record_pointer("output_tokens", out.output_tokens.data);
    if (greedy) {
      nb::gil_scoped_release release;
      with_policy(threads, [&](const auto& policy) { verify_tree_greedy(policy, in, out); });
      return;
    }
    visit_scalar_rule(rule_arg, in.trees.size, "tree verification", [&](const auto& rule) {
      nb::gil_scoped_release release;
      with_policy(threads,
                  [&](const auto& policy) { verify_tree(policy, in, out, options, rule); });
    });
  });
}

}  // namespace

void register_tree(nb::module_& m) {
  m.def("_tree", &tree, nb::arg("parents"), nb::arg("tokens"), nb::arg("node_offsets").none(),
        nb::arg("target_probs"), nb::arg("draft_probs").none(), nb::arg("seeds").none(),
        nb::arg("request_ids").none(), nb::arg("steps").none(), nb::arg("output_tokens"),
        nb::arg("num_accepted"), nb::arg("accepted_nodes").none(), nb::arg("flags").none(),
        nb::arg("rule").none(), nb::arg("sampling"), nb::arg("sum_tolerance"),
        nb::arg("residual_floor"), nb::arg("check"), nb::arg("threads"), nb::arg("greedy"));
}

}  // namespace specula::python
