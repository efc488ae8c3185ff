#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "diloco/data/data.hpp"
#include "diloco/job/config.hpp"
#include "diloco/job/memory.hpp"
#include "diloco/round/averager.hpp"
#include "diloco/round/fragment_schedule.hpp"
#include "runtime/collective/allreduce.hpp"
#include "tests/diloco/config_util.hpp"
#include "tests/diloco/test_corpus.hpp"

using namespace loco::diloco;
using loco::collective::Codec;

namespace {

const char* kJob = R"(
name: t
seed: 3
model: {layers: 2, width: 32, heads: 2, context: 16, tied_embeddings: true}
data: {dir: /tmp/x, tokenizer: byte, shards: 8, val_fraction: 0.05}
workers: {count: 2}
inner: {steps: 5, batch_size: 4, lr: 0.001, warmup: 2, weight_decay: 0.1, grad_clip: 1.0, grad_accum: 2, betas: [0.9, 0.95]}
outer: {lr: 0.7, momentum: 0.9, nesterov: true}
compression: int8
allreduce: {chunk_kb: 64, peer_timeout_s: 20}
rounds: 3
checkpoint: {every: 1, dir: ck}
eval: {every: 5, batches: 2}
)";

using loco::diloco::testing::error_of;
using loco::diloco::testing::replace;

}  // namespace

// The streaming round's schedule (the one the simulator and InnerWorker both follow): H = 12,
// P = 4 fragments, τ = 1. Round 2 covers step counts (24, 36]; fragment f synchronizes after
// 24 + 3(f + 1) and lands one step later.
TEST(FragmentSchedule, SynchronizesEachFragmentAtItsBoundaryAndLandsTauLater) {
  const FragmentSchedule s(12, 4, 1);
  EXPECT_EQ(s.stride(), 3);
  EXPECT_EQ(s.start(2), 24);
  EXPECT_EQ(s.end(2), 36);
  EXPECT_EQ(s.sync_step(2, 0), 27);
  EXPECT_EQ(s.sync_step(2, 3), 36);
  EXPECT_EQ(s.lands(36), 37);  // the round's last fragment lands in the next round
  EXPECT_EQ(s.syncing_at(2, 30), std::vector<int>{1});
  EXPECT_TRUE(s.syncing_at(2, 31).empty());
  EXPECT_TRUE(s.syncing_at(3, 30).empty());  // another round's boundary
  // From event to event: the next synchronization, a landing before it, or the round's end.
  EXPECT_EQ(s.next_event(2, 24, std::nullopt), 27);
  EXPECT_EQ(s.next_event(2, 24, 25), 25);
  EXPECT_EQ(s.next_event(2, 27, 28), 28);
  EXPECT_EQ(s.next_event(2, 33, std::nullopt), 36);
  EXPECT_EQ(s.next_event(2, 33, 40), 36);
  // H not a multiple of P: the last fragment synchronizes before the round's end (stride 3).
  const FragmentSchedule odd(10, 3, 0);
  EXPECT_EQ(odd.sync_step(0, 2), 9);
  EXPECT_EQ(odd.next_event(0, 9, std::nullopt), 10);
  // Eager: one fragment, at the round's end.
  const FragmentSchedule eager(8, 1, 2);
  EXPECT_EQ(eager.syncing_at(1, 16), std::vector<int>{0});
  EXPECT_EQ(eager.lands(16), 18);
  EXPECT_THROW(FragmentSchedule(4, 5, 0), std::invalid_argument);
  EXPECT_THROW(FragmentSchedule(4, 2, -1), std::invalid_argument);
}

TEST(FragmentSchedule, BoundariesInsideARoundAreTheOnlyPlacesToJoin) {
  const FragmentSchedule s(12, 4, 1);
  EXPECT_EQ(s.fragment_inside(2, 27), 0);
  EXPECT_EQ(s.fragment_inside(2, 33), 2);
  EXPECT_EQ(s.fragment_inside(2, 36), std::nullopt);  // the round's end
  EXPECT_EQ(s.fragment_inside(2, 24), std::nullopt);  // its start
  EXPECT_EQ(s.fragment_inside(2, 28), std::nullopt);  // between two boundaries
  EXPECT_EQ(s.fragment_inside(1, 27), std::nullopt);  // another round
}

TEST(FragmentSchedule, AMidRoundJoinerTakesPartFromTheFirstBoundaryPastTheFurthestMember) {
  // Round 2 of H = 12 with 4 fragments: boundaries at steps 27, 30 and 33 (36 is the end).
  const FragmentSchedule s(12, 4, 1);
  EXPECT_EQ(s.join_step(2, {24, 24, 24}), 27);
  EXPECT_EQ(s.join_step(2, {25, 24, 26}), 27);
  EXPECT_EQ(s.join_step(2, {27, 27, 25}), 30);  // 27 is done by two
  EXPECT_EQ(s.join_step(2, {28, 25, 24}), 30);
  EXPECT_EQ(s.join_step(2, {30, 28, 29}), 33);
  // None left before the round's end: the joiner waits for the round boundary.
  EXPECT_EQ(s.join_step(2, {33, 30, 30}), std::nullopt);
  // A member that cannot say where it is.
  EXPECT_EQ(s.join_step(2, {24, -1, 24}), std::nullopt);
  // τ ≥ H/P: the fragment before the boundary would land after it.
  EXPECT_EQ(FragmentSchedule(12, 4, 3).join_step(2, {24, 24, 24}), std::nullopt);
  EXPECT_EQ(FragmentSchedule(12, 4, 2).join_step(2, {24, 24, 24}), 27);
  // One fragment: its only synchronization is the round's end.
  EXPECT_EQ(FragmentSchedule(12, 1, 0).join_step(2, {24}), std::nullopt);
  EXPECT_EQ(FragmentSchedule(8, 2, 0).join_step(0, {4, 1}), std::nullopt);  // 8 is the end
  EXPECT_EQ(FragmentSchedule(8, 2, 0).join_step(0, {0, 3}), 4);
}

TEST(Config, ParsesEveryField) {
  const auto c = JobConfig::from_yaml(kJob);
  EXPECT_EQ(c.seed, 3u);
  EXPECT_EQ(c.model.d_model, 32);
  EXPECT_EQ(c.data.shards, 8);
  EXPECT_EQ(c.inner.grad_accum, 2);
  EXPECT_DOUBLE_EQ(c.inner.betas[1], 0.95);
  EXPECT_EQ(c.compression, Codec::int8);
  EXPECT_EQ(c.vocab_size(), 256);
  EXPECT_EQ(c.checkpoint.dir, "ck");
  EXPECT_EQ(c.allreduce.chunk_kb, 64);
  EXPECT_DOUBLE_EQ(c.allreduce.peer_timeout_s, 20.0);
  // to_yaml round-trips.
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(again.to_yaml(), c.to_yaml());
}

