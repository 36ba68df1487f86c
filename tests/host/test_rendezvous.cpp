// The rendezvous of one-process-per-GPU runs (step5/comm/rendezvous.hpp, issue 16): processes of
// this machine (fork, loopback only) meet through the TCP store, exchange an NCCL-sized unique id
// and gather blobs; a rank that never arrives, a rank killed mid-run and a stuck rank give the
// others a clear error (naming the rank, the address and the seconds) within the timeout — every
// wait here is bounded, the child processes are killed if they outlive their bound; bad
// environment values are refused naming the variable and the value.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "step5/comm/rendezvous.hpp"

using step5::Error;
using step5::StatusCode;
using step5::comm::DistEnv;
using step5::comm::TcpStore;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The IPv4 loopback address at `port`.
sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  return a;
}

// A port that is free on the loopback now (bind to port 0, read it back, release it).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a = loopback(0);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

DistEnv env_of(int rank, int world_size, int port) {
  DistEnv e;
  e.rank = rank;
  e.world_size = world_size;
  e.local_rank = rank;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  return e;
}

// A child process running `fn` (its exit code; an exception's message goes back through a pipe
// and the exit code is 100).
struct Child {
  pid_t pid = -1;
  int out = -1;
};
Child spawn(const std::function<int()>& fn) {
  int p[2];
  REQUIRE(::pipe(p) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(p[0]);
    int code = 0;
    try {
      code = fn();
    } catch (const std::exception& e) {
      const std::string m = e.what();
      (void)!::write(p[1], m.data(), m.size());
      code = 100;
    }
    ::close(p[1]);
    ::_exit(code);
  }
  ::close(p[1]);
  return {pid, p[0]};
}
struct Exit {
  int code = -1;  // exit status, 128 + signal when killed, -1 when it outlived the bound (then killed)
  std::string message;
};
// Waits at most `bound_s` seconds; a child still running then is killed (never a hung test).
Exit wait_child(const Child& c, double bound_s) {
  Exit e;
  const auto t0 = Clock::now();
  int st = 0;
  for (;;) {
    const pid_t r = ::waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid) {
      e.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    if (since(t0) > bound_s) {
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &st, 0);
      e.code = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  char buf[4096];
  ssize_t n;
  while ((n = ::read(c.out, buf, sizeof buf)) > 0) e.message.append(buf, static_cast<std::size_t>(n));
  ::close(c.out);
  return e;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("two processes rendezvous and exchange an NCCL-sized unique id, then gather per-rank blobs") {
  const int port = free_port();
  // Rank 1 sends back what it received, so rank 0 checks the bytes that crossed the store.
  const Child c = spawn([&] {
    TcpStore s(env_of(1, 2, port), 20.0);
    const TcpStore::Blob id = s.broadcast({});
    const auto echo = s.allgather(id);
    const auto sums = s.allgather(step5::comm::to_blob(2.5));
    if (step5::comm::from_blob<double>(sums[0], "rank 0's checksum") != 1.25) return 3;
    s.barrier();
    return 0;
  });
  std::array<std::uint8_t, 128> unique_id{};  // ncclUniqueId is 128 bytes
  std::mt19937 rng(static_cast<unsigned>(port));
  for (auto& b : unique_id) b = static_cast<std::uint8_t>(rng());
  const TcpStore::Blob id(unique_id.begin(), unique_id.end());
  {
    TcpStore s(env_of(0, 2, port), 20.0);
    CHECK(s.broadcast(id) == id);
    const auto echo = s.allgather(id);
    REQUIRE(echo.size() == 2);
    CHECK(echo[1] == id);  // rank 1 received exactly rank 0's id
    const auto sums = s.allgather(step5::comm::to_blob(1.25));
    CHECK(step5::comm::from_blob<double>(sums[1], "rank 1's checksum") == 2.5);
    CHECK(s.peers_alive().ok());  // (rank 1 may exit once the barrier below is passed)
    s.barrier();
  }
  const Exit e = wait_child(c, 20.0);
  CHECK_MESSAGE(e.code == 0, e.message);
}

TEST_CASE("four processes: every rank gets every rank's blob in rank order") {
  const int port = free_port(), n = 4;
  auto blob_of = [](int r) { return TcpStore::Blob(static_cast<std::size_t>(r * 1000 + 7), static_cast<std::uint8_t>(r + 1)); };
  std::vector<Child> kids;
  for (int r = 1; r < n; ++r)
    kids.push_back(spawn([&, r] {
      TcpStore s(env_of(r, n, port), 20.0);
      for (int round = 0; round < 3; ++round) {
        const auto all = s.allgather(blob_of(r));
        for (int q = 0; q < n; ++q)
          if (all[q] != blob_of(q)) return 10 + q;
      }
      return 0;
    }));
  TcpStore s(env_of(0, n, port), 20.0);
  for (int round = 0; round < 3; ++round) {
    const auto all = s.allgather(blob_of(0));
    for (int q = 0; q < n; ++q) CHECK(all[q] == blob_of(q));
  }
  for (const Child& c : kids) {
    const Exit e = wait_child(c, 20.0);
    CHECK_MESSAGE(e.code == 0, e.message);
  }
}

TEST_CASE("a rank that never arrives: rank 0 errors out within the timeout, naming the missing rank") {
  const int port = free_port();
  const auto t0 = Clock::now();
  const std::string m = error_of([&] { TcpStore s(env_of(0, 3, port), 1.0); });
  const double dt = since(t0);
  CHECK(dt >= 0.9);
  CHECK(dt < 5.0);
  CHECK_MESSAGE(contains(m, "rank 0 of 3: only 1 of 3 ranks arrived at the rendezvous on 127.0.0.1:" + std::to_string(port) +
                                " within 1."), m);
  CHECK_MESSAGE(contains(m, "missing rank(s): 1, 2"), m);
  // many missing ranks: the first 32 named, then how many more (a world of 65536 listed them all)
  const std::string many = error_of([&] { TcpStore s(env_of(0, 40, free_port()), 0.3); });
  CHECK_MESSAGE(contains(many, "missing rank(s): 1, 2, 3,"), many);
  CHECK_MESSAGE(contains(many, ", 31, 32 and 7 more (not started"), many);
}

TEST_CASE("rank 0 out of file descriptors: the rendezvous still times out, naming the failed accept") {
  // a pending connection that accept refuses (EMFILE) made poll answer at once, for ever: rank 0
  // spun at 100 % CPU past its 1 s timeout (killed here by wait_child's bound)
  const int port = free_port();
  const Child root = spawn([&] {
    const int lowest_free = ::dup(0);  // the listener takes this one; accept finds none left
    ::close(lowest_free);
    rlimit rl{};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    const rlimit before = rl;
    rl.rlim_cur = static_cast<rlim_t>(lowest_free + 1);
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) return 3;
    try {
      TcpStore s(env_of(0, 2, port), 1.0);
    } catch (...) {
      ::setrlimit(RLIMIT_NOFILE, &before);  // (the sanitizers' reports need descriptors)
      throw;
    }
    return 4;  // must not meet rank 1
  });
  const auto t1 = Clock::now();
  const std::string m1 = error_of([&] { TcpStore s(env_of(1, 2, port), 8.0); });
  const double rank1_s = since(t1);
  const Exit e = wait_child(root, 6.0);
  CHECK_MESSAGE(e.code == 100, e.code);
  CHECK_MESSAGE(contains(e.message, "rank 0 of 2: only 1 of 2 ranks arrived at the rendezvous on 127.0.0.1:" +
                                        std::to_string(port) + " within 1."), e.message);
  CHECK_MESSAGE(contains(e.message, "the last accept() failed: Too many open files (rank 0 has no file descriptor "
                                    "left for a connection: raise `ulimit -n`)"), e.message);
  // rank 1 learns of it when rank 0 gives up and exits (without the fix: its own 8 s timeout)
  CHECK_MESSAGE(contains(m1, "rank 1 of 2: rendezvous at 127.0.0.1:" + std::to_string(port)), m1);
  CHECK_MESSAGE(contains(m1, "closed the connection"), m1);
  CHECK_MESSAGE(rank1_s < 5.0, rank1_s);
}

TEST_CASE("rank 0 never starts: rank 1 errors out within the timeout, naming the address") {
  const int port = free_port();
  const auto t0 = Clock::now();
  const std::string m = error_of([&] { TcpStore s(env_of(1, 2, port), 1.0); });
  CHECK(since(t0) < 5.0);
  CHECK_MESSAGE(contains(m, "rank 1 of 2: could not reach rank 0's rendezvous at 127.0.0.1:" + std::to_string(port) +
                                " within 1."), m);
  CHECK_MESSAGE(contains(m, "Connection refused"), m);
  // an address that never answers (TEST-NET-1, RFC 5737): the connect is bounded by the timeout
  // too (a blocking connect waited the kernel's SYN retries: 3.1 s for a 0.2 s timeout here)
  DistEnv e = env_of(1, 2, port);
  e.master_addr = "192.0.2.77";
  const auto t1 = Clock::now();
  const std::string m2 = error_of([&] { TcpStore s(e, 0.5); });
  CHECK_MESSAGE(since(t1) < 2.0, since(t1));
  CHECK_MESSAGE(contains(m2, "rank 1 of 2: could not reach rank 0's rendezvous at 192.0.2.77:"), m2);
}

TEST_CASE("a rank killed mid-run: the other errors out at once (no hang), and peers_alive names it") {
  SUBCASE("rank 1 killed: rank 0's next collective fails") {
    const int port = free_port();
    const Child c = spawn([&] {
      TcpStore s(env_of(1, 2, port), 20.0);
      s.barrier();
      ::pause();  // "mid-run": alive until killed
      return 0;
    });
    TcpStore s(env_of(0, 2, port), 30.0);
    s.barrier();
    CHECK(s.peers_alive().ok());
    ::kill(c.pid, SIGKILL);
    const Exit e = wait_child(c, 10.0);
    CHECK(e.code == 128 + SIGKILL);
    const step5::Status alive = s.peers_alive();
    CHECK(alive.code() == StatusCode::kIoError);
    CHECK_MESSAGE(contains(alive.message(), "rank 0 of 2: rank 1 closed its connection to the rendezvous at 127.0.0.1:" +
                                                std::to_string(port) + " (it exited or was killed)"), alive.message());
    const auto t0 = Clock::now();
    const std::string m = error_of([&] { s.barrier(); });
    CHECK(since(t0) < 5.0);  // far below the 30 s timeout: the closed connection is seen at once
    CHECK_MESSAGE(contains(m, "rank 0 of 2: rendezvous at 127.0.0.1:" + std::to_string(port) +
                                  ", collective #2: rank 1 closed the connection (it exited or was killed)"), m);
  }
  SUBCASE("rank 0 killed: rank 1's next collective fails") {
    const int port = free_port();
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const Child root = spawn([&] {
      TcpStore s(env_of(0, 2, port), 20.0);
      s.barrier();
      (void)!::write(ready[1], "kk", 2);  // one byte for the parent, one for rank 1
      ::pause();
      return 0;
    });
    const Child c = spawn([&] {
      TcpStore s(env_of(1, 2, port), 30.0);
      s.barrier();
      char k;
      (void)!::read(ready[0], &k, 1);          // rank 0 is past the barrier
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // and now killed (below)
      const auto t0 = Clock::now();
      try {
        s.barrier();
      } catch (const Error& e) {
        if (since(t0) > 5.0) return 4;
        throw;
      }
      return 5;  // the barrier must not succeed
    });
    char k;
    REQUIRE(::read(ready[0], &k, 1) == 1);
    ::kill(root.pid, SIGKILL);
    (void)wait_child(root, 10.0);
    const Exit e = wait_child(c, 15.0);
    CHECK(e.code == 100);
    CHECK_MESSAGE(contains(e.message, "rank 1 of 2: rendezvous at 127.0.0.1:" + std::to_string(port) +
                                          ", collective #2: rank 0 closed the connection (it exited or was killed)"),
                  e.message);
    ::close(ready[0]);
    ::close(ready[1]);
  }
}

TEST_CASE("a stuck rank (alive, never at the collective): the collective times out naming it") {
  const int port = free_port();
  const Child c = spawn([&] {
    TcpStore s(env_of(1, 2, port), 20.0);
    std::this_thread::sleep_for(std::chrono::seconds(4));  // never calls the barrier; closes after
    return 0;
  });
  TcpStore s(env_of(0, 2, port), 20.0);
  const auto t0 = Clock::now();
  const std::string m = error_of([&] { s.barrier(1.0); });
  CHECK(since(t0) < 3.0);
  CHECK_MESSAGE(contains(m, "collective #1: rank 1 sent nothing within the timeout"), m);
  CHECK_MESSAGE(contains(m, "(after 1."), m);
  (void)wait_child(c, 10.0);
}

TEST_CASE("ranks at different collectives (barrier against broadcast) error out naming both, no wrong answer") {
  // the same count of collectives, different kinds: the frames' sequence numbers agree, their
  // kinds do not (every collective was one allgather: rank 0's broadcast returned its blob and
  // rank 1's barrier returned, both Ok)
  const int port = free_port();
  const Child c = spawn([&] {
    TcpStore s(env_of(1, 2, port), 20.0);
    s.barrier(5.0);
    return 0;
  });
  std::string m;
  {
    TcpStore s(env_of(0, 2, port), 20.0);
    m = error_of([&] { (void)s.broadcast(TcpStore::Blob{1, 2, 3}, 5.0); });
  }  // closes rank 0's connections: rank 1, waiting for the answer, errors out at once
  CHECK_MESSAGE(contains(m, "rank 0 of 2: rendezvous at 127.0.0.1:" + std::to_string(port) +
                                ", collective #1: rank 1 is at collective #1 (barrier), this rank at #1 (broadcast) "
                                "(the ranks called different collectives)"),
                m);
  const Exit e = wait_child(c, 10.0);
  CHECK(e.code == 100);
  CHECK_MESSAGE(contains(e.message, "collective #1: rank 0 closed the connection"), e.message);
}

TEST_CASE("mismatched WORLD_SIZE or a duplicate RANK is refused by rank 0, naming both") {
  SUBCASE("world size") {
    const int port = free_port();
    const Child c = spawn([&] {
      TcpStore s(env_of(1, 3, port), 5.0);
      return 0;
    });
    const std::string m = error_of([&] { TcpStore s(env_of(0, 2, port), 10.0); });
    CHECK_MESSAGE(contains(m, "rank 1 has WORLD_SIZE 3, rank 0 has 2"), m);
    const Exit e = wait_child(c, 10.0);
    CHECK(e.code == 100);  // rank 1 is told too (the connection closes)
  }
  SUBCASE("duplicate rank") {
    const int port = free_port();
    auto dup = [&] {
      TcpStore s(env_of(1, 3, port), 5.0);
      return 0;
    };
    const Child a = spawn(dup);
    const Child b = spawn(dup);
    const std::string m = error_of([&] { TcpStore s(env_of(0, 3, port), 10.0); });
    CHECK_MESSAGE(contains(m, "rank 1 connected twice (two processes with RANK=1)"), m);
    CHECK(wait_child(a, 10.0).code == 100);
    CHECK(wait_child(b, 10.0).code == 100);
  }
}

// A raw loopback connection to `port` (retrying while nothing listens yet), or -1 after bound_s.
int connect_raw(int port, double bound_s) {
  const auto t0 = Clock::now();
  while (since(t0) < bound_s) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    if (fd >= 0) ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

TEST_CASE("ranks of another rendezvous protocol version are refused on both sides, naming both versions") {
  SUBCASE("rank 0 meets a rank of another version") {
    const int port = free_port();
    const Child c = spawn([&] {  // rank 1 of a later build: its hello names version kVersion + 1
      const int fd = connect_raw(port, 10.0);
      if (fd < 0) return 2;
      const std::uint32_t hello[4] = {TcpStore::kMagic, TcpStore::kVersion + 1, 1, 2};
      if (::write(fd, hello, sizeof hello) != static_cast<ssize_t>(sizeof hello)) return 3;
      std::uint32_t ack[2] = {0, 0};
      const bool got = ::recv(fd, ack, sizeof ack, MSG_WAITALL) == static_cast<ssize_t>(sizeof ack);
      ::close(fd);
      // rank 0 tells it which version it speaks
      return got && ack[0] == TcpStore::kMagic && ack[1] == (TcpStore::kAckOtherVersion | TcpStore::kVersion) ? 0 : 4;
    });
    const std::string m = error_of([&] { TcpStore s(env_of(0, 2, port), 10.0); });
    CHECK_MESSAGE(contains(m, "rank 1 speaks rendezvous protocol version " + std::to_string(TcpStore::kVersion + 1) +
                                  ", rank 0 version " + std::to_string(TcpStore::kVersion)),
                  m);
    CHECK(wait_child(c, 10.0).code == 0);
  }
  SUBCASE("a rank meets rank 0 of another version") {
    const int port = free_port();
    const Child c = spawn([&] {  // rank 0 of a later build: refuses rank 1's hello with its version
      const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
      const int one = 1;
      ::setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      sockaddr_in a = loopback(port);
      if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(lfd, 4) != 0) return 2;
      const int fd = ::accept(lfd, nullptr, nullptr);
      if (fd < 0) return 3;
      std::uint32_t hello[4];
      if (::recv(fd, hello, sizeof hello, MSG_WAITALL) != static_cast<ssize_t>(sizeof hello)) return 4;
      const std::uint32_t refusal[2] = {TcpStore::kMagic, TcpStore::kAckOtherVersion | (TcpStore::kVersion + 1)};
      (void)!::write(fd, refusal, sizeof refusal);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::close(fd);
      ::close(lfd);
      return hello[0] == TcpStore::kMagic && hello[1] == TcpStore::kVersion ? 0 : 5;
    });
    const std::string m = error_of([&] { TcpStore s(env_of(1, 2, port), 10.0); });
    CHECK_MESSAGE(contains(m, "speaks protocol version " + std::to_string(TcpStore::kVersion + 1) +
                                  ", this rank version " + std::to_string(TcpStore::kVersion)),
                  m);
    CHECK(wait_child(c, 10.0).code == 0);
  }
}

TEST_CASE("a port in use is refused by rank 0, naming the address") {
  const int port = free_port();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 1) == 0);
  const std::string m = error_of([&] { TcpStore s(env_of(0, 2, port), 1.0); });
  CHECK_MESSAGE(contains(m, "rank 0 of 2: cannot listen on 127.0.0.1:" + std::to_string(port) + ": bind failed"), m);
  ::close(fd);
}

