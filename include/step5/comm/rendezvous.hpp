#pragma once
/// \file step5/comm/rendezvous.hpp
/// Optional helper for drivers that run one process per GPU (the way engines and every
/// multi-node deployment run tensor parallelism): the rank environment that launchers set (the
/// variables torchrun uses) and a small TCP store on MASTER_ADDR:MASTER_PORT through which the
/// ranks meet, exchange the NCCL unique id and gather small blobs (checksums, timings).
///
/// Ownership rule: the library never calls this header and never creates a communicator. The
/// engine (here: examples/step5_driver.cpp) owns the rendezvous, creates the `ncclComm_t` from the
/// exchanged id and passes it, with its stream, to the ops (step5/comm/nccl.hpp).
///
/// Host-only (POSIX sockets, g++); no NCCL or CUDA dependency. Every wait is bounded by a timeout:
/// a rank that never arrives, or dies, gives a `step5::Error` (kIoError) naming this rank, the
/// peer, the address, the port and the seconds waited — never a hang. Bad environment values give
/// `step5::Error` (kInvalidArgument) naming the variable, its value and what is expected.
///
/// Topology: a star. Rank 0 listens on MASTER_ADDR:MASTER_PORT (the address MASTER_ADDR resolves
/// to) and accepts WORLD_SIZE - 1 connections; every other rank connects to it, retrying until
/// the timeout. Each collective (allgather, broadcast, barrier) sends one frame per rank to rank
/// 0, which answers every rank with all the frames. Frames carry the collective's sequence number
/// and kind, so ranks that call different collectives are caught (an error, not a wrong answer).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "step5/core/status.hpp"

namespace step5::comm {

// ---------------------------------------------------------------------------------------------
// The rank environment
// ---------------------------------------------------------------------------------------------

/// The rank environment of one process (the variables torchrun sets).
struct DistEnv {
  int rank = 0;                        ///< RANK: this process's rank in [0, world_size)
  int world_size = 1;                  ///< WORLD_SIZE: number of processes, >= 1
  int local_rank = 0;                  ///< LOCAL_RANK: rank on this host = the GPU index it uses
  std::string master_addr = "127.0.0.1";  ///< MASTER_ADDR: host of rank 0's store
  int master_port = 29500;             ///< MASTER_PORT: TCP port of rank 0's store, [1, 65535]
};

/// The largest WORLD_SIZE accepted (a sanity bound, far above any TP group).
inline constexpr int kMaxWorldSize = 65536;
/// The largest TCP port (MASTER_PORT and DistEnv::master_port are in [1, kMaxMasterPort]).
inline constexpr int kMaxMasterPort = 65535;

/// Looks a variable up (std::getenv in production; a map in tests). Returns nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;

namespace detail {
inline int env_int(const EnvLookup& get, const char* name, long long lo, long long hi) {
  const char* v = get(name);
  const std::string range = "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  if (v == nullptr)
    throw Error(StatusCode::kInvalidArgument, std::string("environment variable ") + name + " is not set: expected " + range);
  const std::string s(v);
  long long x = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (s.empty() || ec == std::errc::invalid_argument || p != s.data() + s.size())
    throw Error(StatusCode::kInvalidArgument,
                std::string("environment variable ") + name + "='" + s + "' is not an integer: expected " + range);
  if (ec == std::errc::result_out_of_range || x < lo || x > hi)
    throw Error(StatusCode::kInvalidArgument,
                std::string("environment variable ") + name + "=" + s + " is outside the allowed range: expected " + range);
  return static_cast<int>(x);
}
}  // namespace detail

/// Whether the environment asks for several processes: WORLD_SIZE is set (to anything; a bad
/// value is then refused by `dist_env_from`) and is not "1".
inline bool multiprocess_requested(const EnvLookup& get) {
  const char* w = get("WORLD_SIZE");
  return w != nullptr && std::string(w) != "1";
}

/// Reads and validates RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (all required).
/// Errors (step5::Error kInvalidArgument, naming the variable and value): unset; not an integer;
/// WORLD_SIZE outside [1, 65536]; RANK or LOCAL_RANK outside [0, WORLD_SIZE); MASTER_PORT outside
/// [1, 65535]; MASTER_ADDR empty or with a space. (Whether MASTER_ADDR resolves is checked when
/// the store starts, by `TcpStore`.)
inline DistEnv dist_env_from(const EnvLookup& get) {
  DistEnv e;
  e.world_size = detail::env_int(get, "WORLD_SIZE", 1, kMaxWorldSize);
  e.rank = detail::env_int(get, "RANK", 0, e.world_size - 1);
  e.local_rank = detail::env_int(get, "LOCAL_RANK", 0, e.world_size - 1);
  const char* a = get("MASTER_ADDR");
  if (a == nullptr)
    throw Error(StatusCode::kInvalidArgument,
                "environment variable MASTER_ADDR is not set: expected the host name or IP address of rank 0");
  e.master_addr = a;
  if (e.master_addr.empty() || e.master_addr.find_first_of(" \t\n") != std::string::npos)
    throw Error(StatusCode::kInvalidArgument, "environment variable MASTER_ADDR='" + e.master_addr +
                                                  "' is not a host name or IP address");
  e.master_port = detail::env_int(get, "MASTER_PORT", 1, kMaxMasterPort);
  return e;
}

/// `dist_env_from` over the process environment (std::getenv).
inline DistEnv dist_env() {
  return dist_env_from([](const char* n) -> const char* { return std::getenv(n); });
}

// ---------------------------------------------------------------------------------------------
// The TCP store
// ---------------------------------------------------------------------------------------------

/// Rank 0's store or a connection to it. Move-only; the destructor closes the sockets (the other
/// ranks then see the connection closed). Not thread-safe: one thread per process calls it.
class TcpStore {
 public:
  using Blob = std::vector<std::uint8_t>;
  /// The largest blob one rank may send in a collective (bounds what a damaged frame can ask for).
  static constexpr std::uint64_t kMaxBlobBytes = 1ull << 30;

