// cli/serve/workload.h — the open-loop request schedule of `kvmesh
// bench-serve`: multi-turn sessions whose turns arrive at fixed times,
// whatever the engines do (open loop: a slow engine never slows arrivals).
//
// Sessions start as a Poisson process at rate / turns per second, so requests
// arrive at `rate` on average. A session is a chat (a shared system prompt,
// then user messages and the model's answers) or an agent loop (a shared
// tool-use preamble, then tool outputs appended to the context, longer than
// chat messages). Turn k's prompt is the whole context so far: everything
// of turns 1..k-1 (prompts and outputs) plus its new message, so turn k's
// prefix is turn k-1's prompt and output. Turns of a session are think_s
// apart on average (think_s / 2 plus an exponential gap
// of mean think_s / 2). Token ids come from the seed: a run with
// the same options is the same run.
#pragma once

#include <cstdint>
#include <vector>

#include "kvmesh/types.h"

namespace kvmesh {
struct Trace;
}

namespace kvmesh::serve {

struct WorkloadOptions {
  double rate = 1.0;       // requests/s offered (all sessions together)
  double duration_s = 20;  // sessions start in [0, duration_s)
  uint32_t turns = 4;      // turns per session
  double think_s = 2.0;    // mean gap between a session's turns
  double agent_share = 0.5;           // share of sessions that are agent loops
  uint32_t system_prompts = 4;        // distinct shared prefixes per kind
  uint32_t system_tokens = 1024;      // chat system prompt length
  uint32_t agent_preamble_tokens = 2048;
  uint32_t user_tokens = 128;         // chat: a user message (mean)
  uint32_t tool_tokens = 512;         // agent: a tool output (mean)
  uint32_t output_tokens = 128;       // the model's answer (mean)
  uint64_t seed = 1;
};

struct ServeRequest {
  uint32_t session = 0, turn = 0;
  bool agent = false;
  double arrival_s = 0;          // from the run's start
  std::vector<TokenId> prompt;   // the whole context
  std::vector<TokenId> output;   // what the engine "generates" (fixed by the seed)
};

// Every request of a run, by arrival time.
std::vector<ServeRequest> MakeWorkload(const WorkloadOptions& o);

// A Mooncake-format trace (eviction/replay.h ParseMooncakeTrace: timestamp in
// ms, input_length, output_length, hash_ids over 512-token blocks) as the
// request schedule: the requests whose timestamp lies in [start_s, start_s +
// duration_s) of the trace, arriving at (timestamp - start) / speed. A
// prompt is input_length tokens: block j of it is 512 tokens derived from the
// request's j-th hash id (equal ids, equal tokens: the trace's shared
// prefixes are shared here), the last block cut to length; the output is
// output_length tokens (capped at max_output). Each request is its own
// session (turn 0): the trace does not say which requests are turns of one
// conversation, only what they share.
struct TraceWindow {
  double start_s = 0, duration_s = 20, speed = 1;
  uint32_t max_output = 1024;
};
std::vector<ServeRequest> TraceWorkload(const Trace& trace, const TraceWindow& w);

}  // namespace kvmesh::serve