TEST(Config, RejectsBadValuesNamingTheField) {
  EXPECT_EQ(error_of(replace(kJob, "lr: 0.001", "lr: -1")), "inner.lr: must be > 0, got -1");
  EXPECT_EQ(error_of(replace(kJob, "peer_timeout_s: 20", "peer_timeout_s: 0")),
            "allreduce.peer_timeout_s: must be in [0.1, 3600], got 0");
  EXPECT_EQ(error_of(replace(kJob, "chunk_kb: 64", "chunk_kb: 0")),
            "allreduce.chunk_kb: must be in [1, 65536], got 0");
  EXPECT_NE(error_of(replace(kJob, "chunk_kb: 64", "chunk_kib: 64")).find("allreduce"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(kJob, "compression: int8", "compression: int4")),
            "compression: expected one of fp32|fp16|bf16|int8|topk|auto (or a mapping with kind "
            "and settings: {kind: topk, k: 64}), got 'int4'");
  EXPECT_EQ(error_of(replace(kJob, "tokenizer: byte", "tokenizer: words")),
            "data.tokenizer: expected byte|bpe or the path of a tokenizer.json, got 'words'");
  EXPECT_NE(error_of(replace(kJob, "heads: 2", "heads: 3"))
                .find("model.heads: must be a divisor of model.d_model"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "grad_accum: 2", "grad_accum: 3")).find("inner.grad_accum"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "momentum: 0.9", "momentum: 1.5"))
                .find("outer.momentum: must be in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "layers: 2", "layrs: 2")).find("model.layrs: unknown field"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "steps: 5", "steps: many")).find("inner.steps: cannot read"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "rounds: 3", "rounds: 0")).find("rounds: must be > 0"),
            std::string::npos);
  EXPECT_EQ(error_of(kJob), "");
}

// compression: {kind: topk}: its fields, its round trip through to_yaml, the dense codecs
// still as names or as a kind, and each bad value named.
TEST(Config, TopkCompressionParsesValidatesAndRoundTrips) {
  const std::string topk =
      replace(kJob, "compression: int8",
              "compression: {kind: topk, chunk: 1024, k: 16, bits: 3, error_feedback: 0.9, "
              "outer: nesterov, mean: senders}");
  const auto c = JobConfig::from_yaml(topk);
  EXPECT_TRUE(c.topk.on);
  EXPECT_EQ(c.topk.chunk, 1024);
  EXPECT_EQ(c.topk.k, 16);
  EXPECT_EQ(c.topk.bits, 3);
  EXPECT_DOUBLE_EQ(c.topk.error_feedback, 0.9);
  EXPECT_EQ(c.topk.outer, OuterRule::nesterov);
  EXPECT_EQ(c.topk.mean, SparseMean::senders);
  EXPECT_EQ(c.compression, Codec::fp32);
  EXPECT_DOUBLE_EQ(c.outer_step().momentum, c.outer.momentum);  // nesterov keeps it
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_TRUE(again.topk.on);
  EXPECT_EQ(again.topk.k, 16);
  EXPECT_EQ(again.topk.outer, OuterRule::nesterov);
  EXPECT_EQ(again.topk.mean, SparseMean::senders);
  EXPECT_EQ(again.to_yaml(), c.to_yaml());
  // Defaults: SparseLoCo's, whose error feedback replaces the outer momentum, with the mean over
  // each entry's senders (the job's outer lr carries over: docs/results.md).
  const auto d = JobConfig::from_yaml(replace(kJob, "compression: int8", "compression: {kind: topk}"));
  EXPECT_EQ(d.topk.chunk, 4096);
  EXPECT_EQ(d.topk.k, 64);
  EXPECT_EQ(d.topk.bits, 2);
  EXPECT_DOUBLE_EQ(d.topk.error_feedback, 0.95);
  EXPECT_EQ(d.topk.outer, OuterRule::sparseloco);
  EXPECT_EQ(d.topk.mean, SparseMean::senders);
  EXPECT_EQ(d.outer_step().momentum, 0.0);
  // About 0.031 bytes a value gathered against int8's 2 (K-1)/K: 63 for a large model, a few
  // fewer for this one, whose chunks' headers weigh more.
  EXPECT_GE(d.topk_max_workers(), 50);
  EXPECT_LE(d.topk_max_workers(), 63);
  // A dense codec as a kind, and as a name again after a topk.
  const auto dense = JobConfig::from_yaml(replace(kJob, "compression: int8", "compression: {kind: int8}"));
  EXPECT_FALSE(dense.topk.on);
  EXPECT_EQ(dense.compression, Codec::int8);
  auto bad = [&](const std::string& value) {
    return error_of(replace(kJob, "compression: int8", "compression: " + value));
  };
  EXPECT_NE(bad("{kind: topk, k: 5000}").find("compression.k: must be in [1, compression.chunk = 4096]"),
            std::string::npos) << bad("{kind: topk, k: 5000}");
  EXPECT_NE(bad("{kind: topk, bits: 9}").find("compression.bits: must be in [1, 8]"),
            std::string::npos);
  EXPECT_NE(bad("{kind: topk, chunk: 1}").find("compression.chunk: must be in [2, 65536]"),
            std::string::npos);
  EXPECT_NE(bad("{kind: topk, error_feedback: 1.5}").find("compression.error_feedback"),
            std::string::npos);
  EXPECT_NE(bad("{kind: topk, outer: adam}").find("compression.outer: expected one of sparseloco|nesterov"),
            std::string::npos) << bad("{kind: topk, outer: adam}");
  EXPECT_NE(bad("{kind: topk, mean: median}").find("compression.mean: expected one of members|senders"),
            std::string::npos) << bad("{kind: topk, mean: median}");
  EXPECT_NE(bad("{kind: topk, topk: 3}").find("compression.topk: unknown field"), std::string::npos);
  EXPECT_NE(bad("{kind: int8, k: 3}").find("compression.k: not a field of kind 'int8' (topk: "),
            std::string::npos) << bad("{kind: int8, k: 3}");
  EXPECT_NE(bad("{kind: int4}").find("expected one of fp32|fp16|bf16|int8"), std::string::npos);
  // Rules between fields: more workers than gathering pays for; a time budget.
  EXPECT_NE(error_of(replace(replace(kJob, "compression: int8", "compression: {kind: topk, k: 2048}"),
                             "count: 2", "count: 3"))
                .find("workers.count: 3 workers gathering"),
            std::string::npos);
}