TEST_CASE("a store moved from is refused by its collectives and peers_alive, naming it (no null read)") {
  // it kept world size 2 with an empty peer table: allgather read peers_[1] of it (SIGSEGV)
  // and peers_alive reported every peer alive
  const int port = free_port();
  const Child c = spawn([&] {
    TcpStore s(env_of(1, 2, port), 20.0);
    s.barrier();
    return 0;
  });
  TcpStore a(env_of(0, 2, port), 20.0);
  TcpStore b = std::move(a);
  const std::string m = error_of([&] { a.barrier(0.5); });
  CHECK_MESSAGE(contains(m, "rank 0 of 2: this TcpStore was moved from: it holds no connection to the rendezvous at 127.0.0.1:" +
                                std::to_string(port)), m);
  const step5::Status alive = a.peers_alive();
  CHECK(alive.code() == StatusCode::kInvalidArgument);
  CHECK_MESSAGE(contains(alive.message(), "this TcpStore was moved from"), alive.message());
  CHECK(b.peers_alive().ok());
  b.barrier();  // the store it was moved to still works
  const Exit e = wait_child(c, 20.0);
  CHECK_MESSAGE(e.code == 0, e.message);
}

TEST_CASE("world size 1 needs no socket; collectives return its own blob") {
  TcpStore s(env_of(0, 1, 1), 1.0);
  const auto all = s.allgather({1, 2, 3});
  REQUIRE(all.size() == 1);
  CHECK(all[0] == TcpStore::Blob{1, 2, 3});
  s.barrier();
}