  /// The longest timeout a store or a collective takes (30 days): a larger one (or +inf) would
  /// overflow the clock's duration and time out at once.
  static constexpr double kMaxTimeoutS = 30.0 * 24 * 3600;

  /// The wire protocol. A joining rank's hello is {kMagic, kVersion, rank, world_size} (u32 each);
  /// rank 0 acks {kMagic, world_size} once every rank is there, or, to a rank of another
  /// kVersion, {kMagic, kAckOtherVersion | rank 0's kVersion}, and both ranks throw
  /// kInvalidArgument naming the two versions (processes built from different step5 versions).
  static constexpr std::uint32_t kMagic = 0x53355256;  // "S5RV"
  static constexpr std::uint32_t kVersion = 2;          // 2: frames carry the collective's kind
  static constexpr std::uint32_t kAckOtherVersion = 0x80000000u;  // above any world size
  static_assert(static_cast<std::uint32_t>(kMaxWorldSize) < kAckOtherVersion, "an ack's world size never sets the flag");

  /// The rendezvous: rank 0 listens on env.master_addr:env.master_port and waits until every other
  /// rank has connected; the others connect (retrying while rank 0 is not yet listening). Returns
  /// when all env.world_size ranks are present, or throws step5::Error naming what is missing
  /// after `timeout_s` seconds (in (0, kMaxTimeoutS]; kInvalidArgument naming it otherwise).
  /// `env` follows dist_env_from's rules (a hand-built one too; kInvalidArgument naming the field
  /// otherwise): world_size in [1, kMaxWorldSize], 0 <= rank < world_size, master_port in
  /// [1, 65535], master_addr not empty. world_size 1: no socket is opened.
  TcpStore(const DistEnv& env, double timeout_s) : env_(env), timeout_s_(timeout_s) {
    check_timeout(timeout_s, "rendezvous timeout");
    if (env.world_size < 1 || env.world_size > kMaxWorldSize)
      throw Error(StatusCode::kInvalidArgument, "rendezvous: world_size " + std::to_string(env.world_size) +
                                                    ": expected [1, " + std::to_string(kMaxWorldSize) + "]");
    if (env.rank < 0 || env.rank >= env.world_size)
      throw Error(StatusCode::kInvalidArgument, "rendezvous: rank " + std::to_string(env.rank) + " of world size " +
                                                    std::to_string(env.world_size) + ": expected 0 <= rank < world size");
    if (env.world_size == 1) return;
    if (env.master_port < 1 || env.master_port > kMaxMasterPort)
      throw Error(StatusCode::kInvalidArgument, "rendezvous: master_port " + std::to_string(env.master_port) +
                                                    ": expected [1, " + std::to_string(kMaxMasterPort) + "]");
    if (env.master_addr.empty())
      throw Error(StatusCode::kInvalidArgument, "rendezvous: master_addr is empty: expected the host name or IP address of rank 0");
    const auto deadline = Clock::now() + seconds(timeout_s);
    try {  // a constructor that throws runs no destructor: close what is open (the other ranks
           // then see this rank's connections closed at once instead of waiting out their timeout)
      if (env.rank == 0) serve(deadline);
      else join(deadline);
    } catch (...) {
      close_all();
      throw;
    }
  }
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;
  TcpStore(TcpStore&& o) noexcept { *this = std::move(o); }
  TcpStore& operator=(TcpStore&& o) noexcept {
    if (this != &o) {
      close_all();
      env_ = o.env_, timeout_s_ = o.timeout_s_, seq_ = o.seq_;
      peers_ = std::move(o.peers_);
      o.peers_.clear();
    }
    return *this;
  }
  ~TcpStore() { close_all(); }

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  double timeout_s() const { return timeout_s_; }
  /// "127.0.0.1:29500"
  std::string address() const { return env_.master_addr + ":" + std::to_string(env_.master_port); }

