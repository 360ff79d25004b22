#include "puredrive/checkpoint/tensor_names.h"

#include <cctype>
#include <cstring>
#include <string_view>

namespace pd {
namespace {

// First match wins, so the longer MTP spellings come before their parents.
constexpr NamePrefix kPrefixRules[] = {
    {"model.visual.", nullptr},
    {"model.vision_tower.", nullptr},
    {"vision_tower.", nullptr},
    {"visual.", nullptr},
    {"model.language_model.mtp.", "mtp."},
    {"language_model.mtp.", "mtp."},
    {"model.mtp.", "mtp."},
    {"mtp.", "mtp."},
    {"model.language_model.", "model."},
    {"language_model.model.", "model."},
    {"language_model.lm_head.", "lm_head."},
    {"model.", "model."},
    {"lm_head.", "lm_head."},
};

}  // namespace

const NamePrefix* match_name_prefix(const std::string& stored) {
  for (const auto& r : kPrefixRules) {
    if (stored.rfind(r.stored, 0) == 0) return &r;
  }
  return nullptr;
}

std::string canonical_tensor_name(const std::string& stored) {
  const NamePrefix* r = match_name_prefix(stored);
  if (r == nullptr) return stored;
  if (r->canonical == nullptr) return {};
  return r->canonical + stored.substr(std::strlen(r->stored));
}

// "layers.10" after "layers.9": digit runs compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string_view da(a.data() + i, ie - i), db(b.data() + j, je - j);
      if (da.size() != db.size()) return da.size() < db.size();
      if (da != db) return da < db;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace pd
