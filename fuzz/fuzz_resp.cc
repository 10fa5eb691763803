// libFuzzer target for the Redis-protocol parser both RESP fronts use
// (transport/resp/resp_protocol.cc ParseRespCommand; resp_value.cc RespKey). The input is a
// byte stream from a client: every command is parsed off its front, as a
// connection does, until the parser needs more bytes or refuses them.
// Build and run (clang only): fuzz/build.sh && build-fuzz/bin/fuzz_resp -max_total_time=60
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "transport/resp/resp_protocol.h"
#include "transport/resp/resp_value.h"

using namespace kvmesh;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // Small bulk limit for most inputs, so "value too large" paths are reached too.
  const uint64_t max_bulk = size > 0 && (data[0] & 1) ? 64 : 1 << 20;
  std::vector<std::string_view> args;
  std::string err;
  for (int i = 0; i < 4096 && !in.empty(); ++i) {
    size_t consumed = 0;
    args.clear();
    const RespParse r = ParseRespCommand(in, max_bulk, &args, &consumed, &err);
    if (r != RespParse::kCommand) break;
    // What a connection does with a command: every argument lies inside the
    // bytes it consumed, and the parser made progress.
    if (consumed == 0 || consumed > in.size()) __builtin_trap();
    const bool multibulk = in[0] == '*';  // inline words are bounded by their line, not max_bulk
    for (std::string_view a : args) {
      if (multibulk && a.size() > max_bulk) __builtin_trap();
      if (!a.empty() && (a.data() < in.data() || a.data() + a.size() > in.data() + consumed)) __builtin_trap();
      (void)RespKey(a);
    }
    in.remove_prefix(consumed);
  }
  return 0;
}