TEST(Config, DeviceAndGpusParseValidateAndRoundTrip) {
  const auto plain = JobConfig::from_yaml(kJob);
  EXPECT_EQ(plain.device, DeviceKind::cpu);  // default: CPU, as before the field existed
  EXPECT_EQ(plain.workers.gpus, 1);
  EXPECT_FALSE(plain.workers.share_gpu);
  EXPECT_FALSE(plain.wants_gpus(true));

  auto c = JobConfig::from_yaml(replace(kJob, "workers: {count: 2}",
                                        "device: cuda\nworkers: {count: 2, gpus: 1, share_gpu: "
                                        "true}"));
  EXPECT_EQ(c.device, DeviceKind::cuda);
  EXPECT_TRUE(c.workers.share_gpu);
  EXPECT_TRUE(c.wants_gpus(false));
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(again.device, DeviceKind::cuda);
  EXPECT_TRUE(again.workers.share_gpu);
  EXPECT_EQ(again.to_yaml(), c.to_yaml());

  const auto a = JobConfig::from_yaml(replace(kJob, "seed: 3", "seed: 3\ndevice: auto"));
  EXPECT_EQ(a.device, DeviceKind::auto_);
  EXPECT_FALSE(a.wants_gpus(false));  // no node offers gpu: the workers ask for none
  EXPECT_TRUE(a.wants_gpus(true));

  EXPECT_EQ(error_of(replace(kJob, "seed: 3", "seed: 3\ndevice: tpu")),
            "device: expected one of auto|cpu|cuda, got 'tpu'");
  EXPECT_EQ(error_of(replace(kJob, "workers: {count: 2}", "workers: {count: 2, gpus: 0}")),
            "workers.gpus: must be >= 1, got 0");
  // Several GPUs per worker, one local rank each; on the CPU, local ranks.
  const auto eight = JobConfig::from_yaml(
      replace(replace(kJob, "workers: {count: 2}", "device: cuda\nworkers: {count: 2, gpus: 8}"),
              "batch_size: 4", "batch_size: 16"));
  EXPECT_EQ(eight.ranks_per_worker(true), 8);
  EXPECT_EQ(eight.ranks_per_worker(false), 1);
  EXPECT_EQ(JobConfig::from_yaml(eight.to_yaml()).workers.gpus, 8);
  const auto two = JobConfig::from_yaml(
      replace(kJob, "workers: {count: 2}", "workers: {count: 2, local_ranks: 2}"));
  EXPECT_EQ(two.ranks_per_worker(false), 2);
  EXPECT_EQ(JobConfig::from_yaml(two.to_yaml()).workers.local_ranks, 2);
  EXPECT_EQ(error_of(replace(kJob, "workers: {count: 2}", "workers: {count: 2, gpus: 65}")),
            "workers.gpus: must be <= 64, got 65");
  EXPECT_EQ(error_of(replace(kJob, "workers: {count: 2}", "workers: {count: 2, local_ranks: -1}")),
            "workers.local_ranks: must be in [0, 64], got -1");
  const auto uneven =
      error_of(replace(kJob, "workers: {count: 2}", "workers: {count: 2, local_ranks: 3}"));
  EXPECT_NE(uneven.find("inner.batch_size: 4 sequences do not split into 3 local ranks"),
            std::string::npos)
      << uneven;
  const auto cuda_gpus =
      error_of(replace(kJob, "workers: {count: 2}", "device: cuda\nworkers: {count: 2, gpus: 8}"));
  EXPECT_NE(cuda_gpus.find("inner.batch_size: 4 sequences do not split into 8 local ranks"),
            std::string::npos)
      << cuda_gpus;
  const auto mismatch = error_of(replace(
      kJob, "workers: {count: 2}", "device: cuda\nworkers: {count: 2, gpus: 2, local_ranks: 4}"));
  EXPECT_NE(mismatch.find("workers.local_ranks: 4 with device: cuda"), std::string::npos)
      << mismatch;
  EXPECT_NE(error_of(replace(kJob, "workers: {count: 2}", "workers: {count: 2, share_gpu: maybe}"))
                .find("workers.share_gpu: cannot read 'maybe' as a boolean"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "workers: {count: 2}", "workers: {count: 2, gpu: 1}"))
                .find("workers.gpu: unknown field"),
            std::string::npos);
}

