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
  std::uint32_t topk_bits = 0;                        // topk's bits a level; 0: the job's
  // topk: through the error feedback (e ← β·e + Δ, e's code sent); false: Δ's own code, the
  // buffer left as it is (as a dense round leaves it).
  bool feedback = true;
  bool sparse() const { return topk_k > 0; }
  // "fp32", "int8", "topk:64", "topk:410q4" (4 bits), "topk:410q4-noef" (no error feedback)
  std::string name() const;
  friend bool operator==(const CodecChoice&, const CodecChoice&) = default;
};

// "fp32" | "fp16" | "bf16" | "int8" | "topk:K[qB][-noef]" (1 <= K <= 65536, B bits a level in
// [1, 8], without qB the job's; -noef: no error feedback); nullopt for anything else (at most
// 24 characters are looked at: the name comes from the network and from files).
std::optional<CodecChoice> parse_choice(std::string_view name);

// The sparse code's parameters of `topk`'s chunk under `c`: its k entries a chunk (0: topk.k; at
// most the chunk) and its bits (0: topk.bits).
collective::sparse::Params sparse_params(const TopkConfig& topk, const CodecChoice& c = {});

}  // namespace loco::diloco