  /// Every rank's `mine`, indexed by rank (the same on every rank). Blocks until every rank has
  /// called it, at most `timeout_s` seconds (the store's timeout when <= 0). Errors (step5::Error
  /// kIoError): a peer closed its connection (exited or was killed), sent nothing in time, or
  /// called a different collective; a blob over kMaxBlobBytes, a timeout above kMaxTimeoutS or
  /// NaN, a store that was moved from (kInvalidArgument).
  std::vector<Blob> allgather(const Blob& mine, double timeout_s = 0) {
    return collective(Collective::kAllgather, mine, timeout_s);
  }

  /// Rank 0's `blob` on every rank (what the other ranks pass is ignored). Errors: as allgather.
  Blob broadcast(const Blob& blob, double timeout_s = 0) {
    return collective(Collective::kBroadcast, env_.rank == 0 ? blob : Blob{}, timeout_s)[0];
  }

  /// Returns when every rank has called it. Errors: as allgather.
  void barrier(double timeout_s = 0) { (void)collective(Collective::kBarrier, Blob{}, timeout_s); }

  /// Without waiting: Ok while every connection this rank holds is open, else kIoError naming the
  /// rank whose connection closed (it exited or was killed). Rank 0 watches every rank; the others
  /// watch rank 0 (which, when it errors out, closes every connection: the failure spreads).
  /// kInvalidArgument for a store that was moved from.
  /// For watchdogs: poll it while waiting on something that a dead peer would block (a GPU
  /// collective).
  Status peers_alive() const {
    STEP5_RETURN_IF_ERROR(check_connected());
    for (int r = 0; r < static_cast<int>(peers_.size()); ++r) {
      const int fd = peers_[r];
      if (fd < 0) continue;
      pollfd p{fd, POLLIN | POLLRDHUP, 0};
      if (::poll(&p, 1, 0) <= 0) continue;
      if (p.revents & (POLLERR | POLLHUP | POLLRDHUP))
        return Status(StatusCode::kIoError, who() + ": rank " + std::to_string(r) + " closed its connection to the rendezvous at " +
                                                address() + " (it exited or was killed)");
      if (p.revents & POLLIN) {
        char c;
        const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 0)
          return Status(StatusCode::kIoError, who() + ": rank " + std::to_string(r) + " closed its connection to the rendezvous at " +
                                                  address() + " (it exited or was killed)");
      }
    }
    return Status::Ok();
  }