TEST(Config, DeviceChoiceFollowsTheAssignedGpusAndTorch) {
  // cpu: always the CPU, whatever the node offers.
  EXPECT_FALSE(choose_device(DeviceKind::cpu, {0}, true, 1).cuda);
  // auto on a node without gpu resources (no index assigned) runs on the CPU...
  auto d = choose_device(DeviceKind::auto_, {}, true, 8);
  EXPECT_FALSE(d.cuda);
  EXPECT_NE(d.reason.find("offers no gpu"), std::string::npos) << d.reason;
  // ... and so does auto where this process has no CUDA.
  EXPECT_FALSE(choose_device(DeviceKind::auto_, {1}, false, 0).cuda);
  // With an index and CUDA: that device.
  d = choose_device(DeviceKind::auto_, {3}, true, 4);
  EXPECT_TRUE(d.cuda);
  EXPECT_EQ(d.index, 3);
  EXPECT_EQ(choose_device(DeviceKind::cuda, {1}, true, 2).index, 1);
  // cuda that cannot be met says why, naming the field.
  auto error = [](DeviceKind k, std::vector<int> g, bool avail, int n) -> std::string {
    try {
      choose_device(k, g, avail, n);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error(DeviceKind::cuda, {}, true, 1)
                .find("device: cuda, but the runtime gave this "
                      "worker no GPU"),
            std::string::npos);
  EXPECT_NE(error(DeviceKind::cuda, {0}, false, 0).find("CUDA is not available"),
            std::string::npos);
  EXPECT_NE(error(DeviceKind::auto_, {2}, true, 2).find("sees 2 CUDA device(s)"),
            std::string::npos);
}

TEST(Config, PrecisionAndActivationCheckpointing) {
  const auto plain = JobConfig::from_yaml(kJob);
  EXPECT_EQ(plain.precision, Precision::fp32);
  EXPECT_FALSE(plain.model.activation_checkpointing);
  const auto c = JobConfig::from_yaml(
      replace(replace(kJob, "compression: int8", "compression: int8\nprecision: bf16"),
              "tied_embeddings: true", "tied_embeddings: true, activation_checkpointing: true"));
  EXPECT_EQ(c.precision, Precision::bf16);
  EXPECT_TRUE(c.model.activation_checkpointing);
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(again.precision, Precision::bf16);
  EXPECT_TRUE(again.model.activation_checkpointing);
  EXPECT_EQ(error_of(replace(kJob, "compression: int8", "compression: int8\nprecision: fp16")),
            "precision: expected one of fp32|bf16, got 'fp16'");
  EXPECT_NE(error_of(replace(kJob, "tied_embeddings: true",
                             "tied_embeddings: true, activation_checkpointing: sometimes"))
                .find("model.activation_checkpointing: cannot read"),
            std::string::npos);
}

// `loco submit --set`: each PATH=VALUE lands where a job file would have it, typed as YAML reads
// it, and the result goes through the same validation as the file.
TEST(Config, SetOverridesAnyFieldAndIsValidatedAsTheFileIs) {
  const auto c = JobConfig::from_yaml(with_overrides(
      kJob, {"inner.lr=3e-4", "workers.count=8", "inner.betas=[0.8, 0.99]", "name=other",
             "checkpoint.keep=2", "sync.mode=streaming", "sync.fragments=2", "inner.steps=10"}));
  EXPECT_DOUBLE_EQ(c.inner.lr, 3e-4);
  EXPECT_EQ(c.workers.count, 8);
  EXPECT_DOUBLE_EQ(c.inner.betas[0], 0.8);
  EXPECT_DOUBLE_EQ(c.inner.betas[1], 0.99);
  EXPECT_EQ(c.name, "other");
  EXPECT_EQ(c.checkpoint.keep, 2);
  EXPECT_EQ(c.sync.mode, SyncMode::streaming);  // a mapping the file did not have
  EXPECT_EQ(c.inner.steps, 10);
  // The fields not set keep the file's values.
  EXPECT_EQ(c.inner.batch_size, 4);
  EXPECT_EQ(c.compression, Codec::int8);
  EXPECT_EQ(c.checkpoint.dir, "ck");
  // The last --set of a field wins.
  EXPECT_EQ(JobConfig::from_yaml(with_overrides(kJob, {"seed=1", "seed=9"})).seed, 9u);

  auto set_error = [](std::vector<std::string> sets) {
    try {
      JobConfig::from_yaml(with_overrides(kJob, sets));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // Validated as the file is: unknown fields, bad values and types are named.
  EXPECT_EQ(set_error({"inner.lr=-1"}), "inner.lr: must be > 0, got -1");
  EXPECT_NE(set_error({"inner.lrr=1"}).find("inner.lrr: unknown field"), std::string::npos);
  EXPECT_NE(set_error({"workers.count=many"}).find("workers.count: cannot read 'many'"),
            std::string::npos);
  EXPECT_EQ(set_error({"checkpoint.keep=-1"}), "checkpoint.keep: must be in [0, 16777216], got -1");
  // And the --set itself.
  EXPECT_EQ(set_error({"inner.lr"}), "--set 'inner.lr': expected PATH=VALUE, e.g. inner.lr=3e-4");
  EXPECT_EQ(set_error({"=3"}), "--set '=3': expected PATH=VALUE, e.g. inner.lr=3e-4");
  EXPECT_EQ(set_error({"inner..lr=3"}),
            "--set 'inner..lr=3': 'inner..lr' is not field names joined by dots");
  EXPECT_EQ(set_error({"in ner.lr=3"}),
            "--set 'in ner.lr=3': 'in ner.lr' is not field names joined by dots");
  EXPECT_EQ(set_error({"rounds.x=1"}), "--set rounds.x: rounds is not a mapping of fields, it is '3'");
  EXPECT_NE(set_error({"inner.lr=[1"}).find("--set inner.lr: '[1' is not a YAML value"),
            std::string::npos);
}

TEST(Config, CheckpointKeepAndResumeRoundTrip) {
  // Bounded disk by default (issue "21 ·", finding 8: `every: 1` without `keep` wrote 2.7 GB
  // in 21,675 files in 4 minutes): the newest 3 round checkpoints, at most 100 GiB a job.
  const auto plain = JobConfig::from_yaml(kJob);
  EXPECT_EQ(plain.checkpoint.keep, 3);
  EXPECT_EQ(plain.checkpoint.quota_gib, 100);
  EXPECT_EQ(plain.checkpoint.resume, "");
  const auto c = JobConfig::from_yaml(replace(
      kJob, "checkpoint: {every: 1, dir: ck}",
      "checkpoint: {every: 1, dir: ck, keep: 5, quota_gib: 0.5, resume: ck/job-1/ckpt-round-2.pt}"));
  EXPECT_EQ(c.checkpoint.keep, 5);
  EXPECT_EQ(c.checkpoint.quota_gib, 0.5);
  EXPECT_EQ(c.checkpoint.resume, "ck/job-1/ckpt-round-2.pt");
  const auto again = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(again.checkpoint.keep, 5);
  EXPECT_EQ(again.checkpoint.quota_gib, 0.5);
  EXPECT_EQ(error_of(replace(kJob, "dir: ck}", "dir: ck, quota_gib: -1}")),
            "checkpoint.quota_gib: must be in [0, 1e+06], got -1");
  EXPECT_EQ(again.checkpoint.resume, "ck/job-1/ckpt-round-2.pt");
  EXPECT_EQ(error_of(replace(kJob, "dir: ck}", "dir: ck, resume: \"a\\x01b\"}")),
            "checkpoint.resume: must not contain control characters, got 'a\\x01b'");
}

TEST(Config, ModelDifferenceNamesTheFirstFieldThatChangesTheParameters) {
  ModelConfig a;
  ModelConfig b = a;
  EXPECT_EQ(model_difference(a, b), "");
  b.activation_checkpointing = !a.activation_checkpointing;  // no parameter changes
  EXPECT_EQ(model_difference(a, b), "");
  b.heads = a.heads * 2;
  EXPECT_EQ(model_difference(a, b), "model.heads (4 against 8)");
}

// model: {torchscript: FILE}: only context and vocab beside it; what describes the file
// round-trips, the path where this process reads it does not; the hash, not the path, tells
// two models apart.
TEST(Config, ATorchScriptModelTakesContextAndVocabAloneAndRecordsItsFile) {
  const std::string ts = "model: {torchscript: lm.pt, context: 16}";
  const std::string job = replace(kJob,
                                  "model: {layers: 2, width: 32, heads: 2, context: 16, "
                                  "tied_embeddings: true}",
                                  ts);
  auto c = JobConfig::from_yaml(job);
  EXPECT_TRUE(c.model.is_torchscript());
  EXPECT_EQ(c.model.parameter_count(c.vocab_size()), 0);  // not yet described
  EXPECT_EQ(c.topk_max_workers(), kMaxWorkers);
  EXPECT_EQ(error_of(replace(job, "context: 16}", "context: 16, layers: 8}")),
            "model.layers: not with model.torchscript (the module is the architecture; of the "
            "model's fields only context and vocab apply)");
  EXPECT_EQ(error_of(replace(job, "context: 16}", "context: 16, activation_checkpointing: true}")),
            "model.activation_checkpointing: not with model.torchscript (the module is the "
            "architecture; of the model's fields only context and vocab apply)");
  EXPECT_NE(error_of(job + "init: hf:pretrained\n")
                .find("init: 'hf:pretrained' is a Hugging Face folder of the built-in model"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(job, "context: 16}", "context: 16, torchscript_hash: abc}")),
            "model.torchscript_hash: must be 16 lowercase hex digits (XXH3-64 of the file), got "
            "'abc'");
  EXPECT_EQ(error_of(replace(kJob, "tied_embeddings: true}",
                             "tied_embeddings: true, torchscript_parameters: 5}")),
            "model.torchscript_hash and model.torchscript_parameters: only with "
            "model.torchscript");
  // Streaming fragments are runs of its tensors, not blocks: more than model.layers pass here.
  EXPECT_EQ(error_of(replace(job, "rounds: 3", "rounds: 3\nsync: {mode: streaming, fragments: 5}")),
            "");
  c.model.torchscript_hash = "0123456789abcdef";
  c.model.torchscript_parameters = 1234;
  c.model.torchscript_file = "/root/of/this/node/lm.pt";
  const auto back = JobConfig::from_yaml(c.to_yaml());
  EXPECT_EQ(back.model.torchscript, "lm.pt");
  EXPECT_EQ(back.model.torchscript_hash, "0123456789abcdef");
  EXPECT_EQ(back.model.torchscript_parameters, 1234);
  EXPECT_EQ(back.model.torchscript_file, "");
  EXPECT_EQ(back.model.parameter_count(back.vocab_size()), 1234);
  EXPECT_EQ(training_flops_per_token(back.model, 1234), 6.0 * 1234);
  ModelConfig moved = back.model;
  moved.torchscript = "elsewhere/lm.pt";
  EXPECT_EQ(model_difference(back.model, moved), "");
  moved.torchscript_hash = "fedcba9876543210";
  EXPECT_EQ(model_difference(back.model, moved),
            "model.torchscript_hash (0123456789abcdef against fedcba9876543210)");
  ModelConfig builtin;
  builtin.context = 16;
  EXPECT_EQ(model_difference(back.model, builtin),
            "model.torchscript_hash (0123456789abcdef against unset)");
}

TEST(Config, TrainingFlopsPerTokenAndThePeaksOfKnownGpus) {
  ModelConfig m;
  m.layers = 12;
  m.d_model = 768;
  m.context = 1024;
  // 6 per parameter, and attention's 12 · layers · width · context.
  EXPECT_DOUBLE_EQ(training_flops_per_token(m, 1000), 6000.0 + 12.0 * 12 * 768 * 1024);
  ::unsetenv("LOCO_PEAK_TFLOPS");
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 80GB HBM3", Precision::bf16), 989.4e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 PCIe", Precision::bf16), 756e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H200", Precision::fp32), 66.9e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA A100-SXM4-80GB", Precision::bf16), 312e12);
  EXPECT_EQ(peak_flops("cpu", Precision::fp32), 0.0);
  EXPECT_EQ(peak_flops("Some Future GPU", Precision::bf16), 0.0);
  ::setenv("LOCO_PEAK_TFLOPS", "2.5", 1);
  EXPECT_DOUBLE_EQ(peak_flops("cpu", Precision::fp32), 2.5e12);
  ::setenv("LOCO_PEAK_TFLOPS", "fast", 1);  // not a number: the table
  EXPECT_EQ(peak_flops("cpu", Precision::fp32), 0.0);
  ::unsetenv("LOCO_PEAK_TFLOPS");
}

