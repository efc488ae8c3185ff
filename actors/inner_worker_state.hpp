// InnerWorker's insides, shared by its files: inner_worker.cpp (construction, init, the
// blocking round, checkpoints) and inner_worker_stream.cpp (the streaming round and a joiner's
// way in mid-round); the State's methods are in inner_worker_state.cpp, its stream() group and
// join desk in stream_group.hpp. Private to actors/.
#pragma once
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "actors/exchange_desk.hpp"
#include "actors/inner_worker.hpp"
#include "actors/round_decisions.hpp"
#include "actors/round_hooks.hpp"
#include "actors/stream_group.hpp"
#include "actors/timeouts.hpp"
#include "diloco/data/data.hpp"
#include "diloco/job/config.hpp"
#include "diloco/model/archive_file.hpp"
#include "diloco/model/device_info.hpp"
#include "diloco/model/hf_format.hpp"
#include "diloco/model/torchscript_model.hpp"
#include "diloco/round/averager.hpp"
#include "diloco/round/delta_averager.hpp"
#include "diloco/round/error_feedback.hpp"
#include "diloco/round/local_group.hpp"
#include "diloco/round/streaming_round.hpp"
#include "diloco/round/trainer.hpp"
#include "runtime/collective/allreduce.hpp"
#include "runtime/core/actor.hpp"
#include "runtime/core/paths.hpp"
#include "runtime/core/runtime.hpp"
#include "runtime/core/util.hpp"

namespace loco::actors {

namespace dl = loco::diloco;

// Seconds since `t0`, both on the runtime's one steady clock (runtime/core/util.hpp).
inline double seconds_since(int64_t t0) { return static_cast<double>(loco::now_ms() - t0) / 1000.0; }

// Bytes [offset, offset + length) of a serialized state, shared without a copy; the range is
// checked first (it comes from the network).
Blob bytes_of(const std::shared_ptr<const std::string>& state, int64_t offset, int64_t length,
              const char* method, const char* what);

// The host this node is reached at, for the collective's socket.
std::string node_host();

// One local rank of the worker (one GPU, or a CPU rank): its model replica and inner
// optimizer, its copy of the outer state, and the communicator that carries its slice of Δ
// across workers (rank r of every worker averages slice r: G streams over the slow link).
struct Rank {
  torch::Device device = torch::kCPU;
  std::unique_ptr<dl::LocalGroup> group;  // none with one rank: the same arithmetic, bit for bit
  std::unique_ptr<dl::InnerTrainer> trainer;
  std::unique_ptr<dl::OuterOptimizer> outer;
  std::unique_ptr<collective::Communicator> comm;  // for the worker's life: failures leave it ready
};

// The guard's left-outs as a worker reports them to the aggregator.
std::vector<LeftOutNote> notes_of(const std::vector<dl::LeftOut>& left);

// sync.mode streaming and eager with compression auto: each fragment's operation runs the codec
// its members agree on as it begins, from each one's proposal (diloco/round/codec_plan.hpp), and
// makes its code then, on its own thread. Used by a worker's operations (one at a time) and by
// stream() as it ends, under `mu`.
struct FragmentCodecs {
  std::mutex mu;
  std::unique_ptr<dl::FragmentCodecPlanner> planner;
  std::set<std::string> met;             // endpoints an operation of this worker has run with
  int last = -1;                         // the rung the last operation agreed on (-1: none yet)
  std::vector<FragmentCodecNote> notes;  // agreed since the last take (StreamResult::codecs)
};

struct InnerWorker::State {
  std::string job_id;
  int index = 0;
  dl::JobConfig cfg;
  dl::TokenStore store;
  std::vector<Rank> ranks;  // rank 0 answers for the worker: θ's hash, evaluation, checkpoints
  // Where members behind NAT meet (the head's --relay, through this worker's node): every
  // group this worker builds names it.
  collective::RelayEndpoint relay;
  int64_t delta_round = -1;  // blocking: the round whose Δ the round engine keeps
  // The round whose inner steps diverged (a step's loss or gradient norm not finite): the
  // worker stopped them and abstains from that round's averages. -1: none.
  int64_t diverged_round = -1;
  // The guard's left-outs of the averages that ended since the last stream() returned.
  dl::GuardLog guard_log;
  // reduce()'s work on one local rank (inner_worker.cpp): its slice of Δ averaged into `mean`,
  // what the guard left out and what its summary exchange cost.
  struct RankAverage {
    std::vector<LeftOutNote> left_out;
    uint64_t guard_bytes = 0;
    double guard_seconds = 0;
  };
  RankAverage average_rank(Rank& k, const ReduceRequest& req, std::span<const float> delta,
                           std::span<float> mean);
  // compression topk or auto: this worker's error feedback (one buffer per fragment; blocking:
  // one), and in blocking rounds what it sends of round `coded_round`'s Δ (a code, or the
  // dense Δ: ErrorFeedback::dense), made once: an attempt retried sends the same bytes, and the
  // buffer takes each round's Δ once.
  std::unique_ptr<dl::ErrorFeedback> feedback;
  dl::DeltaAverager::Sent code;
  int64_t coded_round = -1;
  // The codec of the averages of the round the worker was last asked to average (the round's
  // plan: ReduceRequest::codec, StreamRequest::codec; compression auto changes it by rounds).
  dl::CodecChoice choice;
  // streaming: the fragments' exchange times and the call's inner step times
  ExchangeDesk exchanges;
  // sync.mode streaming and eager with compression auto (plans_codecs): the codecs the
  // fragments' operations agree on (FragmentCodecs); made by make_feedback.
  std::shared_ptr<FragmentCodecs> codecs;
  // The newest operation's code made (the error feedback then holds its Δ): what a copy of the
  // feedback waits for (inner_state_archive) when the operations make their codes.
  std::shared_future<void> last_prepared;
  bool plans_codecs() const { return cfg.autocodec.on && overlapped(); }
  // Sets `choice` from a request's codec ("": the job's own); throws std::invalid_argument for a
  // name that is not a rung this job's workers can run.
  void choose(const std::string& codec, const char* method);
  // The averaging policy of this worker's job (diloco/round/delta_averager.hpp).
  dl::DeltaAverager policy() const {
    return dl::DeltaAverager(cfg.guard, feedback.get(), choice, cfg.autocodec.flush);
  }
  // Its node is stopping (InnerWorker::stop): inner steps end at the next one.
  std::atomic<bool> stopping{false};
  InnerResult last_inner;
  uint64_t stream = 0;
  // See join_state(): of the outer state at shared_state_round; init() drops it.
  std::shared_ptr<const std::string> shared_state;
  int64_t shared_state_round = -1;
  torch::Tensor val_windows;
  dl::DeviceChoice device;  // from the job's `device` and the GPUs the head gave this actor
  // For the per-step figures, set at construction: model FLOPs per token, and the peak FLOP/s
  // of all the worker's devices (0: not known, no MFU).
  double flops_per_token = 0;
  double peak_flops = 0;
  std::string device_key;  // StepFigures::device: the CUDA UUIDs of the worker's GPUs

