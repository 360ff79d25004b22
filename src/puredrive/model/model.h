// Model: the step API every caller (generate, the speculative generator, the server) uses. One forward step
// runs R rows of one sequence through the model on a backend and returns device views of the logits and
// of the final-norm hidden states (the MTP head's input). Architecture files implement it; create_model()
// picks one from config.arch (model_types: see supported_model_types() in model/model_config.h).
//
// A step is row-exact (docs/DESIGN.md §4.1): row r of an R-row step is bitwise the result of a one-row step
// at the same position, so decode and verify share one code path; a prefill step (ForwardOptions::prefill)
// may take faster kernels.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "puredrive/backend/backend.h"
#include "puredrive/model/model_config.h"
#include "puredrive/model/model_weights.h"
#include "puredrive/model/sequence_state.h"

namespace pd {

struct ModelOptions {
  int max_rows = 64;  // the largest R of one step (prefill chunk); workspaces are sized for it
  // The most rows a step may request all logits for (LogitRows::kAll; verify steps): the logits workspaces
  // hold this many rows of V floats, so long prefill chunks need not. 0: max_rows.
  int max_logit_rows = 0;
  // Draft-side approximations of the MTP head (docs/DESIGN.md §4.8): they change the drafts, never the
  // verified output. mtp_draft_vocab N > 0: the head's lm_head covers token ids [0, N) only (in byte-level
  // BPE vocabularies the low ids are the early, frequent merges) and its logits are -inf above them, so a
  // draft step reads N rows of the output matrix instead of V. mtp_window W > 0: the head attends only the
  // last W positions.
  int mtp_draft_vocab = 0;
  int mtp_window = 0;
};

// Which rows of a step get logits. Prefill usually needs only the last row; verify needs all.
enum class LogitRows { kAll, kLast, kNone };

// Debug hook: called with a stable name ("L3.out", "final_hidden", "mtp.L0.out") and the device tensor
// [R, H] after each block. Used by golden tests to compare every layer.
using TapFn = std::function<void(std::string_view name, const Tensor& t)>;

struct ForwardOptions {
  LogitRows logits = LogitRows::kAll;
  TapFn tap = nullptr;  // optional
  // A chunk of a prompt's prefill, never rolled back: the backend's prefill kernels run the products, the MoE
  // and attention whatever R (backend.h MatmulArgs::prefill), and the GDN layers take the chunked form
  // (spec §5.7) with chunks aligned to absolute positions and no per-row snapshots, so a prompt split at
  // multiples of 64 gives the bits of one piece (docs/DESIGN.md §4.6). The rows are then not bitwise those of
  // one-row steps (§4.1 lets prefill differ), so every prefill of a prompt, speculative or not, must set it
  // alike.
  bool prefill = false;
  // Token ids already on the device (I32 [1, >= R - device_tokens_from], contiguous): rows
  // [device_tokens_from, R) read theirs from here, and `tokens` holds placeholders for them. Drafts drawn on
  // the device reach the verify step and the MTP head's next draft step without a round trip to the host.
  Tensor device_tokens = {};
  int device_tokens_from = 0;
};

// Views into the model's workspace. forward()'s outputs stay valid until the next forward(); mtp_forward()'s
// until the next mtp_forward() (so the main hidden can feed the MTP head, and an MTP output the next draft).
struct StepOutput {
  Tensor logits;  // F32 [R, V] (kAll), [1, V] (kLast: the last row), empty (kNone)
  Tensor hidden;  // F32 [R, H]: final-norm hidden (forward) or post-mtp.norm hidden (mtp_forward)
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelConfig& config() const = 0;
  virtual Backend& backend() const = 0;
  virtual CacheSpec cache_spec() const = 0;
  virtual int max_rows() const = 0;
  virtual bool has_mtp() const = 0;

  Expected<SequenceState> new_state(const StateOptions& options) const {
    return SequenceState::create(backend(), cache_spec(), options);
  }

  // Runs tokens[0..R) at positions[0..R), which must be state.length() + r (1 <= R <= max_rows(), within the
  // state's capacity). Commits the rows: state.length() grows by R; when R > 1 and the state keeps
  // snapshots for R rows, state.rewind() can return to any row of this step.
  virtual Expected<StepOutput> forward(SequenceState& state, std::span<const int32_t> tokens,
                                       std::span<const int32_t> positions,
                                       const ForwardOptions& options = {}) = 0;

  // The MTP head (spec §8) over R rows: row r takes token tokens[r] (the token after the hidden's position),
  // hidden[r] (the main model's final-norm hidden, or for chained drafts the previous MTP output) and RoPE
  // position positions[r] (the hidden's position). Positions must be contiguous and start at or before
  // state.mtp_length(); the MTP KV entries at those positions are (over)written. hidden may alias a
  // previous StepOutput's hidden.
  virtual Expected<StepOutput> mtp_forward(SequenceState& state, std::span<const int32_t> tokens,
                                           std::span<const int32_t> positions, const Tensor& hidden,
                                           const ForwardOptions& options = {}) = 0;
};

// Binds the weights to the backend and builds the model named by config.model_type. The weights are bound
// for this config, with their shapes checked (load_checkpoint() in model/loader.h, or a synthetic model
// built from the config); they (and the mapped files they point into) must outlive the model.
Expected<std::unique_ptr<Model>> create_model(const ModelConfig& config, const ModelWeights& weights,
                                              Backend& backend, const ModelOptions& options = {});

}  // namespace pd