TEST(Compression, Int8ErrorIsBoundedByHalfAStepPerChunk) {
  // The collective's int8: min-max per chunk of Options::chunk_bytes / 4 floats, 255 steps.
  const std::size_t chunk = loco::collective::Options{}.chunk_bytes / sizeof(float);
  std::vector<float> x(2 * chunk + 17);
  std::uint64_t s = 1;
  for (auto& v : x) {
    s = splitmix64(s);
    v = static_cast<float>(static_cast<double>(s % 20001) / 10000.0 - 1.0);
  }
  x[5] = 50.f;  // one outlier: only its chunk gets a coarse step
  auto y = x;
  codec_roundtrip(y, Codec::int8);
  for (std::size_t begin = 0; begin < x.size(); begin += chunk) {
    const std::size_t end = std::min(x.size(), begin + chunk);
    const auto [lo, hi] = std::minmax_element(x.begin() + static_cast<std::ptrdiff_t>(begin),
                                              x.begin() + static_cast<std::ptrdiff_t>(end));
    const float step = (*hi - *lo) / 255.f;
    for (std::size_t i = begin; i < end; ++i)
      ASSERT_LE(std::fabs(y[i] - x[i]), step / 2.f * 1.001f + 1e-6f) << i;
  }
  // 1 byte a value and an 8-byte header per chunk; K = 2 sends 2 (K-1)/K = 1
  // vector, cut into 2 parts of 2 chunks each.
  EXPECT_EQ(allreduce_bytes_per_member(x.size(), 2, Codec::int8), x.size() + 4 * 8);
  EXPECT_EQ(allreduce_bytes_per_member(x.size(), 2, Codec::fp32), 4 * x.size());
  EXPECT_EQ(allreduce_bytes_per_member(x.size(), 1, Codec::fp32), 0u);
}

TEST(Compression, HalfPrecisionEdgeCases) {
  std::vector<float> v = {1.0f,
                          1.0f / 3.0f,
                          65504.f,
                          65520.f,
                          std::ldexp(1.f, -24),
                          std::ldexp(1.f, -25),
                          std::ldexp(3.f, -25),
                          -2.5f};
  codec_roundtrip(v, Codec::fp16);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 0.333251953125f);
  EXPECT_EQ(v[2], 65504.f);
  EXPECT_TRUE(std::isinf(v[3]));
  EXPECT_EQ(v[4], std::ldexp(1.f, -24));
  EXPECT_EQ(v[5], 0.f);                   // tie to even
  EXPECT_EQ(v[6], std::ldexp(1.f, -23));  // tie to even
  EXPECT_EQ(v[7], -2.5f);
  std::vector<float> b = {1.0f + std::ldexp(1.f, -8), 1.0f + std::ldexp(3.f, -8)};
  codec_roundtrip(b, Codec::bf16);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], 1.0f + std::ldexp(1.f, -6));  // 1.5 ulp: tie to even
}

TEST(Averager, EveryMemberGetsTheSameMean) {
  LocalAverager avg;
  for (auto c : {Codec::fp32, Codec::fp16, Codec::bf16, Codec::int8}) {
    std::vector<std::vector<float>> bufs(3, std::vector<float>(5000));
    for (std::size_t k = 0; k < 3; ++k)
      for (std::size_t i = 0; i < 5000; ++i)
        bufs[k][i] = static_cast<float>(k + 1) * 0.01f * static_cast<float>(i % 7);
    std::vector<std::span<float>> spans(bufs.begin(), bufs.end());
    const auto stats = avg.average(spans, c);
    EXPECT_EQ(stats.members, 3);
    EXPECT_EQ(stats.bytes_sent, allreduce_bytes_per_member(5000, 3, c));
    for (std::size_t i = 0; i < 5000; ++i) {
      ASSERT_EQ(bufs[1][i], bufs[0][i]);
      ASSERT_EQ(bufs[2][i], bufs[0][i]);
      ASSERT_NEAR(bufs[0][i], 0.02f * static_cast<float>(i % 7), c == Codec::fp32 ? 1e-6 : 0.01);
    }
  }
}

