// The codec of one round's averages as a job names it (compression: auto's rungs,
// diloco/round/codec_plan.hpp; the round's plan, ReduceRequest::codec and StreamRequest::codec;
// a codec trace), and the sparse code's parameters of a job's topk settings. No LibTorch here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "diloco/job/config.hpp"
#include "runtime/collective/sparse.hpp"

namespace loco::diloco {

struct CodecChoice {
  collective::Codec dense = collective::Codec::fp32;  // when topk_k is 0
  std::uint32_t topk_k = 0;                           // > 0: topk, k entries per chunk
  bool sparse() const { return topk_k > 0; }
  std::string name() const;  // "fp32", "int8", "topk:64"
  friend bool operator==(const CodecChoice&, const CodecChoice&) = default;
};

// "fp32" | "fp16" | "bf16" | "int8" | "topk:K" (1 <= K <= 65536); nullopt for anything else
// (at most 16 characters are looked at: the name comes from the network and from files).
std::optional<CodecChoice> parse_choice(std::string_view name);

// The sparse code's parameters of `topk`'s chunk and bits, with k entries a chunk (0: topk.k;
// at most the chunk).
collective::sparse::Params sparse_params(const TopkConfig& topk, std::uint32_t k = 0);

}  // namespace loco::diloco