 private:
  using Clock = std::chrono::steady_clock;
  static void check_timeout(double s, const std::string& what) {
    if (s > 0 && s <= kMaxTimeoutS) return;
    throw Error(StatusCode::kInvalidArgument,
                what + " " + float_text(s) + " s: expected > 0 s and <= " + std::to_string(static_cast<long>(kMaxTimeoutS)) + " s (30 days)");
  }
  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }
  static double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  static int remaining_ms(Clock::time_point deadline) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return ms <= 0 ? 0 : static_cast<int>(std::min<long long>(ms, 1 << 30));
  }
  static std::string fmt_s(double s) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f s", s);
    return b;
  }
  // A store moved from holds no connection (its world size is still > 1): kInvalidArgument
  // instead of indexing its empty peer table (a null read) or reporting its peers alive.
  Status check_connected() const {
    if (env_.world_size > 1 && peers_.empty())
      return invalid_argument(who() + ": this TcpStore was moved from: it holds no connection to the rendezvous at " +
                              address() + " (use the store it was moved to)");
    return Status::Ok();
  }
  std::string who() const { return "rank " + std::to_string(env_.rank) + " of " + std::to_string(env_.world_size); }
  static std::string errno_text(int e) { return std::strerror(e); }

  // The resolved MASTER_ADDR (IPv4 or IPv6), for bind and connect.
  struct Resolved {
    sockaddr_storage addr{};
    socklen_t len = 0;
    int family = AF_INET;
  };
  Resolved resolve() const {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const std::string port = std::to_string(env_.master_port);
    const int rc = ::getaddrinfo(env_.master_addr.c_str(), port.c_str(), &hints, &res);
    if (rc != 0 || res == nullptr)
      throw Error(StatusCode::kInvalidArgument, who() + ": MASTER_ADDR='" + env_.master_addr +
                                                    "' does not resolve: " + ::gai_strerror(rc));
    Resolved r;
    std::memcpy(&r.addr, res->ai_addr, res->ai_addrlen);
    r.len = res->ai_addrlen;
    r.family = res->ai_family;
    ::freeaddrinfo(res);
    return r;
  }

  void serve(Clock::time_point deadline) {
    const auto t0 = Clock::now();
    const Resolved a = resolve();
    const int lfd = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0) throw Error(StatusCode::kIoError, who() + ": socket() failed: " + errno_text(errno));
    struct Closer {
      int fd;
      ~Closer() { ::close(fd); }
    } closer{lfd};
    const int one = 1;
    ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(lfd, reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0)
      throw Error(StatusCode::kIoError, who() + ": cannot listen on " + address() + ": bind failed: " + errno_text(errno) +
                                            " (another job on this port? choose another MASTER_PORT)");
    if (::listen(lfd, env_.world_size) != 0)
      throw Error(StatusCode::kIoError, who() + ": listen on " + address() + " failed: " + errno_text(errno));
    peers_.assign(env_.world_size, -1);
    int arrived = 1;
    std::string accept_error;  // the last failed accept (named if the rendezvous times out)
    int accept_errno = 0;
    while (arrived < env_.world_size) {
      pollfd p{lfd, POLLIN, 0};
      const int pr = ::poll(&p, 1, std::min(remaining_ms(deadline), 200));
      if (pr < 0 && errno != EINTR) throw Error(StatusCode::kIoError, who() + ": poll on " + address() + ": " + errno_text(errno));
      // the deadline bounds every pass, not only an idle one: a pending connection that accept
      // keeps refusing (EMFILE: no descriptor left) made poll answer at once, for ever
      if (Clock::now() >= deadline) {
        std::string missing;  // the first 32 missing ranks, then how many more
        int listed = 0, more = 0;
        for (int r = 1; r < env_.world_size; ++r)
          if (peers_[r] < 0) {
            if (listed < 32) missing += (listed++ ? ", " : "") + std::to_string(r);
            else ++more;
          }
        if (more > 0) missing += " and " + std::to_string(more) + " more";
        close_all();
        throw Error(StatusCode::kIoError, who() + ": only " + std::to_string(arrived) + " of " +
                                              std::to_string(env_.world_size) + " ranks arrived at the rendezvous on " +
                                              address() + " within " + fmt_s(since(t0)) + "; missing rank(s): " + missing +
                                              " (not started, crashed, or given another MASTER_ADDR/MASTER_PORT)" +
                                              (accept_error.empty() ? std::string()
                                                                    : "; the last accept() failed: " + accept_error +
                                                                          (accept_errno == EMFILE || accept_errno == ENFILE
                                                                               ? " (rank 0 has no file descriptor left for "
                                                                                 "a connection: raise `ulimit -n`)"
                                                                               : "")));
      }
      if (pr <= 0) continue;
      const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {  // the peer gave up between poll and accept, or no descriptor is left: keep
                     // waiting (not spinning) until the deadline
        accept_errno = errno;
        accept_error = errno_text(accept_errno);
        std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10, remaining_ms(deadline) + 1)));
        continue;
      }
      tune(fd);
      // The hello: magic, version, rank, world size. A connection that says something else (a
      // stray client, another job on this port) is dropped and named.
      std::uint32_t hello[4];
      try {  // a client that says nothing within 5 s (or by the deadline) is dropped
        recv_all(fd, hello, sizeof hello, -1, std::min(deadline, Clock::now() + seconds(5.0)), t0, "the rendezvous hello");
      } catch (const Error&) {
        ::close(fd);
        continue;
      }
      const int r = static_cast<int>(hello[2]), ws = static_cast<int>(hello[3]);
      if (hello[0] != kMagic) {
        ::close(fd);
        std::fprintf(stderr, "[step5] %s: dropped a connection to %s that is not a step5 rendezvous client\n",
                     who().c_str(), address().c_str());
        continue;
      }
      std::string bad;
      if (hello[1] != kVersion) {  // a step5 rank of another build: tell it which version this is
        const std::uint32_t refusal[2] = {kMagic, kAckOtherVersion | kVersion};
        try {
          send_all(fd, refusal, sizeof refusal, -1, std::min(deadline, Clock::now() + seconds(5.0)), t0,
                   "the rendezvous refusal");
        } catch (const Error&) {  // it left already: the error below is still the one to give
        }
        bad = "rank " + std::to_string(r) + " speaks rendezvous protocol version " + std::to_string(hello[1]) +
              ", rank 0 version " + std::to_string(kVersion) + " (processes built from different step5 versions)";
      } else if (ws != env_.world_size)
        bad = "rank " + std::to_string(r) + " has WORLD_SIZE " + std::to_string(ws) + ", rank 0 has " +
              std::to_string(env_.world_size);
      else if (r <= 0 || r >= env_.world_size)
        bad = "a rank " + std::to_string(r) + " connected: expected a rank in [1, " + std::to_string(env_.world_size) + ")";
      else if (peers_[r] >= 0)
        bad = "rank " + std::to_string(r) + " connected twice (two processes with RANK=" + std::to_string(r) + ")";
      if (!bad.empty()) {
        ::close(fd);
        close_all();
        throw Error(StatusCode::kInvalidArgument, who() + ": rendezvous on " + address() + ": " + bad);
      }
      peers_[r] = fd;
      ++arrived;
    }
    // Everyone is here: tell them (the ack carries the world size once more).
    for (int r = 1; r < env_.world_size; ++r) {
      const std::uint32_t ack[2] = {kMagic, static_cast<std::uint32_t>(env_.world_size)};
      send_all(peers_[r], ack, sizeof ack, r, deadline, t0, "the rendezvous ack");
    }
  }

  void join(Clock::time_point deadline) {
    const auto t0 = Clock::now();
    const Resolved a = resolve();
    std::string last = "no attempt";
    int fd = -1;
    while (fd < 0) {
      if (Clock::now() >= deadline)
        throw Error(StatusCode::kIoError, who() + ": could not reach rank 0's rendezvous at " + address() + " within " +
                                              fmt_s(since(t0)) + " (last error: " + last +
                                              "; is rank 0 running, with the same MASTER_ADDR/MASTER_PORT?)");
      // non-blocking, so that the connect waits no longer than the deadline (a blocking one to a
      // host that drops packets waits the kernel's SYN retries, about 2 minutes)
      const int s = ::socket(a.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (s < 0) throw Error(StatusCode::kIoError, who() + ": socket() failed: " + errno_text(errno));
      int err = ::connect(s, reinterpret_cast<const sockaddr*>(&a.addr), a.len) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        pollfd q{s, POLLOUT, 0};
        const int pr = ::poll(&q, 1, std::max(1, std::min(remaining_ms(deadline), 1000)));
        socklen_t len = sizeof err;
        if (pr > 0) err = ::getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) == 0 ? err : errno;
        else err = pr == 0 ? ETIMEDOUT : errno;
      }
      if (err == 0) {
        fd = s;
        break;
      }
      last = errno_text(err);
      ::close(s);
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(50, remaining_ms(deadline) + 1)));
    }
    tune(fd);
    peers_.assign(1, fd);
    const std::uint32_t hello[4] = {kMagic, kVersion, static_cast<std::uint32_t>(env_.rank),
                                    static_cast<std::uint32_t>(env_.world_size)};
    send_all(fd, hello, sizeof hello, 0, deadline, t0, "the rendezvous hello");
    std::uint32_t ack[2];
    recv_all(fd, ack, sizeof ack, 0, deadline, t0, "the rendezvous ack (rank 0 waits for every rank)");
    if (ack[0] == kMagic && (ack[1] & kAckOtherVersion) != 0)
      throw Error(StatusCode::kInvalidArgument,
                  who() + ": rank 0's rendezvous at " + address() + " speaks protocol version " +
                      std::to_string(ack[1] & ~kAckOtherVersion) + ", this rank version " + std::to_string(kVersion) +
                      " (processes built from different step5 versions)");
    if (ack[0] != kMagic || static_cast<int>(ack[1]) != env_.world_size)
      throw Error(StatusCode::kIoError, who() + ": " + address() + " answered the rendezvous with something else "
                                                                   "(another program on MASTER_PORT?)");
  }

  static void tune(int fd) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }

  // Sends or receives exactly n bytes before the deadline; `peer` is the rank on the other end
  // (-1: not known yet). Errors name this rank, the peer, the address, what and the seconds waited.
  void send_all(int fd, const void* data, std::size_t n, int peer, Clock::time_point deadline, Clock::time_point t0,
                const std::string& what) const {
    const auto* p = static_cast<const std::uint8_t*>(data);
    while (n > 0) {
      pollfd q{fd, POLLOUT, 0};
      const int pr = ::poll(&q, 1, std::min(remaining_ms(deadline), 200));
      if (pr < 0 && errno != EINTR) fail(peer, what, "poll: " + errno_text(errno), t0);
      if (pr <= 0) {
        if (Clock::now() >= deadline) fail(peer, what, "could not send within the timeout", t0);
        continue;
      }
      const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        fail(peer, what, errno == EPIPE || errno == ECONNRESET ? closed_text(peer) : "send: " + errno_text(errno), t0);
      }
      p += k, n -= static_cast<std::size_t>(k);
    }
  }
  void recv_all(int fd, void* data, std::size_t n, int peer, Clock::time_point deadline, Clock::time_point t0,
                const std::string& what) const {
    auto* p = static_cast<std::uint8_t*>(data);
    while (n > 0) {
      pollfd q{fd, POLLIN, 0};
      const int pr = ::poll(&q, 1, std::min(remaining_ms(deadline), 200));
      if (pr < 0 && errno != EINTR) fail(peer, what, "poll: " + errno_text(errno), t0);
      if (pr <= 0) {
        if (Clock::now() >= deadline)
          fail(peer, what, (peer >= 0 ? "rank " + std::to_string(peer) : std::string("the peer")) +
                               " sent nothing within the timeout (stuck, or not at this collective)", t0);
        continue;
      }
      const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
      if (k == 0) fail(peer, what, closed_text(peer), t0);
      if (k < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        fail(peer, what, errno == ECONNRESET ? closed_text(peer) : "recv: " + errno_text(errno), t0);
      }
      p += k, n -= static_cast<std::size_t>(k);
    }
  }
  static std::string closed_text(int peer) {
    return (peer >= 0 ? "rank " + std::to_string(peer) : std::string("the peer")) +
           " closed the connection (it exited or was killed)";
  }
  [[noreturn]] void fail(int /*peer: named in `why`*/, const std::string& what, const std::string& why,
                         Clock::time_point t0) const {
    throw Error(StatusCode::kIoError, who() + ": rendezvous at " + address() + ", " + what + ": " + why + " (after " +
                                          fmt_s(since(t0)) + ")");
  }

  // The collectives, one frame exchange each; frames carry (seq, kind): a rank at another
  // collective, by count or by kind, is an error naming both.
  enum class Collective : std::uint32_t { kAllgather = 1, kBroadcast = 2, kBarrier = 3 };
  static std::string collective_name(std::uint32_t k) {
    switch (static_cast<Collective>(k)) {
      case Collective::kAllgather: return "allgather";
      case Collective::kBroadcast: return "broadcast";
      case Collective::kBarrier: return "barrier";
    }
    return "an unknown collective kind " + std::to_string(k);
  }
  std::vector<Blob> collective(Collective kind, const Blob& mine, double timeout_s) {
    if (timeout_s > 0 || std::isnan(timeout_s)) check_timeout(timeout_s, who() + ": collective timeout");
    if (mine.size() > kMaxBlobBytes)
      throw Error(StatusCode::kInvalidArgument, who() + ": " + collective_name(static_cast<std::uint32_t>(kind)) + " of " +
                                                    std::to_string(mine.size()) +
                                                    " bytes: at most " + std::to_string(kMaxBlobBytes) + " bytes per rank");
    throw_if_error(check_connected());
    const std::uint32_t seq = ++seq_;
    std::vector<Blob> all(env_.world_size);
    all[env_.rank] = mine;
    if (env_.world_size == 1) return all;
    const double t = timeout_s > 0 ? timeout_s : timeout_s_;
    const auto t0 = Clock::now();
    const auto deadline = t0 + seconds(t);
    const std::string what = "collective #" + std::to_string(seq);
    if (env_.rank == 0) {
      for (int r = 1; r < env_.world_size; ++r) all[r] = recv_frame(peers_[r], r, seq, kind, deadline, t0, what);
      for (int r = 1; r < env_.world_size; ++r)
        for (int s = 0; s < env_.world_size; ++s) send_frame(peers_[r], r, seq, kind, all[s], deadline, t0, what);
    } else {
      send_frame(peers_[0], 0, seq, kind, mine, deadline, t0, what);
      for (int s = 0; s < env_.world_size; ++s) all[s] = recv_frame(peers_[0], 0, seq, kind, deadline, t0, what);
    }
    return all;
  }

  // A frame: {sequence number u32, collective kind u32, length u64} + the bytes.
  void send_frame(int fd, int peer, std::uint32_t seq, Collective kind, const Blob& b, Clock::time_point deadline,
                  Clock::time_point t0, const std::string& what) const {
    std::uint8_t h[16];
    const std::uint64_t len = b.size();
    const auto k = static_cast<std::uint32_t>(kind);
    std::memcpy(h, &seq, 4);
    std::memcpy(h + 4, &k, 4);
    std::memcpy(h + 8, &len, 8);
    send_all(fd, h, sizeof h, peer, deadline, t0, what);
    if (!b.empty()) send_all(fd, b.data(), b.size(), peer, deadline, t0, what);
  }
  Blob recv_frame(int fd, int peer, std::uint32_t seq, Collective kind, Clock::time_point deadline, Clock::time_point t0,
                  const std::string& what) const {
    std::uint8_t h[16];
    recv_all(fd, h, sizeof h, peer, deadline, t0, what);
    std::uint32_t s = 0, k = 0;
    std::uint64_t len = 0;
    std::memcpy(&s, h, 4);
    std::memcpy(&k, h + 4, 4);
    std::memcpy(&len, h + 8, 8);
    if (s != seq || k != static_cast<std::uint32_t>(kind))
      fail(peer, what, "rank " + std::to_string(peer) + " is at collective #" + std::to_string(s) + " (" +
                           collective_name(k) + "), this rank at #" + std::to_string(seq) + " (" +
                           collective_name(static_cast<std::uint32_t>(kind)) + ") (the ranks called different collectives)",
           t0);
    if (len > kMaxBlobBytes)
      fail(peer, what, "rank " + std::to_string(peer) + " sent a frame of " + std::to_string(len) + " bytes (at most " +
                           std::to_string(kMaxBlobBytes) + ")", t0);
    Blob b(len);
    if (len > 0) recv_all(fd, b.data(), len, peer, deadline, t0, what);
    return b;
  }

  void close_all() {
    for (int& fd : peers_)
      if (fd >= 0) ::close(fd), fd = -1;
    peers_.clear();
  }

  DistEnv env_;
  double timeout_s_ = 0;
  std::uint32_t seq_ = 0;
  std::vector<int> peers_;  // rank 0: [rank] -> fd (peers_[0] = -1); others: {fd of rank 0}
};

/// A trivially copyable value as a blob (e.g. ncclUniqueId, a double checksum).
template <class T>
TcpStore::Blob to_blob(const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  TcpStore::Blob b(sizeof(T));
  std::memcpy(b.data(), &v, sizeof(T));
  return b;
}
/// The value of a blob made by to_blob<T>; Error (kIoError) when its size is not sizeof(T).
template <class T>
T from_blob(const TcpStore::Blob& b, const char* what) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (b.size() != sizeof(T))
    throw Error(StatusCode::kIoError, std::string("rendezvous: ") + what + " has " + std::to_string(b.size()) +
                                          " bytes, expected " + std::to_string(sizeof(T)));
  T v;
  std::memcpy(&v, b.data(), sizeof(T));
  return v;
}

}  // namespace step5::comm
