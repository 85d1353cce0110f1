#include "server/disk_tier.hpp"

#include "common/fault_points.hpp"

#include <rocksdb/cache.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <rocksdb/write_buffer_manager.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include <cstring>
#include <filesystem>

namespace parasol {

void DiskTier::EncodeKey(uint64_t key, char out[8]) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(key & 0xff);
    key >>= 8;
  }
}

uint64_t DiskTier::DecodeKey(const rocksdb::Slice& s) {
  uint64_t key = 0;
  for (size_t i = 0; i < 8 && i < s.size(); ++i) key = (key << 8) | static_cast<uint8_t>(s[i]);
  return key;
}

Status DiskTier::ToStatus(const rocksdb::Status& s, const std::string& what) const {
  if (s.ok()) return Status::Ok();
  return IoError("disk tier " + dir_ + ": " + what + ": " + s.ToString());
}

Result<std::unique_ptr<DiskTier>> DiskTier::Open(const std::string& dir,
                                                 const std::vector<std::string>& tables,
                                                 uint64_t cache_bytes) {
  std::unique_ptr<DiskTier> t(new DiskTier());
  t->dir_ = dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("disk tier: cannot create '" + dir + "': " + ec.message());

  rocksdb::Options options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  options.max_background_jobs = 2;
  options.max_open_files = 512;
  rocksdb::ColumnFamilyOptions cf;
  // Point lookups only: a bloom filter makes a key that is on neither tier (a new row) cheap;
  // index and filter blocks live in the bounded block cache, so memory stays within it.
  rocksdb::BlockBasedTableOptions table;
  // One cache holds what the store keeps in memory: the blocks it reads, and (charged by the
  // write buffer manager) its memtables, which may take half of it before writes wait for a
  // flush. Not a strict capacity: a flush that cannot insert the new file's index blocks fails
  // and stops the store's writes for good; it exceeds its capacity only by the blocks reads
  // hold at the moment (a MultiGet chunk per engine).
  rocksdb::LRUCacheOptions cache_options;
  cache_options.capacity = std::max<uint64_t>(cache_bytes, 2 << 20);
  cache_options.num_shard_bits = 0;
  cache_options.strict_capacity_limit = false;
  t->cache_ = rocksdb::NewLRUCache(cache_options);
  table.block_cache = t->cache_;
  options.write_buffer_manager = std::make_shared<rocksdb::WriteBufferManager>(
      cache_options.capacity / 2, t->cache_, /*allow_stall=*/true);
  // Partitioned: a lookup loads a small filter and index partition, not a file's whole filter
  // (which, once the files' filters outgrow the cache, every lookup would read again).
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  // Nothing pinned: pinned blocks would hold the strict cache full.
  table.pin_top_level_index_and_filter = false;
  table.index_type = rocksdb::BlockBasedTableOptions::IndexType::kTwoLevelIndexSearch;
  table.partition_filters = true;
  table.metadata_block_size = 4096;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_size = 4 * 1024;  // a lookup reads one block for one row of ~100 bytes
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  // Memtables: charged to the cache above; small ones, flushed often, for a small budget.
  cf.write_buffer_size = std::clamp<uint64_t>(cache_options.capacity / 8, 256 << 10, 4 << 20);
  cf.max_write_buffer_number = 2;
  cf.compression = rocksdb::kNoCompression;  // rows of floats barely compress
  // A new store every time: the checkpoint, not this folder, holds the shard's state.
  rocksdb::Status s = rocksdb::DestroyDB(dir, options);
  if (!s.ok()) return IoError("disk tier: cannot empty '" + dir + "': " + s.ToString());
  std::vector<rocksdb::ColumnFamilyDescriptor> families;
  families.emplace_back(rocksdb::kDefaultColumnFamilyName, cf);
  for (const std::string& name : tables) families.emplace_back("table:" + name, cf);
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  s = rocksdb::DB::Open(rocksdb::DBOptions(options), dir, families, &handles, &db);
  if (!s.ok()) return IoError("disk tier: cannot open '" + dir + "': " + s.ToString());
  t->db_.reset(db);
  t->opened_ = true;  // from now on the folder is this store's, and goes with it
  t->families_.assign(handles.begin() + 1, handles.end());
  db->DestroyColumnFamilyHandle(handles[0]);
  return t;
}

