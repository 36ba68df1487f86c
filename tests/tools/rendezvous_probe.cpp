// rendezvous_probe — a host program for the launcher tests (tests/CMakeLists.txt, label host):
// started by tools/launch_tp.sh, it reads the rank environment (step5::comm::dist_env), meets the
// other ranks through the TCP store and checks that every rank 0..WORLD_SIZE-1 arrived once, with
// LOCAL_RANK = RANK (one host). Rank 0 prints "probe: N ranks met at ADDR:PORT".
//   --timeout S        the store's timeout (default 10 s)
//   --exit-rank R --exit-code C   rank R exits with C before the rendezvous (a rank that fails to start)
//   --kill-rank R      rank R kills itself (SIGKILL) after the first barrier; the others then call a
//                      second barrier (a rank killed mid-run: they must error out, not hang)
// Errors: "rendezvous_probe: error: <message>", exit 2.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <array>
#include <chrono>
#include <thread>

#include "step5/comm/rendezvous.hpp"

int main(int argc, char** argv) {
  double timeout = 10;
  int exit_rank = -1, exit_code = 0, kill_rank = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string o = argv[i];
    if (o == "--timeout") timeout = std::atof(argv[i + 1]);
    else if (o == "--exit-rank") exit_rank = std::atoi(argv[i + 1]);
    else if (o == "--exit-code") exit_code = std::atoi(argv[i + 1]);
    else if (o == "--kill-rank") kill_rank = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "rendezvous_probe: error: unknown option %s\n", o.c_str());
      return 2;
    }
  }
  try {
    const step5::comm::DistEnv env = step5::comm::dist_env();
    if (env.rank == exit_rank) return exit_code;
    step5::comm::TcpStore store(env, timeout);
    const auto all = store.allgather(step5::comm::to_blob(std::array<int, 2>{env.rank, env.local_rank}));
    for (int r = 0; r < env.world_size; ++r) {
      const auto v = step5::comm::from_blob<std::array<int, 2>>(all[r], "a rank's (RANK, LOCAL_RANK)");
      if (v[0] != r || v[1] != r) {
        std::fprintf(stderr, "rendezvous_probe: error: slot %d holds RANK %d LOCAL_RANK %d\n", r, v[0], v[1]);
        return 1;
      }
    }
    if (kill_rank >= 0) {
      if (env.rank == kill_rank) ::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      store.barrier();
    }
    if (env.rank == 0) std::printf("probe: %d ranks met at %s\n", env.world_size, store.address().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rendezvous_probe: error: %s\n", e.what());
    return 2;
  }
}
