#include "puredrive/decode/speculative_harness.h"

#include <utility>

namespace pd {

DrafterFn chained_drafter(DistributionFn draft, AcceptRule rule, uint64_t seed) {
  return [draft = std::move(draft), rule, seed](std::span<const int32_t> context, int k, Rng& rng,
                                                DraftProposal* out) -> Status {
    std::vector<int32_t> ctx(context.begin(), context.end());
    out->tokens.clear();
    out->dists.resize(k);
    for (int j = 0; j < k; ++j) {
      PD_TRY(draft(ctx, &out->dists[j]));
      const int32_t d = draw_token(rule, out->dists[j], rng, seed, static_cast<int64_t>(ctx.size()));
      out->tokens.push_back(d);
      ctx.push_back(d);
    }
    return Status::ok();
  };
}

Expected<std::vector<int32_t>> generate_plain(const DistributionFn& target, AcceptRule rule, uint64_t seed,
                                              std::span<const int32_t> prompt, int num_tokens, Rng& rng) {
  std::vector<int32_t> ctx(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  TokenDistribution dist;
  for (int i = 0; i < num_tokens; ++i) {
    PD_TRY(target(ctx, &dist));
    const int32_t t = draw_token(rule, dist, rng, seed, static_cast<int64_t>(ctx.size()));
    out.push_back(t);
    ctx.push_back(t);
  }
  return out;
}

Expected<std::vector<int32_t>> generate_speculative(const SpeculativeLoop& loop,
                                                    std::span<const int32_t> prompt, int num_tokens, Rng& rng,
                                                    AcceptStats* stats) {
  const int k = loop.num_draft;
  std::vector<int32_t> ctx(prompt.begin(), prompt.end());
  std::vector<int32_t> out;
  DraftProposal block;
  std::vector<TokenDistribution> target(k + 1);
  while (static_cast<int>(out.size()) < num_tokens) {
    PD_TRY(loop.drafter(ctx, k, rng, &block));
    if (static_cast<int>(block.tokens.size()) != k) {
      return make_error(ErrorCode::kInternal, "drafter proposed {} tokens, {} requested", block.tokens.size(),
                        k);
    }
    // The verify pass: p_j after ctx + d_1..d_j.
    const size_t base = ctx.size();
    for (int j = 0; j <= k; ++j) {
      PD_TRY(loop.target(ctx, &target[j]));
      if (j < k) ctx.push_back(block.tokens[j]);
    }
    ctx.resize(base);
    const VerifyInput in{.drafts = block.tokens,
                         .target = target,
                         .draft = block.dists,
                         .seed = loop.seed,
                         .first_position = static_cast<int64_t>(base)};
    const AcceptResult r = loop.verifier.accept(in, rng);
    if (stats != nullptr) stats->record(k, r.num_accepted);
    for (int j = 0; j < r.num_accepted; ++j) ctx.push_back(block.tokens[j]);
    ctx.push_back(r.next_token);
    out.insert(out.end(), ctx.begin() + static_cast<std::ptrdiff_t>(base), ctx.end());
  }
  return out;
}

Expected<std::vector<double>> exact_two_token_joint(const DistributionFn& target,
                                                    std::span<const int32_t> prompt) {
  std::vector<int32_t> ctx(prompt.begin(), prompt.end());
  TokenDistribution first;
  PD_TRY(target(ctx, &first));
  const auto vocab = static_cast<size_t>(first.vocab_size());
  std::vector<double> joint(vocab * vocab, 0.0);
  TokenDistribution second;
  ctx.push_back(0);
  for (int32_t t1 : first.kept) {
    ctx.back() = t1;
    PD_TRY(target(ctx, &second));
    if (static_cast<size_t>(second.vocab_size()) != vocab) {
      return make_error(ErrorCode::kInternal, "target vocab changed from {} to {}", vocab,
                        second.vocab_size());
    }
    for (int32_t t2 : second.kept) joint[t1 * vocab + t2] = first.prob(t1) * second.prob(t2);
  }
  return joint;
}

}  // namespace pd
