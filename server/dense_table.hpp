// DenseTable: one shard's contiguous slice of a dense tensor, initialised from
// (table seed, global element index), with its optimizer state in arrays beside the values.
//
// Values are stored in the table's dtype (tables[].dtype: f32, bf16 or f16) and the optimizer's
// state arrays in its state_dtype (adam's step count stays 32-bit). Updates are computed in f32
// and rounded when stored, to nearest even or stochastically (tables[].rounding), as sparse
// rows are; everything read out of the table (pulls, checkpoints) is widened to f32, so a
// checkpoint restores a 16-bit table exactly.
//
// f32 tables: pull replies send the values without copying them: each reply frame holds a
// share of the buffer until ZeroMQ has sent it. A push that finds shares outstanding first
// moves the values to a fresh buffer (copy-on-write), so a reply in flight never sees a
// half-applied push and a push never waits for a slow reader. 16-bit tables are read through
// copies (widened), so nothing shares them.
// Thread-safety: Share(), PrepareWrite() and the readers are called on the shard's request
// thread; engines then call Apply() on disjoint element ranges.
#pragma once

#include <cstdint>
#include <atomic>
#include <memory>
#include <vector>

#include "common/half.hpp"
#include "common/manifest.hpp"
#include "common/sharding.hpp"
#include "server/optimizer.hpp"

namespace parasol {

class DenseTable {
 public:
  // `retired_bytes` (optional, may be shared by several tables) counts the bytes of replaced
  // value buffers that replies still hold: a reply waiting to be sent keeps its copy alive.
  DenseTable(const TableOptions& options, SliceRange slice,
             std::shared_ptr<std::atomic<uint64_t>> retired_bytes = nullptr);

  const TableOptions& options() const { return options_; }
  const Optimizer& optimizer() const { return optimizer_; }
  SliceRange slice() const { return slice_; }
  uint64_t total_elements() const { return options_.NumElements(); }

  // Elements a 16-bit table decodes at a time (on the stack: values and 3 state arrays).
  static constexpr uint64_t kDenseChunk = 256;

  // f32 values and state: nothing is rounded.
  bool identity() const { return identity_; }
  bool f32_values() const { return options_.dtype == DType::kF32; }

  // f32 values: the current values, shared: element `global` is at
  // get()[global - slice().begin]. 16-bit values: nullptr (read them with ReadValues()).
  std::shared_ptr<const float[]> Share() const { return data_; }

  // Call before updating. f32 values: returns a buffer no reply shares, for updating in place
  // (element `global` at [global - slice().begin]), copying the values first when replies
  // still hold shares. 16-bit values: returns nullptr (update them with Apply()).
  // `write` names the update (the clock applied, or the push's name): with stochastic
  // rounding, each element's draw depends on the table's seed, this name and its global index
  // only (RoundingBitsFor), so a restarted shard that redoes the same writes rounds them alike.
  float* PrepareWrite(uint64_t write = 0);

  // One optimizer step of local elements [local, local + n) with the raw f32 gradient `grad`
  // times `scale`, rounded into storage. After PrepareWrite(); engines may call it at once on
  // disjoint ranges.
  void Apply(uint64_t local, const std::byte* grad, uint64_t n, double scale);

  // Local elements [local, local + n) as f32.
  void ReadValues(uint64_t local, uint64_t n, float* out) const;
  // Per element of [local, local + n): its value, then each state array's element (f32;
  // adam's step as its 32-bit word), 1 + state_array_count() floats.
  void ReadWithState(uint64_t local, uint64_t n, float* out) const;
  // Sets local elements [local, local + n) from rows as ReadWithState() gives them (values and
  // state rounded to nearest into 16-bit storage, exact for what such a table read out).
  void WriteWithState(uint64_t local, uint64_t n, const float* in);
  // A table of the same tensor holding `slice`: the elements this one holds are copied (values
  // and state), the others initialised as a new table's.
  std::unique_ptr<DenseTable> Resliced(SliceRange slice) const;
  // The whole slice as a checkpoint holds it: the values, then each state array (f32 words).
  void AppendArrays(std::vector<char>* bytes) const;
  // Sets the slice from AppendArrays()'s bytes (size checked by the caller); exact for what a
  // table of this dtype wrote.
  void RestoreArrays(const char* bytes);

  uint32_t state_array_count() const { return static_cast<uint32_t>(state_.size()); }

  uint64_t MemoryBytes() const;
  uint64_t copies_on_write() const { return copies_on_write_; }

 private:
  TableOptions options_;
  Optimizer optimizer_;
  SliceRange slice_;
  // A value buffer's flag, set when PrepareWrite() replaces it while replies hold it; its
  // deleter (on whichever thread drops the last share) then takes it off the retired count.
  struct BufferState {
    std::atomic<bool> retired{false};
    uint64_t bytes = 0;
    std::shared_ptr<std::atomic<uint64_t>> retired_total;
  };
  std::shared_ptr<float[]> AllocateValues();
  // A state array: f32 words (f32 state, or adam's step), or 16-bit values.
  struct StateArray {
    DType type = DType::kF32;
    std::unique_ptr<float[]> words;
    std::unique_ptr<uint16_t[]> halves;
  };
  static float Widen(DType t, uint16_t h) { return t == DType::kBf16 ? Bf16ToF32(h) : F16ToF32(h); }
  uint16_t Narrow(DType t, float v, RoundingBits* bits) const;
  // Rounds elements [i, i + m) of the values (`w`, unless f32) and the 16-bit state arrays
  // (`st[a]`) into storage.
  // `stochastic`: with the bits of the current write (else to nearest).
  void Store(uint64_t i, uint64_t m, const float* w, const float (*st)[kDenseChunk],
             bool stochastic);

  bool identity_ = false;
  bool stochastic_;
  std::shared_ptr<std::atomic<uint64_t>> retired_bytes_;
  std::shared_ptr<float[]> data_;            // f32 values (shared with replies)
  std::unique_ptr<uint16_t[]> halves_;       // 16-bit values
  std::shared_ptr<BufferState> data_state_;
  std::vector<StateArray> state_;
  std::vector<float*> state_ptrs_;           // f32 state arrays (identity tables)
  uint64_t write_ = 0;                       // the current write's name (PrepareWrite)
  uint64_t copies_on_write_ = 0;
};

}  // namespace parasol