namespace {

// What K members' Communicators compute for `inputs` over inproc (one thread each).
std::vector<std::vector<float>> collective_mean(const std::vector<std::vector<float>>& inputs,
                                                const loco::collective::Options& options) {
  namespace coll = loco::collective;
  static int group_id = 0;
  ++group_id;
  const std::size_t k = inputs.size();
  auto ctx = std::make_shared<zmq::context_t>(1);
  std::vector<std::unique_ptr<coll::Communicator>> comms;
  coll::Group g;
  for (std::size_t r = 0; r < k; ++r) {
    comms.push_back(std::make_unique<coll::Communicator>(
        "inproc://avg-" + std::to_string(group_id) + "-" + std::to_string(r), options, ctx));
    g.members.push_back({"w" + std::to_string(r), comms.back()->endpoint()});
  }
  auto outputs = inputs;
  std::vector<std::exception_ptr> errors(k);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < k; ++r)
    threads.emplace_back([&, r] {
      try {
        coll::Group mine = g;
        mine.rank = static_cast<int>(r);
        mine.round_id = 1;
        comms[r]->allreduce(mine, std::span<float>(outputs[r]));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  return outputs;
}

}  // namespace

// The simulator's averaging gives, bit for bit, what the distributed
// all-reduce gives every member, for every compression: so the simulator's
// int8/fp16/bf16 numbers are those of a distributed run.
TEST(Averager, EqualsTheCollectiveBitForBit) {
  struct Shape {
    std::size_t n;
    std::size_t chunk_bytes;
  };
  // Default chunks (2+ per part at K = 3), then many small chunks with ragged ends.
  const Shape shapes[] = {{3 * 131072 + 4099, loco::collective::Options{}.chunk_bytes},
                          {10007, 1000}};
  for (const Shape& shape : shapes) {
    for (int k : {2, 3, 4, 8}) {
      if (shape.n > 100000 && k != 3) continue;  // the big shape once
      std::vector<std::vector<float>> inputs(static_cast<std::size_t>(k),
                                             std::vector<float>(shape.n));
      std::uint64_t s = static_cast<std::uint64_t>(k) * 1000 + shape.n;
      for (std::size_t r = 0; r < inputs.size(); ++r)
        for (std::size_t i = 0; i < shape.n; ++i) {
          s = splitmix64(s);
          // Pseudo-gradient-like: small, scales that differ by member and by region.
          const double u = static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5;
          inputs[r][i] = static_cast<float>(u * 1e-3 * static_cast<double>(r + 1) *
                                            (i % 5000 < 100 ? 30.0 : 1.0));
        }
      for (auto c : {Codec::fp32, Codec::fp16, Codec::bf16, Codec::int8}) {
        loco::collective::Options opts;
        opts.codec = c;
        opts.chunk_bytes = shape.chunk_bytes;
        const auto expected = collective_mean(inputs, opts);
        auto local = inputs;
        std::vector<std::span<float>> spans(local.begin(), local.end());
        LocalAverager avg(opts);
        avg.average(spans, c);
        for (std::size_t r = 0; r < local.size(); ++r)
          ASSERT_EQ(std::memcmp(local[r].data(), expected[r].data(), shape.n * sizeof(float)), 0)
              << to_string(c) << " K=" << k << " n=" << shape.n << " member " << r;
        // The codec matters: without it the mean would differ (fp32 aside).
        if (c != Codec::fp32) {
          auto plain = inputs;
          std::vector<std::span<float>> ps(plain.begin(), plain.end());
          LocalAverager(opts).average(ps, Codec::fp32);
          EXPECT_NE(std::memcmp(plain[0].data(), local[0].data(), shape.n * sizeof(float)), 0);
        }
      }
    }
  }
}

TEST(Shards, DeterministicAndConfinedToTheirShards) {
  DataConfig d;
  d.dir = loco::diloco::testing::make_corpus_dir("shards");
  d.shards = 16;
  d.val_fraction = 0.1;
  const auto store = TokenStore::open(d);
  EXPECT_EQ(store.size(),
            std::filesystem::file_size(std::filesystem::path(d.dir) / "corpus" / "a.txt"));
  EXPECT_EQ(store.train_end(), store.size() - store.size() / 10);
  // Shards tile the training split.
  std::size_t covered = 0;
  for (int s = 0; s < 16; ++s) {
    const auto [b, e] = store.shard(s);
    EXPECT_EQ(b, covered);
    covered = e;
  }
  EXPECT_EQ(covered, store.train_end());

  const int ctx = 16, batch = 8;
  const auto mine = round_robin_shards(16, 1, 4);
  EXPECT_EQ(mine, (std::vector<int>{1, 5, 9, 13}));
  ShardSampler a(store, mine, ctx, 7, 1), b(store, mine, ctx, 7, 1), other(store, mine, ctx, 7, 2);
  std::vector<std::int64_t> xa(batch * (ctx + 1)), xb(xa.size()), xo(xa.size());
  std::vector<std::vector<std::int64_t>> history;
  for (int i = 0; i < 5; ++i) {
    a.next(batch, xa);
    b.next(batch, xb);
    other.next(batch, xo);
    EXPECT_EQ(xa, xb);
    EXPECT_NE(xa, xo);
    history.push_back(xa);
  }
  // The position is the whole state: rewinding replays the same batches.
  a.set_position(2);
  a.next(batch, xa);
  EXPECT_EQ(xa, history[2]);

  // Every window lies inside one of the worker's shards: find it in the token file.
  std::vector<std::int64_t> tokens(store.size());
  store.read(0, store.size(), tokens.data());
  ShardSampler c(store, mine, ctx, 7, 1);
  for (int i = 0; i < 20; ++i) {
    c.next(batch, xa);
    for (int w = 0; w < batch; ++w) {
      bool found = false;
      for (int s : mine) {
        const auto [sb, se] = store.shard(s);
        for (std::size_t p = sb; p + ctx + 1 <= se && !found; ++p) {
          bool eq = true;
          for (int j = 0; j <= ctx && eq; ++j) eq = tokens[p + j] == xa[w * (ctx + 1) + j];
          found = eq;
        }
      }
      ASSERT_TRUE(found) << "window " << w << " of batch " << i;
    }
  }

  // Validation windows come from the validation split only and are fixed.
  std::vector<std::int64_t> v1(4 * (ctx + 1)), v2(v1.size());
  validation_windows(store, ctx, 4, v1);
  validation_windows(store, ctx, 4, v2);
  EXPECT_EQ(v1, v2);
  EXPECT_EQ(v1[0], store.at(store.train_end()));
  remove_tree(d.dir);
}

TEST(Tokenizer, BpeTrainsOnTheCorpusAndRoundTrips) {
  DataConfig d;
  d.dir = loco::diloco::testing::make_corpus_dir("bpe", 60000);
  d.tokenizer = TokenizerKind::bpe;
  d.bpe_vocab = 400;
  const auto tok = make_tokenizer(d);
  EXPECT_EQ(tok->vocab_size(), 400);
  const std::string text = "in the beginning god created the heaven.\nand the earth was void.\n";
  const auto ids = tok->encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);  // merges happened
  EXPECT_EQ(tok->decode(ids), text);
  const auto store = TokenStore::open(d);  // tokenizes the corpus once
  EXPECT_GT(store.size(), 1000u);
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_LT(store.at(i), 400u);
  remove_tree(d.dir);
}

// Every job file shipped in examples/ parses and validates.
TEST(Config, ExampleJobFilesAreValid) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(LOCO_SOURCE_DIR "/examples")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    JobConfig cfg = JobConfig::from_yaml_file(e.path().string());
    EXPECT_NO_THROW(cfg.validate());
    EXPECT_GT(cfg.total_rounds(), 0);
    ++n;
  }
  EXPECT_GE(n, 2);
}