  PathRoots roots;  // its node's data and checkpoint roots: where it may read and write

  // The round engine the simulator drives too, over the lead rank's trainer and outer state;
  // made by init(). Blocking: its two halves are inner() and reduce() (the other ranks copy the
  // lead's outer state after a step). Streaming and eager: the fragments in flight and their
  // landing; their all-reduces run on threads of their own, one after another (one
  // communicator runs one operation at a time): `last_op` is the newest.
  std::unique_ptr<dl::StreamingRound> engine;
  std::shared_future<uint64_t> last_op;
  JoinDesk desk;
  int64_t joined_snapshot_step = -1;  // init() copied a donor's snapshot of this step (mid-round)

  // Checkpoints stream() was asked for, by the rounds they are of (the outer state's round once
  // the round ended): their writes, each on a thread of its own (start_checkpoint).
  std::mutex checkpoints_mu;
  std::map<int64_t, std::shared_future<std::string>> checkpoint_writes;
  // Evaluations stream() was asked for (StreamRequest::eval_begin), by the outer state's round,
  // each after the one before on the evaluator's model (made at the first).
  std::unique_ptr<dl::Evaluator> evaluator;
  std::map<int64_t, std::shared_future<double>> evaluations;  // under checkpoints_mu
  std::shared_future<double> last_evaluation;

  // stream(), as its round ends: validation windows [begin, end) of a copy of θ, evaluated on a
  // thread of its own.
  void start_evaluation(int64_t begin, int64_t end);

  // The operations' threads use a rank's communicator; a checkpoint's writer waits for
  // fragments in flight, which drain() lands or abandons.
  ~State();
  // Waits for every operation in flight (each ends, by success or by the peer timeout) and
  // forgets them: before the state they work on is replaced or destroyed.
  void drain();
  // streaming or eager: the rounds run through stream(), with synchronizations in flight.
  bool overlapped() const { return cfg.sync.mode != dl::SyncMode::blocking; }
  dl::FragmentSchedule schedule() const { return dl::FragmentSchedule(cfg); }
  // The round engine over the lead rank's trainer and outer state as they are now.
  void make_engine();
  // compression topk: the error feedback at zero (a worker that joins starts with nothing
  // unsent: the others' residuals are theirs to send), per fragment of the round engine.
  void make_feedback();

  // stream(), between two inner steps at step count `now`: the snapshot offer_state asked
  // for, if it did: the outer state (every fragment at its last synchronized value; the ones
  // in flight land later, in the landings kept from here on) and the AdamW moments.
  void snapshot_if_wanted(int64_t round, int64_t now);
  // stream(): a landing, kept while a snapshot is offered. More than two rounds' worth of
  // averages (the joiner is far behind) drops the snapshot, and that join with it.
  void log_landing(int fragment, std::vector<float>& mean, int64_t now);

