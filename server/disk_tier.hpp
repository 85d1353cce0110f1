// DiskTier: the on-disk part of a shard's tiered sparse tables (tables[].storage: tiered), in
// RocksDB on the shard's local disk (server.disk_dir).
//
// One column family per tiered table; a row is stored under its key (8 bytes, big-endian) as
// the bytes the memory tier keeps for it (clock word, values, optimizer state). A row lives in
// exactly one tier: promoting it to memory deletes it here, demoting it writes it here.
//
// The store is scratch space, not a source of truth: a shard's durable state is its checkpoint
// (which covers both tiers), so Open() empties the folder, and writes skip RocksDB's
// write-ahead log. Engine threads own disjoint keys and call Get/Write concurrently; RocksDB
// serves reads of different keys without blocking one another.
// Thread-safety: every method may be called from any thread.
#pragma once

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/status.hpp"

namespace parasol {

class DiskTier {
 public:
  // Opens an empty store in `dir` (created; whatever it held is deleted) with one column
  // family per name. `cache_bytes`: all the memory RocksDB keeps (blocks read, index and filter
  // blocks, memtables), one cache with a strict capacity.
  static Result<std::unique_ptr<DiskTier>> Open(const std::string& dir,
                                                const std::vector<std::string>& tables,
                                                uint64_t cache_bytes);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  const std::string& dir() const { return dir_; }

  // Reads the rows of `keys` of column family `table`: found[i] tells whether key i is
  // stored, and then out[i * row_bytes ...] holds it. One batched lookup.
  Status MultiGet(uint32_t table, std::span<const uint64_t> keys, size_t row_bytes, char* out,
                  std::vector<uint8_t>* found);

  // A batch of puts and deletes of one table, written at once.
  class Batch {
   public:
    void Put(uint64_t key, const void* row, size_t row_bytes);
    void Delete(uint64_t key);
    bool empty() const { return batch_.Count() == 0; }

   private:
    friend class DiskTier;
    explicit Batch(rocksdb::ColumnFamilyHandle* cf) : cf_(cf) {}
    rocksdb::ColumnFamilyHandle* cf_;
    rocksdb::WriteBatch batch_;
    uint64_t puts_ = 0;
  };
  Batch NewBatch(uint32_t table) { return Batch(families_.at(table)); }
  Status Write(Batch& batch);

  // Calls fn(key, row bytes) for every row of `table` (a consistent snapshot) until fn returns
  // false. In a forked child fed rows (ReadRowsFrom), the rows come from the feeder instead.
  template <typename Fn>
  Status ForEachRow(uint32_t table, Fn&& fn) const {
    if (row_source_ >= 0) return ReadFedRows(table, fn);
    rocksdb::ReadOptions o;
    o.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(o, families_.at(table)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (!fn(DecodeKey(it->key()), std::span<const char>(it->value().data(), it->value().size()))) {
        break;
      }
    }
    return ToStatus(it->status(), "reading the rows of table " + std::to_string(table));
  }

  // A background checkpoint of a tiered shard is written by a forked child (a copy-on-write
  // image of the memory tier at its moment), which has none of RocksDB's threads and must not
  // touch the store. The parent takes a snapshot of the store at that moment and a thread of
  // its feeds the child the rows it holds, table by table in the order the child asks for them
  // (FeedRows); the child reads them through ForEachRow (ReadRowsFrom). The feed is a stream of
  // records on a socket: per table its index, then rows (length, key, bytes), then an end (or
  // an error) mark.
  const rocksdb::Snapshot* TakeSnapshot() const { return db_->GetSnapshot(); }
  void ReleaseSnapshot(const rocksdb::Snapshot* snapshot) const {
    db_->ReleaseSnapshot(snapshot);
  }
  // Sends the rows of each of `tables` as `snapshot` saw them to `fd`, in order, then closes
  // its writing side. Reads in chunks, a new iterator for each, so that no iterator pins the
  // store's memtables for the whole feed. Fails when the store cannot be read (the child is
  // told, and fails too) or the child went away.
  Status FeedRows(const rocksdb::Snapshot* snapshot, const std::vector<uint32_t>& tables,
                  int fd) const;
  // In the forked child: ForEachRow reads what FeedRows sends on `fd` from now on.
  void ReadRowsFrom(int fd) { row_source_ = fd; }
  // FeedRows on a thread of its own, owning the snapshot and the parent's end of the socket.
  // Destroyed once the child is done with the feed (or gone): stops it, joins the thread and
  // releases the snapshot. The store must outlive it.
  class Feed {
   public:
    Feed(const DiskTier& disk, const rocksdb::Snapshot* snapshot, std::vector<uint32_t> tables,
         int fd);
    ~Feed();
    Feed(const Feed&) = delete;
    Feed& operator=(const Feed&) = delete;

   private:
    const DiskTier& disk_;
    const rocksdb::Snapshot* snapshot_;
    const int fd_;
    std::thread thread_;
  };

  // Visits up to `max` rows of `table` from the encoded key `from` ("": the first) with
  // fn(key, row bytes); returns where the next visit starts ("" after the last row).
  Result<std::string> Scan(uint32_t table, const std::string& from, size_t max,
                           const std::function<void(uint64_t, std::span<const char>)>& fn) const;

  // Bytes on disk (SST files) and in memory (memtables) of the whole store.
  uint64_t DiskBytes() const;
  uint64_t MemTableBytes() const;
  // What the cache holds (memtables charged to it included), and its capacity.
  uint64_t CacheBytes() const;
  uint64_t CacheCapacity() const;
  // Lookups served without caching (the cache was full).
  uint64_t uncached_reads() const { return uncached_reads_.load(std::memory_order_relaxed); }
  // Rows read by MultiGet and put by Write since Open.
  uint64_t rows_read() const { return rows_read_.load(std::memory_order_relaxed); }
  uint64_t rows_written() const { return rows_written_.load(std::memory_order_relaxed); }

  static uint64_t DecodeKey(const rocksdb::Slice& s);
  static void EncodeKey(uint64_t key, char out[8]);

 private:
  DiskTier() = default;
  Status ToStatus(const rocksdb::Status& s, const std::string& what) const;
  // An iterator over `table` (as `snapshot` saw it; null: now), at the encoded key `from` ("":
  // the first), filling no cache.
  std::unique_ptr<rocksdb::Iterator> IteratorFrom(uint32_t table, const std::string& from,
                                                  const rocksdb::Snapshot* snapshot) const;
  Status ReadFedRows(uint32_t table,
                     const std::function<bool(uint64_t, std::span<const char>)>& fn) const;

  std::string dir_;
  bool opened_ = false;
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> families_;  // by table index of Open()
  std::atomic<uint64_t> rows_read_{0};
  std::atomic<uint64_t> rows_written_{0};
  std::atomic<uint64_t> uncached_reads_{0};
  std::shared_ptr<rocksdb::Cache> cache_;
  int row_source_ = -1;          // the feed's socket, in a forked child (ReadRowsFrom)
  mutable bool feed_broken_ = false;  // a read of the feed stopped part way
};

}  // namespace parasol
