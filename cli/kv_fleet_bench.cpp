// `ferry kv bench --writers N` (kv_fleet_bench.hpp): timings for reporting only, never for tests.
#include "kv_fleet_bench.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "ferry/error.hpp"
#include "kv_bench_memory.hpp"
#include "kv_bench_raw.hpp"

#ifndef _WIN32
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#endif

namespace ferry {

#ifdef _WIN32

KVFleetBenchRow run_kv_fleet_bench(const KVBenchOptions&) {
  detail::fail<std::invalid_argument>(
      "kv bench --writers: the writers are forked processes, which this build (Windows) has not");
}

#else

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kPrefix = 16;  // keys per timed lookup: one request's prefix

double now() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

// What a writer says to the bench, one message per write (under PIPE_BUF: never split).
struct Message {
  char kind = 0;            // 'r': opened and ready; 'd': a pass done; 'e': failed (text)
  double start = 0, end = 0;  // the pass, on the clock every process shares (CLOCK_MONOTONIC)
  KVPassTimes times = {};     // a put pass: where the store's time went
  char text[480] = {};
};

// Where a put pass's time went by the store's counters (as kv bench counts them).
KVPassTimes pass_times(const KVStats& before, const KVStats& after) {
  const KVBenchTimes t = kv_bench_times_between(before, after, 0);
  return {t.move, t.sync, t.journal, t.io, t.copy_wait, t.span, after.writers_active};
}

// Commands to a writer: 'o' open the store; 'g' and 8 bytes, the pass number: put the pass's keys;
// 'w': write the same bytes raw (kv_bench_raw.hpp) to a file of its own; 's': the same with its
// share of the writes in flight (16 / writers, at least 2, as the fleet's puts keep); EOF: close
// and exit.
struct Plan {
  KVBenchOptions o;
  fs::path root;
  KVNamespace ns;
  std::uint64_t block = 0, batch = 0, count = 0, capacity = 0;
  kv_bench::PieceLayout layout;
};

// The device writer w's memory is on.
const Device& device_of(const Plan& p, unsigned w) {
  const auto& list = p.o.writer_devices;
  return list.empty() ? p.o.device : list[w % list.size()];
}

KVStoreOptions fleet_options(const Plan& p) {
  KVStoreOptions options;
  options.fleet_writers = p.o.writers;
  options.checkpoint_on_close = false;
  options.allow_compat = true;
  options.gpu_groups = p.o.gpu_groups;  // --group-*: each writer's, alone and in the fleet
  return options;
}

// Writer w's key for block i of pass `pass`.
KVKey key_of(std::uint64_t pass, unsigned w, std::uint64_t i) {
  return (pass + 1) * (1ull << 40) + (std::uint64_t(w) << 28) + i + 1;
}

// The bytes of writer w's batch memory (block b's at its layout's places).
std::vector<std::byte> pattern_of(const Plan& p, unsigned w) {
  std::vector<std::byte> bytes(p.block * p.batch);
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = std::byte(i * 131 + i / 4099 + w * 71 + 1);
  return bytes;
}

void send(int fd, const Message& m) {
  const char* at = reinterpret_cast<const char*>(&m);
  for (std::size_t done = 0; done < sizeof m;) {
    const ssize_t n = ::write(fd, at + done, sizeof m - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// Reads exactly `size` bytes; false at EOF.
bool receive(int fd, void* into, std::size_t size) {
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::read(fd, static_cast<char*>(into) + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

// The next command, or 0 at EOF.
char command(int fd) {
  char c = 0;
  return receive(fd, &c, 1) ? c : 0;
}

// Until the store counts no other writer as writing (they wrote in the last 2 s after an earlier
// pass): a pass alone is timed as one writer's, with all of the storage's writes in flight.
void wait_until_alone(KVStore& store) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (store.stats().writers_active > 1) {
    FERRY_EXPECT(std::chrono::steady_clock::now() < deadline, std::runtime_error,
                 "kv bench --writers: the other writers still count as writing after 30 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// A writer process: opens its share when told, then puts its `count` keys per pass, or writes
// the same bytes raw.
[[noreturn]] void writer_main(const Plan& p, unsigned w, int in, int out) {
  int code = 0;
  try {
    if (command(in) != 'o') std::_Exit(0);
    KVStore store = KVStore::open(p.root, p.ns, p.capacity, p.block, fleet_options(p));
    kv_bench::BatchMemory source(device_of(p, w), p.block, p.batch, p.layout);
    source.fill(pattern_of(p, w));
    std::vector<std::vector<KVPiece>> pieces(p.batch);
    for (std::uint64_t b = 0; b < p.batch; ++b) pieces[b] = source.block(b);
    const std::vector<KVBlock> blocks(pieces.begin(), pieces.end());
    std::vector<KVKey> keys(p.batch);
    const auto put_pass = [&](std::uint64_t pass) {
      for (std::uint64_t i = 0; i < p.count; i += p.batch) {
        for (std::uint64_t k = 0; k < p.batch; ++k) keys[k] = key_of(pass, w, i + k);
        for (const KVResult& r : store.put(keys, blocks))
          FERRY_EXPECT(r.ok(), std::runtime_error, "writer ", w, ": put: ", to_string(r.status),
                       ": ", r.message);
      }
    };
    // Made (preallocated) before any pass is timed: no writer's setup runs inside another's
    // timed pass. A local of this scope, so its file is removed before _Exit.
    kv_bench::RawFile raw(p.root / ("raw-" + std::to_string(w) + ".bin"), p.block, p.count,
                          p.batch);
    send(out, Message{'r'});
    // 'g': a pass of puts beside the other writers; 'a': one alone; 'w', 's': raw writes.
    for (char c; (c = command(in)) == 'g' || c == 'a' || c == 'w' || c == 's';) {
      const bool puts = c == 'g' || c == 'a';
      std::uint64_t pass = 0;
      if (puts)
        FERRY_EXPECT(receive(in, &pass, sizeof pass), std::runtime_error, "no pass number");
      if (c == 'a') wait_until_alone(store);
      Message m{'d'};
      const KVStats before = store.stats();
      m.start = now();
      if (puts)
        put_pass(pass);
      else
        raw.write(c == 's' ? std::max<std::size_t>(2, 16 / p.o.writers) : 0);
      m.end = now();
      if (puts) m.times = pass_times(before, store.stats());
      send(out, m);
    }
    store.close();
  } catch (const std::exception& e) {
    Message m{'e'};
    std::snprintf(m.text, sizeof m.text, "writer %u: %s", w, e.what());
    send(out, m);
    code = 1;
  }
  std::_Exit(code);  // no atexit handlers or stdio buffers of the parent's copy
}

// The writer processes, each with a command pipe and a message pipe. The destructor closes the
// command pipes (a writer at EOF exits) and reaps them.
class Writers {
 public:
  Writers(const Plan& p, unsigned n) {
    // A writer that died leaves its command pipe without a reader: the bench's write then fails
    // with EPIPE (and says so) instead of SIGPIPE ending the bench without a word.
    _old_sigpipe = std::signal(SIGPIPE, SIG_IGN);
    std::fflush(nullptr);  // nothing buffered is written twice
    try {
      for (unsigned w = 0; w < n; ++w) start(p, w);
    } catch (...) {
      release();
      throw;
    }
  }
  Writers(const Writers&) = delete;
  Writers& operator=(const Writers&) = delete;
  ~Writers() { release(); }

  void tell(unsigned w, char c) { say(w, &c, 1); }
  // `alone`: writer w waits until no other writer counts as writing first.
  void start_pass(unsigned w, std::uint64_t pass, bool alone = false) {
    char command[1 + sizeof pass] = {alone ? 'a' : 'g'};
    std::memcpy(command + 1, &pass, sizeof pass);
    say(w, command, sizeof command);
  }
  void say(unsigned w, const void* bytes, std::size_t size) {
    if (::write(_children[w].to, bytes, size) != static_cast<ssize_t>(size))
      FERRY_SYSCALL_FAIL("kv bench --writers: writer ", w, " is gone");
  }
  // Writer w's next message; a failure or a writer gone throws with what it said.
  Message hear(unsigned w) {
    Message m;
    FERRY_EXPECT(receive(_children[w].from, &m, sizeof m), std::runtime_error,
                 "kv bench --writers: writer ", w, " ended without a word");
    FERRY_EXPECT(m.kind != 'e', std::runtime_error, "kv bench --writers: ",
                 std::string(m.text, strnlen(m.text, sizeof m.text)));
    return m;
  }
  // Whether writer w has a message waiting.
  bool ready(unsigned w) const {
    pollfd fd{_children[w].from, POLLIN, 0};
    return ::poll(&fd, 1, 0) > 0;
  }

 private:
  struct Child {
    pid_t pid;
    int to, from;
  };

  // Forks writer w, its pipes made first.
  void start(const Plan& p, unsigned w) {
    int to[2], from[2];
    if (::pipe(to) != 0) FERRY_SYSCALL_FAIL("kv bench --writers: pipe");
    if (::pipe(from) != 0) {
      ::close(to[0]);
      ::close(to[1]);
      FERRY_SYSCALL_FAIL("kv bench --writers: pipe");
    }
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(to[1]);
      ::close(from[0]);
      for (const Child& c : _children) {  // the earlier writers' pipes are theirs alone
        ::close(c.to);
        ::close(c.from);
      }
      writer_main(p, w, to[0], from[1]);
    }
    ::close(to[0]);
    ::close(from[1]);
    if (child < 0) {
      ::close(to[1]);
      ::close(from[0]);
      FERRY_SYSCALL_FAIL("kv bench --writers: fork");
    }
    _children.push_back({child, to[1], from[0]});
  }

  // Closes the command pipes (a writer at EOF closes its store and exits), reaps the writers.
  void release() noexcept {
    for (Child& c : _children) ::close(c.to);
    for (Child& c : _children) {
      int status = 0;
      ::waitpid(c.pid, &status, 0);
      ::close(c.from);
    }
    _children.clear();
    std::signal(SIGPIPE, _old_sigpipe);
  }

  std::vector<Child> _children;
  void (*_old_sigpipe)(int) = SIG_DFL;
};

// GB/s of a pass run by several writers at once, `gb` each: all their bytes over the time from
// the first one's start to the last one's end.
double aggregate_gbps(const std::vector<Message>& done, double gb) {
  double first = done[0].start, last = done[0].end;
  for (const Message& m : done) {
    first = std::min(first, m.start);
    last = std::max(last, m.end);
  }
  return gb * double(done.size()) / (last - first);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(q * double(v.size())))];
}

// Each part's median over the passes.
KVPassTimes median_times(const std::vector<KVPassTimes>& passes) {
  std::vector<double> move, sync, journal, io, copy_wait, span, writers;
  for (const KVPassTimes& t : passes) {
    move.push_back(t.move);
    sync.push_back(t.sync);
    journal.push_back(t.journal);
    io.push_back(t.workers_io);
    copy_wait.push_back(t.workers_copy_wait);
    span.push_back(t.workers_span);
    writers.push_back(t.writers_active);
  }
  KVPassTimes m;
  m.move = kv_bench::median(move);
  m.sync = kv_bench::median(sync);
  m.journal = kv_bench::median(journal);
  m.workers_io = kv_bench::median(io);
  m.workers_copy_wait = kv_bench::median(copy_wait);
  m.workers_span = kv_bench::median(span);
  m.writers_active = static_cast<unsigned>(kv_bench::median(writers));
  return m;
}

// Seconds of one lookup of a 16-key prefix of writer w's blocks of `pass`.
double timed_lookup(KVStore& reader, const Plan& p, std::uint64_t pass, unsigned w) {
  std::vector<KVKey> keys(std::min(kPrefix, p.count));
  for (std::uint64_t k = 0; k < keys.size(); ++k) keys[k] = key_of(pass, w, k);
  const auto start = Clock::now();
  reader.lookup(keys);
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The reader gets every writer's blocks of `pass`, each batch compared with what was put;
// returns the seconds.
double read_back(KVStore& reader, const Plan& p, std::uint64_t pass) {
  kv_bench::BatchMemory target(p.o.device, p.block, p.batch, p.layout);
  // Its pages made before timing: faulting in fresh pages under the first O_DIRECT reads cost
  // this machine a second per 256 MiB, and a reader of a serving engine reads into memory it has.
  target.fill(std::vector<std::byte>(p.block * p.batch));
  std::vector<std::vector<KVPiece>> pieces(p.batch);
  for (std::uint64_t b = 0; b < p.batch; ++b) pieces[b] = target.block(b);
  const std::vector<KVBlock> blocks(pieces.begin(), pieces.end());
  std::vector<KVKey> keys(p.batch);
  double seconds = 0;
  for (unsigned w = 0; w < p.o.writers; ++w) {
    const std::vector<std::byte> expected = pattern_of(p, w);
    for (std::uint64_t i = 0; i < p.count; i += p.batch) {
      for (std::uint64_t k = 0; k < p.batch; ++k) keys[k] = key_of(pass, w, i + k);
      const auto start = Clock::now();
      for (const KVResult& r : reader.get(keys, blocks))
        FERRY_EXPECT(r.ok(), std::runtime_error, "kv bench --writers: the reader's get of writer ",
                     w, "'s block: ", to_string(r.status), ": ", r.message);
      seconds += std::chrono::duration<double>(Clock::now() - start).count();
      FERRY_EXPECT(target.read() == expected, std::runtime_error,
                   "kv bench --writers: writer ", w, "'s blocks read back differ from those put");
    }
  }
  return seconds;
}

// The fleet's shape from the options: blocks, batches, each writer's pass, the store's capacity.
Plan plan_of(const KVBenchOptions& o) {
  FERRY_EXPECT(o.writers >= 1 && o.writers <= 64, std::invalid_argument,
               "kv bench --writers: 1 to 64 writers, not ", o.writers);
  Plan p;
  p.o = o;
  p.layout = kv_bench::piece_layout(o);
  p.block = o.layout.empty() ? o.block_sizes.at(0) : kv_layout_block_bytes(o);
  FERRY_EXPECT(p.block >= p.layout.pieces, std::invalid_argument, "kv bench: ", p.block,
               "-byte blocks cannot hold ", p.layout.pieces, " pieces");
  p.batch = kv_bench_batch(o, p.block);
  p.count = std::max<std::uint64_t>(1, o.bytes / p.block / p.batch) * p.batch;
  p.ns = {"kv-bench-fleet", "bytes",
          "block=" + std::to_string(p.block) + ",layout=" + o.layout, 0, 1};
  // Each writer's share holds one pass: a pass evicts the writer's pass before.
  const std::uint64_t slot = (p.block + 4095) / 4096 * 4096;
  p.capacity = p.count * o.writers * slot;
  p.root = o.root / "fleet";
  return p;
}

// The rounds of one run: the writers (their stores opened), a reader following them, and what
// each round measured.
class FleetRounds {
 public:
  FleetRounds(const Plan& p, Writers& writers, KVStore& reader)
      : _p(p),
        _n(p.o.writers),
        _writers(writers),
        _reader(reader),
        _gb(double(p.count) * double(p.block) / 1e9),
        _each(p.o.writers) {}

  // One pass of every writer at once, not timed: each writer's first put (a process's set-up of
  // its staging and copies; its share's first fill) is not the steady state the rounds compare.
  void warm_up() {
    for (unsigned w = 0; w < _n; ++w) _writers.start_pass(w, _pass);
    for (unsigned w = 0; w < _n; ++w) _writers.hear(w);
    ++_pass;
  }

  // Every round measures each case once, the puts first every other round, the raw writes
  // first in the others: the fleet is judged against one writer (and raw against raw) on the
  // disk of the same minute, not of an earlier phase of the run. The fleet's pass is the last
  // put of a round: the reader reads its blocks back.
  void round(unsigned r) {
    if (r % 2 == 1) raws();
    alone();
    together();
    if (r % 2 == 0) raws();
  }

  // The figures into `row`, after lookups while the writers idle and the reader's cold gets of
  // the fleet's last pass.
  void finish(KVFleetBenchRow& row, const fs::path& dir) {
    std::vector<double> idle;
    for (unsigned i = 0; i < 200; ++i) idle.push_back(timed_lookup(_reader, _p, _pass - 1, i % _n));
    for (const fs::path& slab : kv_bench::slabs_of(dir)) kv_bench::drop_cache(slab);
    const double get_seconds = read_back(_reader, _p, _pass - 1);
    row.blocks_read = _p.count * _n;
    row.reader_get_gbps = double(row.blocks_read) * double(_p.block) / 1e9 / get_seconds;
    row.store_blocks = _reader.stats().blocks;
    row.raw_one_writer_gbps = kv_bench::median(_raw_one);
    row.raw_fleet_gbps = kv_bench::median(_raw_fleet);
    row.raw_fleet_shared_gbps = kv_bench::median(_raw_shared);
    row.one_writer_put_gbps = kv_bench::median(_one);
    row.fleet_put_gbps = kv_bench::median(_fleet);
    row.one_writer_round_gbps = _one;
    row.fleet_round_gbps = _fleet;
    for (const auto& rates : _each) row.writer_put_gbps.push_back(kv_bench::median(rates));
    row.alone_times = median_times(_alone_times);
    row.fleet_times = median_times(_fleet_times);
    row.lookups = _lookups.size();
    row.lookup_p50_us = percentile(_lookups, 0.5) * 1e6;
    row.lookup_p99_us = percentile(_lookups, 0.99) * 1e6;
    row.idle_lookup_p50_us = percentile(idle, 0.5) * 1e6;
    row.idle_lookup_p99_us = percentile(idle, 0.99) * 1e6;
  }

 private:
  // Writer 0 alone.
  void alone() {
    _writers.start_pass(0, _pass, true);
    const Message m = _writers.hear(0);
    _one.push_back(_gb / (m.end - m.start));
    _alone_times.push_back(m.times);
    ++_pass;
  }

  // All at once, lookups beside them.
  void together() {
    for (unsigned w = 0; w < _n; ++w) _writers.start_pass(w, _pass);
    std::vector<Message> done(_n);
    std::vector<bool> heard(_n);
    for (unsigned left = _n, w = 0; left > 0; w = (w + 1) % _n) {
      _lookups.push_back(timed_lookup(_reader, _p, _pass, w));
      // Paced as a scheduler asks (per request), not a spin that takes a core from the writers.
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      for (unsigned v = 0; v < _n; ++v)
        if (!heard[v] && _writers.ready(v)) {
          done[v] = _writers.hear(v);
          heard[v] = true;
          --left;
        }
    }
    for (unsigned w = 0; w < _n; ++w) {
      _each[w].push_back(_gb / (done[w].end - done[w].start));
      _fleet_times.push_back(done[w].times);
    }
    _fleet.push_back(aggregate_gbps(done, _gb));
    ++_pass;
  }

  // The same bytes written raw, timed as the puts are: 'w' with all the threads, 's' with a
  // writer's share of them; by `n` writers at once.
  void raw(std::vector<double>& rates, unsigned n, char how) {
    for (unsigned w = 0; w < n; ++w) _writers.tell(w, how);
    std::vector<Message> done;
    for (unsigned w = 0; w < n; ++w) done.push_back(_writers.hear(w));
    rates.push_back(aggregate_gbps(done, _gb));
  }

  void raws() {
    raw(_raw_one, 1, 'w');
    raw(_raw_fleet, _n, 'w');
    raw(_raw_shared, _n, 's');
  }

  const Plan& _p;
  const unsigned _n;
  Writers& _writers;
  KVStore& _reader;
  const double _gb;
  std::uint64_t _pass = 0;
  std::vector<double> _one, _fleet, _lookups, _raw_one, _raw_fleet, _raw_shared;
  std::vector<std::vector<double>> _each;
  std::vector<KVPassTimes> _alone_times, _fleet_times;
};

}  // namespace

KVFleetBenchRow run_kv_fleet_bench(const KVBenchOptions& o) {
  const Plan p = plan_of(o);
  fs::create_directories(o.root);
  fs::remove_all(p.root);
  // Removed however the bench ends (after the writers are reaped: declared before them).
  struct Scratch {
    fs::path path;
    ~Scratch() {
      std::error_code ignored;
      fs::remove_all(path, ignored);
    }
  } scratch{p.root};

  KVFleetBenchRow row;
  row.writers = o.writers;
  row.block_bytes = p.block;
  row.blocks_per_writer = p.count;
  row.batch = p.batch;
  row.rounds = std::max(1u, o.rounds);
  Writers writers(p, o.writers);
  for (unsigned w = 0; w < o.writers; ++w) {  // one at a time: the first creates the store
    writers.tell(w, 'o');
    writers.hear(w);
  }
  KVStoreOptions reading;
  reading.read_only = true;
  KVStore reader = KVStore::open(p.root, p.ns, p.capacity, p.block, reading);
  FleetRounds rounds(p, writers, reader);
  rounds.warm_up();
  for (unsigned r = 0; r < row.rounds; ++r) rounds.round(r);
  rounds.finish(row, p.root / KVStore::directory_name(p.ns));
  return row;
}

#endif

}  // namespace ferry