// Every size in a job file has a bound, named in the error, so that no value makes a worker
// allocate without limit ("bad_alloc", "negative dimension") or overflow an int.
TEST(Config, EverySizeIsBoundedNamingTheField) {
  EXPECT_EQ(error_of(replace(kJob, "name: t", "threads: 100000000\nname: t")),
            "threads: must be <= 1024, got 100000000");
  EXPECT_EQ(error_of(replace(kJob, "layers: 2", "layers: 1000000")),
            "model.layers: must be <= 1024, got 1000000");
  EXPECT_EQ(error_of(replace(kJob, "width: 32", "width: 1048576")),
            "model.d_model: must be <= 65536, got 1048576");
  EXPECT_EQ(error_of(replace(kJob, "context: 16", "context: 1073741824")),
            "model.context: must be <= 1048576, got 1073741824");
  EXPECT_EQ(error_of(replace(kJob, "heads: 2", "heads: 2048")),
            "model.heads: must be <= 1024, got 2048");
  EXPECT_EQ(error_of(replace(kJob, "shards: 8", "shards: 100000000")),
            "data.shards: must be in [1, 1048576], got 100000000");
  EXPECT_EQ(error_of(replace(kJob, "count: 2", "count: 1000000")),
            "workers.count: must be in [1, 4096], got 1000000");
  EXPECT_EQ(error_of(replace(kJob, "batch_size: 4", "batch_size: 10000000")),
            "inner.batch_size: must be in [1, 65536], got 10000000");
  EXPECT_EQ(error_of(replace(kJob, "steps: 5", "steps: 1000000000")),
            "inner.steps: must be in [1, 16777216], got 1000000000");
  EXPECT_EQ(error_of(replace(kJob, "batches: 2", "batches: 10000000")),
            "eval.batches: must be in [1, 65536], got 10000000");
  EXPECT_EQ(error_of(replace(kJob, "rounds: 3", "rounds: 1000000000")),
            "rounds: must be in [0, 16777216], got 1000000000");
  // A value that does not fit the field's integer is a read error naming it.
  EXPECT_NE(
      error_of(replace(kJob, "layers: 2", "layers: 99999999999")).find("model.layers: cannot read"),
      std::string::npos);
  // Each size within its bound, together too much for a worker: named as well.
  EXPECT_NE(error_of(replace(replace(kJob, "layers: 2", "layers: 1024"), "width: 32, heads: 2",
                             "width: 65536, heads: 2"))
                .find("model: must be at most 2e+10 parameters"),
            std::string::npos);
  EXPECT_NE(error_of(replace(kJob, "context: 16", "context: 1048576"))
                .find("model.context: must be small enough"),
            std::string::npos);
}

// inner.lr: 1e308 is finite, but the inner steps run in fp32 and torch takes the step's
// scalars (lr / (1 - betas[0]), lr x weight_decay) as floats: such a step cannot run at all.
TEST(Config, LearningRatesBeyondFp32AreRefusedNamingTheField) {
  EXPECT_EQ(error_of(replace(kJob, "lr: 0.001", "lr: 1e308")),
            "inner.lr: must be small enough that inner.lr / (1 - inner.betas[0]) and inner.lr x "
            "inner.weight_decay are within fp32's range (3.4e38), in which the inner steps run, "
            "got 1e+308");
  EXPECT_NE(error_of(replace(kJob, "lr: 0.001", "lr: 1e38")).find("inner.lr: must be small"),
            std::string::npos);  // x 10 at the first step's bias correction
  EXPECT_EQ(error_of(replace(kJob, "lr: 0.001", "lr: 1e30")), "");  // runs (and diverges)
  EXPECT_NE(error_of(replace(kJob, "lr: 0.7", "lr: 1e39")).find("outer.lr: must be within fp32"),
            std::string::npos);
}

// The estimate of what one worker holds (diloco/job/memory.hpp), term by term.
TEST(Config, WorkerMemoryGrowsWithTheModelAndTheBatch) {
  const JobConfig c = JobConfig::from_yaml(kJob);
  const double p = double(c.model.parameter_count(c.vocab_size()));
  const MemoryEstimate e = worker_memory(c, false);
  EXPECT_TRUE(e.device.empty());
  EXPECT_DOUBLE_EQ(e.host.at(0).bytes, 4 * p);  // θ_local: fp32
  EXPECT_EQ(e.host.at(0).what, "θ_local");
  EXPECT_DOUBLE_EQ(e.host_bytes(), worker_memory_bytes(c));
  // Every term that grows with the model: 80 bytes a parameter on the CPU with one rank in fp32,
  // 74 with int8 (the collective's buffers: 2 bytes a parameter, and the chunks' headers).
  double model_terms = 0;
  for (const MemoryTerm& t : e.host)
    if (t.what != "activations" && t.what != "logits" && t.what != "the data loader" &&
        t.what != "the process")
      model_terms += t.bytes;
  EXPECT_NEAR(model_terms / p, 74.0, 0.1);
  // Monotone in width, layers and the batch.
  auto bytes = [&](const std::string& from, const std::string& to) {
    return worker_memory_bytes(JobConfig::from_yaml(replace(kJob, from, to)));
  };
  const double base = worker_memory_bytes(c);
  EXPECT_GT(bytes("width: 32", "width: 64"), base);
  EXPECT_GT(bytes("layers: 2", "layers: 4"), base);
  EXPECT_GT(bytes("batch_size: 4", "batch_size: 8"), base);
  EXPECT_GT(bytes("context: 16", "context: 32"), base);
  // Micro-batches hold fewer activations at once.
  EXPECT_LT(bytes("grad_accum: 2", "grad_accum: 4"), base);
  // Recomputing each block keeps less.
  EXPECT_LT(bytes("tied_embeddings: true", "tied_embeddings: true, activation_checkpointing: true"),
            base);
  // On CUDA the rank's terms move to its GPU; the outer state stays on the host. The fused
  // AdamW there keeps no flat gradient buffer (one rank), scratch or decay mask: 12P less.
  const MemoryEstimate g = worker_memory(c, true);
  EXPECT_DOUBLE_EQ(g.device.at(0).bytes, 4 * p);
  EXPECT_DOUBLE_EQ(g.device.at(1).bytes, 4 * p);  // autograd's gradients
  EXPECT_LT(g.host_bytes(), e.host_bytes());
  EXPECT_DOUBLE_EQ(g.host_bytes() + g.device_bytes() + 12 * p, e.host_bytes());
  EXPECT_LT(aggregator_memory_bytes(c), base);
}