DiskTier::~DiskTier() {
  for (rocksdb::ColumnFamilyHandle* h : families_) db_->DestroyColumnFamilyHandle(h);
  families_.clear();
  if (db_) db_->Close();
  db_.reset();
  // Scratch: nothing in it outlives the shard. Not when the open failed: the folder may be
  // another live store's (a second process of the same shard).
  if (opened_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

Status DiskTier::MultiGet(uint32_t table, std::span<const uint64_t> keys, size_t row_bytes,
                          char* out, std::vector<uint8_t>* found) {
  const size_t n = keys.size();
  found->assign(n, 0);
  if (n == 0) return Status::Ok();
  // In chunks: each value pins its block until it is released, and the blocks of a whole
  // request's keys would outgrow the block cache many times over.
  constexpr size_t kChunk = 256;
  char encoded[kChunk * 8];
  rocksdb::Slice slices[kChunk];
  std::vector<rocksdb::PinnableSlice> values(std::min(n, kChunk));
  std::vector<rocksdb::Status> statuses(std::min(n, kChunk));
  rocksdb::ReadOptions o;
  uint64_t got = 0;
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t m = std::min(kChunk, n - begin);
    for (size_t i = 0; i < m; ++i) {
      EncodeKey(keys[begin + i], &encoded[i * 8]);
      slices[i] = rocksdb::Slice(&encoded[i * 8], 8);
      values[i].Reset();
    }
    db_->MultiGet(o, families_.at(table), m, slices, values.data(), statuses.data());
    // A block the full cache had no room for (Status::MemoryLimit, or Incomplete): read again
    // without caching.
    bool retry = false;
    for (size_t i = 0; i < m; ++i) {
      retry = retry || statuses[i].IsMemoryLimit() || statuses[i].IsIncomplete();
    }
    if (retry) {
      rocksdb::ReadOptions uncached;
      uncached.fill_cache = false;
      for (size_t i = 0; i < m; ++i) values[i].Reset();
      db_->MultiGet(uncached, families_.at(table), m, slices, values.data(), statuses.data());
      uncached_reads_.fetch_add(1, std::memory_order_relaxed);
    }
    for (size_t i = 0; i < m; ++i) {
      if (statuses[i].IsNotFound()) continue;
      if (!statuses[i].ok()) return ToStatus(statuses[i], "reading a row");
      if (values[i].size() != row_bytes) {
        return IoError("disk tier " + dir_ + ": the row of key " +
                       std::to_string(keys[begin + i]) + " has " +
                       std::to_string(values[i].size()) + " bytes, expected " +
                       std::to_string(row_bytes));
      }
      std::memcpy(out + (begin + i) * row_bytes, values[i].data(), row_bytes);
      (*found)[begin + i] = 1;
      ++got;
    }
    for (size_t i = 0; i < m; ++i) values[i].Reset();
  }
  rows_read_.fetch_add(got, std::memory_order_relaxed);
  return Status::Ok();
}

void DiskTier::Batch::Put(uint64_t key, const void* row, size_t row_bytes) {
  char k[8];
  EncodeKey(key, k);
  batch_.Put(cf_, rocksdb::Slice(k, 8), rocksdb::Slice(static_cast<const char*>(row), row_bytes));
  ++puts_;
}

void DiskTier::Batch::Delete(uint64_t key) {
  char k[8];
  EncodeKey(key, k);
  batch_.Delete(cf_, rocksdb::Slice(k, 8));
}

Status DiskTier::Write(Batch& batch) {
  if (batch.empty()) return Status::Ok();
  rocksdb::WriteOptions o;
  o.disableWAL = true;  // scratch space: a restarted shard starts from its checkpoint
  const uint64_t n = batch.puts_;
  rocksdb::Status s = db_->Write(o, &batch.batch_);
  batch.batch_.Clear();
  batch.puts_ = 0;
  if (s.ok()) rows_written_.fetch_add(n, std::memory_order_relaxed);
  return ToStatus(s, "writing rows");
}

std::unique_ptr<rocksdb::Iterator> DiskTier::IteratorFrom(uint32_t table, const std::string& from,
                                                        const rocksdb::Snapshot* snapshot) const {
  rocksdb::ReadOptions o;
  o.snapshot = snapshot;
  o.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(o, families_.at(table)));
  if (from.empty()) {
    it->SeekToFirst();
  } else {
    it->Seek(from);
  }
  return it;
}