TEST_CASE("the rank environment: valid values are read, bad ones refused naming the variable and value") {
  std::map<std::string, std::string> env = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29511"}};
  auto get = [&](const char* n) -> const char* {
    const auto it = env.find(n);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const DistEnv e = step5::comm::dist_env_from(get);
  CHECK(e.rank == 1);
  CHECK(e.world_size == 2);
  CHECK(e.local_rank == 1);
  CHECK(e.master_addr == "10.0.0.5");
  CHECK(e.master_port == 29511);
  CHECK(step5::comm::multiprocess_requested(get));

  struct Bad {
    const char* var;
    const char* value;  // nullptr: unset
    const char* message;
  };
  const Bad bad[] = {
      {"WORLD_SIZE", "abc", "environment variable WORLD_SIZE='abc' is not an integer: expected an integer in [1, 65536]"},
      {"WORLD_SIZE", "0", "environment variable WORLD_SIZE=0 is outside the allowed range: expected an integer in [1, 65536]"},
      {"WORLD_SIZE", "2x", "environment variable WORLD_SIZE='2x' is not an integer"},
      {"WORLD_SIZE", "", "environment variable WORLD_SIZE='' is not an integer"},
      {"RANK", "2", "environment variable RANK=2 is outside the allowed range: expected an integer in [0, 1]"},
      {"RANK", "-1", "environment variable RANK=-1 is outside the allowed range: expected an integer in [0, 1]"},
      {"RANK", nullptr, "environment variable RANK is not set: expected an integer in [0, 1]"},
      {"LOCAL_RANK", nullptr, "environment variable LOCAL_RANK is not set"},
      {"LOCAL_RANK", "99999999999999999999", "environment variable LOCAL_RANK=99999999999999999999 is outside the allowed range"},
      {"MASTER_PORT", "70000", "environment variable MASTER_PORT=70000 is outside the allowed range: expected an integer in [1, 65535]"},
      {"MASTER_PORT", "0", "environment variable MASTER_PORT=0 is outside the allowed range"},
      {"MASTER_PORT", nullptr, "environment variable MASTER_PORT is not set"},
      {"MASTER_ADDR", "", "environment variable MASTER_ADDR='' is not a host name or IP address"},
      {"MASTER_ADDR", "a b", "environment variable MASTER_ADDR='a b' is not a host name or IP address"},
      {"MASTER_ADDR", nullptr, "environment variable MASTER_ADDR is not set"},
  };
  for (const Bad& b : bad) {
    CAPTURE(b.var);
    CAPTURE(b.value);
    auto env2 = env;
    if (b.value) env2[b.var] = b.value;
    else env2.erase(b.var);
    auto get2 = [&](const char* n) -> const char* {
      const auto it = env2.find(n);
      return it == env2.end() ? nullptr : it->second.c_str();
    };
    try {
      (void)step5::comm::dist_env_from(get2);
      FAIL("accepted");
    } catch (const Error& err) {
      CHECK(err.code() == StatusCode::kInvalidArgument);
      CHECK_MESSAGE(contains(err.what(), b.message), err.what());
    }
  }
  env["WORLD_SIZE"] = "1";
  CHECK_FALSE(step5::comm::multiprocess_requested(get));
  env.erase("WORLD_SIZE");
  CHECK_FALSE(step5::comm::multiprocess_requested(get));
}

TEST_CASE("a hand-built DistEnv: port, world size and address are checked as dist_env_from checks them, before any socket") {
  // 95036 used to wrap to port 29500 (while address() said :95036); 0 listened on a random port
  for (const int port : {0, -1, 65536, 95036}) {
    const std::string m = error_of([&] { TcpStore s(env_of(0, 2, port), 1.0); });
    CHECK_MESSAGE(contains(m, "rendezvous: master_port " + std::to_string(port) + ": expected [1, 65535]"), m);
  }
  // INT_MAX ranks used to throw std::bad_alloc from the peer table
  for (const int world : {0, step5::comm::kMaxWorldSize + 1, std::numeric_limits<int>::max()}) {
    const std::string m = error_of([&] { TcpStore s(env_of(0, world, 29500), 1.0); });
    CHECK_MESSAGE(contains(m, "rendezvous: world_size " + std::to_string(world) + ": expected [1, 65536]"), m);
  }
  DistEnv e = env_of(1, 2, 29500);
  e.master_addr.clear();
  const std::string m = error_of([&] { TcpStore s(e, 1.0); });
  CHECK_MESSAGE(contains(m, "rendezvous: master_addr is empty"), m);
}

TEST_CASE("a failed join closes its socket (a throwing constructor runs no destructor)") {
  // a listener that never accepts: the connect succeeds (backlog), the ack never comes
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(lfd >= 0);
  sockaddr_in a = loopback(0);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(lfd, 16) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const auto open_fds = [] {
    int n = 0;
    for (const auto& de : std::filesystem::directory_iterator("/proc/self/fd")) (void)de, ++n;
    return n;
  };
  const int before = open_fds();
  for (int i = 0; i < 3; ++i) {
    const std::string m = error_of([&] { TcpStore s(env_of(1, 2, ntohs(a.sin_port)), 0.2); });
    CHECK_MESSAGE(contains(m, "the rendezvous ack"), m);
  }
  CHECK(open_fds() == before);  // it used to leave one open socket per failed join
  ::close(lfd);
}

TEST_CASE("bad timeouts and blob sizes are refused") {
  const std::string m = error_of([&] { TcpStore s(env_of(0, 2, 1), 0.0); });
  CHECK_MESSAGE(contains(m, "rendezvous timeout 0 s: expected > 0 s and <= 2592000 s (30 days)"), m);
  // +inf, 1e300 and NaN: the duration used to overflow and time out at once ("within 0.0 s")
  for (const double t : {std::numeric_limits<double>::infinity(), 1e300, std::numeric_limits<double>::quiet_NaN()}) {
    const std::string mt = error_of([&] { TcpStore st(env_of(1, 2, 1), t); });
    CHECK_MESSAGE(contains(mt, "rendezvous timeout "), mt);
    CHECK_MESSAGE(contains(mt, "expected > 0 s and <= 2592000 s"), mt);
  }
  TcpStore s(env_of(0, 1, 1), 1.0);
  const std::string mc = error_of([&] { (void)s.allgather(TcpStore::Blob{}, 1e300); });
  CHECK_MESSAGE(contains(mc, "collective timeout 1e+300 s"), mc);
  CHECK(s.allgather(TcpStore::Blob{}, -1.0).size() == 1);  // <= 0: the store's timeout, as documented
  const std::string m2 = error_of([&] { (void)step5::comm::from_blob<double>(TcpStore::Blob(3), "a checksum"); });
  CHECK_MESSAGE(contains(m2, "rendezvous: a checksum has 3 bytes, expected 8"), m2);
}
