// gpu_model_bench: the reference model's prefill and decode tokens/s on the GPU
// (CudaReferenceModel) against the CPU reference (ReferenceModel, one thread)
// in the same run, for the same seeded model and tokens. Medians of --reps
// runs (wall clock; each GPU call synchronises, so wall time is GPU time plus
// launches). --json for machine-readable output. Needs only the CUDA runtime.
//
// Flags: --reps N (3), --prompt N (128), --decode N (32), --json, and the
// model shape: --hidden --layers --q-heads --kv-heads --head-dim --ffn
// --experts --top-k --vocab.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "coordinator/decode/model.h"
#include "coordinator/decode/cuda/model_cuda.h"

using namespace kvmesh;
using namespace kvmesh::decode;

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Times {
  double prefill_s = 0, decode_s = 0;
};

// Feeds the prompt, then `decode` greedy tokens one at a time; feed(seq, tokens) -> logits.
template <typename NewSeq, typename Feed>
Times Run(const std::vector<TokenId>& prompt, int decode, NewSeq new_seq, Feed feed) {
  const int s = new_seq();
  Times t;
  double a = Now();
  std::vector<float> logits = feed(s, std::span<const TokenId>(prompt));
  t.prefill_s = Now() - a;
  a = Now();
  for (int i = 0; i < decode; ++i) {
    const TokenId next = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = feed(s, std::span<const TokenId>(&next, 1));
  }
  t.decode_s = Now() - a;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  ModelConfig c;
  c.vocab = 2048;
  c.hidden = 512;
  c.layers = 8;
  c.q_heads = 8;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.ffn = 1408;
  c.experts = 0;
  int reps = 3, prompt_n = 128, decode_n = 32;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto num = [&]() { return i + 1 < argc ? static_cast<uint32_t>(std::strtoul(argv[++i], nullptr, 10)) : 0u; };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: gpu_model_bench [--reps R] [--prompt N] [--decode N] [--hidden H] [--layers L] [--q-heads Q]\n"
          "                       [--kv-heads K] [--head-dim D] [--ffn F] [--experts E] [--top-k K] [--vocab V] [--json]\n"
          "Prefill and decode time of the CUDA decode model beside the CPU model (needs a GPU).\n");
      return 0;
    }
    if (a == "--json")
      json = true;
    else if (a == "--reps")
      reps = static_cast<int>(num());
    else if (a == "--prompt")
      prompt_n = static_cast<int>(num());
    else if (a == "--decode")
      decode_n = static_cast<int>(num());
    else if (a == "--hidden")
      c.hidden = num();
    else if (a == "--layers")
      c.layers = num();
    else if (a == "--q-heads")
      c.q_heads = num();
    else if (a == "--kv-heads")
      c.kv_heads = num();
    else if (a == "--head-dim")
      c.head_dim = num();
    else if (a == "--ffn")
      c.ffn = num();
    else if (a == "--experts")
      c.experts = num();
    else if (a == "--top-k")
      c.top_k = num();
    else if (a == "--vocab")
      c.vocab = num();
    else {
      std::fprintf(stderr, "gpu_model_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (reps < 1 || prompt_n < 1 || decode_n < 1) {
    std::fprintf(stderr, "gpu_model_bench: --reps, --prompt and --decode must be >= 1\n");
    return 2;
  }
  if (Status st = CudaDeviceStatus(); !st.ok()) {
    std::printf("SKIP: no GPU (%s)\n", st.ToString().c_str());
    return 0;
  }
  auto w = Weights::Generate(c);
  if (!w.ok()) {
    std::fprintf(stderr, "gpu_model_bench: %s\n", w.status().ToString().c_str());
    return 2;
  }
  std::vector<TokenId> prompt(prompt_n);
  for (int i = 0; i < prompt_n; ++i) prompt[i] = static_cast<TokenId>((i * 2654435761u) % c.vocab);
  auto gm = CudaReferenceModel::Create(*w, static_cast<uint32_t>(prompt_n + decode_n));
  if (!gm.ok()) {
    std::fprintf(stderr, "gpu_model_bench: %s\n", gm.status().ToString().c_str());
    return 2;
  }
  CudaReferenceModel& G = **gm;
  std::vector<double> cpu_pf, cpu_dec, gpu_pf, gpu_dec;
  Run(
      prompt, 1, [&] { return G.NewSequence().value(); },
      [&](int s, std::span<const TokenId> t) { return G.Feed(s, t).value(); });  // warm-up: module load, first launches
  for (int r = 0; r < reps; ++r) {
    std::fprintf(stderr, "rep %d/%d: gpu", r + 1, reps);
    int last = -1;
    Times g = Run(
        prompt, decode_n, [&] { return last = G.NewSequence().value(); },
        [&](int s, std::span<const TokenId> t) { return G.Feed(s, t).value(); });
    (void)G.Release(last);
    std::fprintf(stderr, ", cpu\n");
    ReferenceModel R(*w);
    Times cp = Run(
        prompt, decode_n, [&] { return R.NewSequence(); },
        [&](int s, std::span<const TokenId> t) { return R.Feed(s, t); });
    gpu_pf.push_back(prompt_n / g.prefill_s);
    gpu_dec.push_back(decode_n / g.decode_s);
    cpu_pf.push_back(prompt_n / cp.prefill_s);
    cpu_dec.push_back(decode_n / cp.decode_s);
  }
  const double gp = Median(gpu_pf), gd = Median(gpu_dec), cpf = Median(cpu_pf), cd = Median(cpu_dec);
  if (json) {
    std::printf(
        "{\"model_params\": %llu, \"prompt\": %d, \"decode\": %d, \"reps\": %d, "
        "\"prefill_tokens_per_s\": {\"gpu\": %.1f, \"cpu\": %.1f, \"ratio\": %.2f}, "
        "\"decode_tokens_per_s\": {\"gpu\": %.1f, \"cpu\": %.1f, \"ratio\": %.2f}}\n",
        static_cast<unsigned long long>(c.Params()), prompt_n, decode_n, reps, gp, cpf, gp / cpf, gd, cd, gd / cd);
  } else {
    std::printf("reference model: %llu parameters, prompt %d, decode %d, medians of %d\n",
                static_cast<unsigned long long>(c.Params()), prompt_n, decode_n, reps);
    std::printf("%-8s %14s %14s %8s\n", "", "GPU tok/s", "CPU tok/s", "GPU/CPU");
    std::printf("%-8s %14.1f %14.1f %7.2fx\n", "prefill", gp, cpf, gp / cpf);
    std::printf("%-8s %14.1f %14.1f %7.2fx\n", "decode", gd, cd, gd / cd);
  }
  return 0;
}