Result<std::string> DiskTier::Scan(
    uint32_t table, const std::string& from, size_t max,
    const std::function<void(uint64_t, std::span<const char>)>& fn) const {
  std::unique_ptr<rocksdb::Iterator> it = IteratorFrom(table, from, nullptr);
  for (size_t n = 0; it->Valid() && n < max; it->Next(), ++n) {
    fn(DecodeKey(it->key()), std::span<const char>(it->value().data(), it->value().size()));
  }
  PARASOL_RETURN_IF_ERROR(ToStatus(it->status(), "scanning table " + std::to_string(table)));
  return it->Valid() ? it->key().ToString() : std::string();
}

namespace {

constexpr uint32_t kFeedEnd = 0xffffffffu;    // the table's rows are all sent
constexpr uint32_t kFeedError = 0xfffffffeu;  // an error message follows (length, text)

// Writes what is buffered to the child; false once it went away.
bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes of the feed; false at its end or on an error.
bool ReadAll(int fd, char* out, size_t n) {
  while (n > 0) {
    const ssize_t r = ::read(fd, out, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    out += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void Put32(std::string& out, uint32_t v) { out.append(reinterpret_cast<const char*>(&v), 4); }

}  // namespace

Status DiskTier::FeedRows(const rocksdb::Snapshot* snapshot, const std::vector<uint32_t>& tables,
                          int fd) const {
  // A chunk is read whole, and its iterator gone, before it is sent: the child may take its
  // time reading, and an iterator pins the memtables it was made over (charged to the cache,
  // they would hold back the shard's own writes meanwhile).
  constexpr size_t kChunkRows = 8192;
  std::string buf;
  Status st;
  bool gone = false;
  auto flush = [&] {
    if (!gone && !SendAll(fd, buf.data(), buf.size())) gone = true;
    buf.clear();
    return !gone;
  };
  for (uint32_t table : tables) {
    if (gone || !st.ok()) break;
    // A table of many rows, in a test: the rows are read a while after the snapshot was taken.
    if (FaultPoints::Get().Hit("checkpoint.feed") == Fault::kSlow) ::usleep(500 * 1000);
    Put32(buf, table);
    std::string from;  // the next chunk's first key ("": the table's first)
    bool more = true;
    while (more && !gone && st.ok()) {
      {
        std::unique_ptr<rocksdb::Iterator> it = IteratorFrom(table, from, snapshot);
        size_t n = 0;
        for (; it->Valid() && n < kChunkRows; it->Next(), ++n) {
          const rocksdb::Slice k = it->key(), v = it->value();
          Put32(buf, static_cast<uint32_t>(v.size()));
          const uint64_t key = DecodeKey(k);
          buf.append(reinterpret_cast<const char*>(&key), sizeof(key));
          buf.append(v.data(), v.size());
        }
        if (!it->status().ok()) {
          st = ToStatus(it->status(), "reading the rows of table " + std::to_string(table) +
                                          " for a background checkpoint");
          break;
        }
        more = it->Valid() && n == kChunkRows;
        if (more) from = it->key().ToString();
      }
      flush();
    }
    if (st.ok()) Put32(buf, kFeedEnd);
  }
  if (!st.ok() && !gone) {
    Put32(buf, kFeedError);
    Put32(buf, static_cast<uint32_t>(st.message().size()));
    buf.append(st.message());
  }
  flush();
  ::shutdown(fd, SHUT_WR);
  if (!st.ok()) return st;
  if (gone) return Unavailable("the checkpoint's process stopped reading the rows fed to it");
  return Status::Ok();
}

Status DiskTier::ReadFedRows(uint32_t table,
                             const std::function<bool(uint64_t, std::span<const char>)>& fn) const {
  const std::string what = "the disk tier's rows fed for the checkpoint (table " +
                           std::to_string(table) + ")";
  if (feed_broken_) return IoError(what + ": an earlier read stopped part way");
  uint32_t sent_table = 0;
  if (!ReadAll(row_source_, reinterpret_cast<char*>(&sent_table), 4)) {
    feed_broken_ = true;
    return IoError(what + ": the feed ended");
  }
  if (sent_table != table) {
    feed_broken_ = true;
    return IoError(what + ": the feed sent table " + std::to_string(sent_table));
  }
  std::vector<char> row;
  while (true) {
    uint32_t len = 0;
    if (!ReadAll(row_source_, reinterpret_cast<char*>(&len), 4)) {
      feed_broken_ = true;
      return IoError(what + ": the feed ended inside the table");
    }
    if (len == kFeedEnd) return Status::Ok();
    if (len == kFeedError) {
      uint32_t n = 0;
      std::string message;
      if (ReadAll(row_source_, reinterpret_cast<char*>(&n), 4) && n <= (1u << 20)) {
        message.resize(n);
        if (!ReadAll(row_source_, message.data(), n)) message.clear();
      }
      feed_broken_ = true;
      return IoError(what + ": " + (message.empty() ? std::string("an error") : message));
    }
    if (len > (64u << 20)) {
      feed_broken_ = true;
      return IoError(what + ": a row of " + std::to_string(len) + " bytes");
    }
    uint64_t key = 0;
    row.resize(len);
    if (!ReadAll(row_source_, reinterpret_cast<char*>(&key), sizeof(key)) ||
        !ReadAll(row_source_, row.data(), len)) {
      feed_broken_ = true;
      return IoError(what + ": the feed ended inside a row");
    }
    if (!fn(key, std::span<const char>(row.data(), len))) {
      feed_broken_ = true;  // the rest of this table is still on its way
      return Status::Ok();
    }
  }
}

DiskTier::Feed::Feed(const DiskTier& disk, const rocksdb::Snapshot* snapshot,
                     std::vector<uint32_t> tables, int fd)
    : disk_(disk), snapshot_(snapshot), fd_(fd) {
  thread_ = std::thread([this, tables = std::move(tables)] {
    // A failure reaches the child (an error mark, or the feed's end), whose checkpoint fails.
    (void)disk_.FeedRows(snapshot_, tables, fd_);
  });
}

DiskTier::Feed::~Feed() {
  ::shutdown(fd_, SHUT_RDWR);  // a send still blocked on a child that is gone returns
  thread_.join();
  disk_.ReleaseSnapshot(snapshot_);
  ::close(fd_);
}

uint64_t DiskTier::DiskBytes() const {
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : families_) {
    uint64_t v = 0;
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kTotalSstFilesSize, &v)) total += v;
  }
  return total;
}

uint64_t DiskTier::CacheBytes() const { return cache_ ? cache_->GetUsage() : 0; }
uint64_t DiskTier::CacheCapacity() const { return cache_ ? cache_->GetCapacity() : 0; }

uint64_t DiskTier::MemTableBytes() const {
  uint64_t total = 0;
  for (rocksdb::ColumnFamilyHandle* h : families_) {
    uint64_t v = 0;
    if (db_->GetIntProperty(h, rocksdb::DB::Properties::kSizeAllMemTables, &v)) total += v;
  }
  return total;
}

}  // namespace parasol