// At submission, against the largest node: refused naming the field most responsible, the
// memory needed and the node's; not checked where no node says.
TEST(Config, AWorkerThatNoNodeHoldsIsRefusedNamingTheFieldAndBothFigures) {
  const JobConfig c = JobConfig::from_yaml(kJob);
  EXPECT_NO_THROW(check_fits(c, false, std::nullopt, std::nullopt));
  EXPECT_NO_THROW(check_fits(c, false, 64e9, std::nullopt));
  auto refusal = [](const JobConfig& cfg, bool cuda, std::optional<double> memory,
                    std::optional<double> gpu) -> std::string {
    try {
      check_fits(cfg, cuda, memory, gpu);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  // The probe's model: 24 blocks of width 8192 (19.3e9 parameters) and GPT-2's vocabulary,
  // under the 2e10 bound, needs over a TiB.
  const JobConfig big = JobConfig::from_yaml(
      replace(replace(replace(kJob, "layers: 2", "layers: 24"), "width: 32", "width: 8192"),
              "tied_embeddings: true", "tied_embeddings: true, vocab: 50257"));
  EXPECT_GT(double(big.model.parameter_count(big.vocab_size())), 1.9e10);
  const std::string e = refusal(big, false, 64.0 * (1 << 30), std::nullopt);
  EXPECT_EQ(e.rfind("model.layers (24) and model.width (8192): 19.7 B parameters", 0), 0u) << e;
  EXPECT_NE(e.find(" B parameters: needs about 1"), std::string::npos) << e;
  EXPECT_NE(e.find(" GiB per worker; the largest node has 64.0 GiB"), std::string::npos) << e;
  // The batch: named when the activations outweigh the model.
  const JobConfig wide = JobConfig::from_yaml(
      replace(replace(kJob, "batch_size: 4", "batch_size: 4096"), "context: 16", "context: 4096"));
  EXPECT_EQ(refusal(wide, false, 1e9, std::nullopt).rfind("inner.batch_size (4096 sequences", 0),
            0u);
  // The embeddings: named when they are most of the model.
  const JobConfig vocab = JobConfig::from_yaml(
      replace(kJob, "tied_embeddings: true", "tied_embeddings: true, vocab: 2000000"));
  EXPECT_EQ(refusal(vocab, false, 1e9, std::nullopt).rfind("model.vocab (2000000)", 0), 0u);
  // On CUDA the GPU's memory too (bytes per GPU), when nodes say it.
  EXPECT_NE(refusal(big, true, 4e12, 80e9).find(" per GPU; the largest GPU has 74.5 GiB"),
            std::string::npos);
  EXPECT_EQ(refusal(big, true, 4e12, std::nullopt), "");
  // Without a cluster: a worker beyond any node is refused by validation itself.
  // (65,536 sequences' logits over 2^21 tokens: 26 TiB.)
  const std::string beyond =
      error_of(replace(replace(replace(kJob, "batch_size: 4", "batch_size: 65536"), "grad_accum: 2",
                               "grad_accum: 1"),
                       "tied_embeddings: true", "tied_embeddings: true, vocab: 2097152"));
  EXPECT_EQ(beyond.rfind("inner.batch_size (65536 sequences of 16 tokens", 0), 0u) << beyond;
  EXPECT_NE(beyond.find("GiB per worker, more than any node holds (at most 16384.0 GiB"),
            std::string::npos)
      << beyond;
}

TEST(Config, NonFiniteNumbersAreRefusedNamingTheField) {
  EXPECT_EQ(error_of(replace(kJob, "lr: 0.001", "lr: .inf")),
            "inner.lr: must be a finite number, got inf");
  EXPECT_EQ(error_of(replace(kJob, "lr: 0.001", "lr: .nan")),
            "inner.lr: must be a finite number, got nan");
  EXPECT_EQ(error_of(replace(kJob, "lr: 0.7", "lr: .inf")),
            "outer.lr: must be a finite number, got inf");
  EXPECT_EQ(error_of(replace(kJob, "weight_decay: 0.1", "weight_decay: .inf")),
            "inner.weight_decay: must be a finite number, got inf");
  EXPECT_EQ(error_of(replace(kJob, "grad_clip: 1.0", "grad_clip: .inf")),
            "inner.grad_clip: must be a finite number, got inf");
  EXPECT_EQ(error_of(replace(kJob, "workers: {count: 2}", "workers: {count: 2, wait_s: .inf}")),
            "workers.wait_s: must be a finite number, got inf");
}

TEST(Config, NamesPathsAndTheFileItselfAreBounded) {
  EXPECT_NE(error_of(replace(kJob, "name: t", "name: " + std::string(10 << 20, 'a')))
                .find("bytes, more than the limit of 1048576 bytes"),
            std::string::npos);
  EXPECT_EQ(error_of(replace(kJob, "name: t", "name: " + std::string(300, 'a'))),
            "name: must be at most 256 bytes, got 300 bytes");
  EXPECT_EQ(error_of(replace(kJob, "name: t", "name: \"a\\x01b\"")),
            "name: must not contain control characters, got 'a\\x01b'");
  EXPECT_EQ(error_of(replace(kJob, "dir: ck", "dir: " + std::string(5000, 'd'))),
            "checkpoint.dir: must be at most 4096 bytes, got 5000 bytes");
  // yaml-cpp recurses on flow nesting: refused before it parses.
  EXPECT_EQ(error_of(std::string(100000, '[')), "job file: more than 32 nested [ or { brackets");
  // Found by fuzz_job_file: a key that is not a name (YAML's "? {..}") escaped from_yaml as a
  // YAML::TypedBadConversion instead of a ConfigError.
  EXPECT_EQ(error_of("? {heads: 4}\n: 1\n"), "job: a key must be a name, got '{heads: 4}'");
  EXPECT_NE(
      error_of(replace(kJob, "eval:", "model2:\n  ? [a]\n  : 1\neval:")).find("unknown field"),
      std::string::npos);
  EXPECT_EQ(error_of("model:\n  ? heads: 4\n"), "model: a key must be a name, got 'heads: 4'");
  // An unreadable value shows cut and escaped in the error.
  const auto e = error_of(replace(kJob, "steps: 5", "steps: \"" + std::string(5000, 'x') + "\""));
  EXPECT_NE(e.find("inner.steps: cannot read"), std::string::npos) << e;
  EXPECT_LT(e.size(), 200u) << e;
}