  // stream(), at step count `now` before its events: the loop's progress for the joiners, and an
  // admission there (accepted before this boundary: the decision normally came long ago); the
  // member it commits takes part from this boundary's operation on. The seconds it waited.
  double admit_at(const StreamRequest& req, StreamGroup& group, int64_t now);

  // The test hooks installed in this process at `point` (actors/round_hooks.hpp; none in
  // production), and the seconds they took.
  double hook(RoundPoint point, int64_t round, int64_t step, const char* method,
              collective::detail::Hooks* comm_hooks = nullptr, std::span<float> delta = {},
              double* step_loss = nullptr);

  // One inner step of rank `k`, and its figures (per-step records: metrics.jsonl "steps").
  // n steps of this are the arithmetic of run_inner_steps(n).
  StepFigures one_step(Rank& k);

  // A step whose loss or gradient norm is not finite: the trainer did not take it (or a test
  // hook made its loss NaN); the round's steps stop there and the worker abstains from the
  // round's averages.
  static bool diverged(const StepFigures& f);
  // Round `round` diverged at its inner step `step` (figures `f`): noted, and said in the log.
  void note_diverged(int64_t round, int64_t step, const StepFigures& f);

  // Inner steps one at a time until `seconds` are spent since `t0` (at least one step, at most
  // 4·H and, if `max_steps` is not 0, at most that; with seconds 0, exactly H). One rank.
  InnerResult timed_steps(int64_t round, double seconds, int64_t t0, int64_t max_steps);
  bool eager() const { return cfg.sync.mode == dl::SyncMode::eager; }

  State(std::string job, const std::string& spec, int idx);

  // The job's data folder (and tokenizer.json) as this node allows them: under its data root.
  static dl::DataConfig data_under_root(dl::DataConfig d);
  // A path the aggregator (or anyone) asks this worker to write or read a checkpoint at.
  // A file strictly inside the root: its ".tmp" sibling must be inside too.
  std::string checkpoint_path(const std::string& path, const char* what) const;

  // The most bytes a join state or snapshot of this job can hold: θ, the momentum, the AdamW
  // moments, and the averages and provisional θ of the fragments in flight (each at most θ's
  // size; 12 copies in all is more than a job holds), with room for the archive's records.
  int64_t max_state_bytes() const;
  Rank& lead() { return ranks[0]; }
  const Rank& lead() const { return ranks[0]; }

  // What save_checkpoint writes, less the fragments in flight, and what save_inner_state
  // writes; with `copy` the archives hold copies of the state (checkpoint_copier), to be
  // written on another thread while the inner steps go on.
  void checkpoint_archive(torch::serialize::OutputArchive& ar,
                          const dl::ArchiveCopy& copy = {}) const;
  void inner_state_archive(torch::serialize::OutputArchive& ar,
                           const dl::ArchiveCopy& copy = {}) const;

  // Host buffers that checkpoints copy the state into, kept from one to the next: fresh ones
  // would fault their pages in on every copy, which took 0.1 to 0.6 s of a stepping thread for
  // a 6.4 M-parameter model on the 2-core VM against tens of milliseconds for the copy itself.
  std::vector<torch::Tensor> checkpoint_buffers;
  int checkpoint_buffers_new = 0;  // made by the last checkpoint_copier (the others were reused)
  // For one checkpoint: each distinct tensor copied once (the outer checkpoint and the inner
  // state both hold the parameters and moments), into the kept buffer of its turn when no
  // write in progress still holds that one, else into a new one that is kept from then on.
  dl::ArchiveCopy checkpoint_copier();

  // stream(), as its round ends: the checkpoint it was asked for (StreamRequest::checkpoint,
  // inner_state; paths already resolved). Only a copy of the state is made here, on the
  // stepping thread; the files are written on a thread of their own, the outer checkpoint once
  // the fragments now in flight have landed in the next round (each hands its average in as it
  // lands), so that it holds them as save_checkpoint would.
  void start_checkpoint(const std::string& checkpoint, const std::string& inner);
  // fn(rank) for every rank, each on its own thread (the caller's with one rank).
  void for_ranks(const std::function<void(Rank&)>& fn);
  dl::Slice slice_of(const Rank& k) const;

  static collective::Options collective_options(const dl::JobConfig& cfg);
};

// A group as the aggregator sends it (names, one endpoint list per member, this member's rank),
// checked before use: lists of one length, a rank inside them, and as many endpoints per
// member as this worker has local ranks.
void check_group(const char* what, int index, const std::vector<std::string>& names,
                 const std::vector<std::vector<std::string>>& endpoints, int rank, size_t g);

}  // namespace loco::actors
