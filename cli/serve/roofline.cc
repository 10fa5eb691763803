#include "cli/serve/roofline.h"

#include <algorithm>
#include <array>
#include <cstdlib>

namespace kvmesh::serve {
namespace {

// From each model's config.json on Hugging Face (meta-llama/Llama-3.1-8B,
// meta-llama/Llama-3.1-70B, mistralai/Mixtral-8x7B-v0.1): layers, hidden,
// heads, kv heads, head_dim, intermediate, vocab, experts, top-k.
const std::array<ModelShape, 3> kModels = {{
    {"llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 0, 0, 2},
    {"llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 0, 0, 2},
    {"mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 8, 2, 2},
}};

// NVIDIA data sheets, SXM parts, dense BF16 (half the "with sparsity" figure):
// H100 SXM 989 TFLOP/s, 3.35 TB/s HBM3, 80 GB; H200 SXM 989 TFLOP/s,
// 4.8 TB/s HBM3e, 141 GB.
const std::array<GpuSpec, 2> kGpus = {{
    {"h100", 989e12, 3.35e12, 80e9},
    {"h200", 989e12, 4.8e12, 141e9},
}};

double AttentionParams(const ModelShape& m) {
  const double q = double(m.heads) * m.head_dim, kv = double(m.kv_heads) * m.head_dim;
  return m.hidden * q + 2.0 * m.hidden * kv + q * m.hidden;  // Wq, Wk, Wv, Wo
}
double GateParams(const ModelShape& m) { return m.experts ? double(m.hidden) * m.experts : 0.0; }
double AttentionFlopsPerPair(const ModelShape& m) { return 4.0 * m.layers * m.heads * m.head_dim; }

}  // namespace

uint64_t ModelShape::KvBytesPerToken() const { return 2ull * layers * kv_heads * head_dim * dtype_bytes; }
double ModelShape::ExpertParams() const { return 3.0 * hidden * intermediate; }  // gate, up, down
double ModelShape::ActiveParams() const {
  const double k = experts ? top_k : 1;
  return layers * (AttentionParams(*this) + GateParams(*this) + k * ExpertParams()) + double(vocab) * hidden;
}
double ModelShape::TotalParams() const {
  const double e = experts ? experts : 1;
  // + embedding and LM head (untied) + RMSNorm weights (2 per layer, 1 final)
  return layers * (AttentionParams(*this) + GateParams(*this) + e * ExpertParams()) + 2.0 * vocab * hidden +
         (2.0 * layers + 1) * hidden;
}

Result<ModelShape> FindModel(std::string_view name) {
  for (const ModelShape& m : kModels)
    if (m.name == name) return m;
  std::string known;
  for (const ModelShape& m : kModels) known += (known.empty() ? "" : ", ") + m.name;
  return InvalidArgument("unknown model '" + std::string(name) + "' (known: " + known + ")");
}

Result<GpuSpec> FindGpu(std::string_view name) {
  for (const GpuSpec& g : kGpus)
    if (g.name == name) return g;
  return InvalidArgument("unknown GPU '" + std::string(name) + "' (known: h100, h200)");
}

std::vector<std::string> ModelNames() {
  std::vector<std::string> out;
  for (const ModelShape& m : kModels) out.push_back(m.name);
  return out;
}

Roofline::Roofline(ModelShape model, GpuSpec gpu, uint32_t tp, double mfu, double mbu)
    : model_(std::move(model)), gpu_(std::move(gpu)), tp_(std::max<uint32_t>(tp, 1)), mfu_(mfu), mbu_(mbu) {}

Result<Roofline> Roofline::Parse(std::string_view spec, double mfu, double mbu) {
  std::vector<std::string> parts;
  size_t from = 0;
  for (;;) {
    const size_t colon = spec.find(':', from);
    parts.emplace_back(spec.substr(from, colon == std::string_view::npos ? colon : colon - from));
    if (colon == std::string_view::npos) break;
    from = colon + 1;
  }
  if (parts.size() < 3 || parts.size() > 4 || parts[0] != "roofline")
    return InvalidArgument("engine model '" + std::string(spec) + "': expected roofline:<model>:<gpu>[:tp<N>]");
  KVMESH_ASSIGN_OR_RETURN(ModelShape m, FindModel(parts[1]));
  KVMESH_ASSIGN_OR_RETURN(GpuSpec g, FindGpu(parts[2]));
  uint32_t tp = 1;
  if (parts.size() == 4) {
    char* end = nullptr;
    const long v = parts[3].rfind("tp", 0) == 0 ? std::strtol(parts[3].c_str() + 2, &end, 10) : 0;
    if (v < 1 || v > 64 || *end != '\0') return InvalidArgument("engine model: '" + parts[3] + "' is not tp<1..64>");
    tp = static_cast<uint32_t>(v);
  }
  if (!(mfu > 0 && mfu <= 1) || !(mbu > 0 && mbu <= 1)) return InvalidArgument("mfu and mbu must lie in (0, 1]");
  return Roofline(std::move(m), std::move(g), tp, mfu, mbu);
}

std::string Roofline::Name() const {
  return "roofline:" + model_.name + ":" + gpu_.name + (tp_ > 1 ? ":tp" + std::to_string(tp_) : "");
}

double Roofline::StepFlops(const std::vector<PrefillWork>& prefills,
                           const std::vector<uint64_t>& decode_contexts) const {
  const double per_pair = AttentionFlopsPerPair(model_);
  double tokens = 0, pairs = 0;
  for (const PrefillWork& p : prefills) {
    tokens += double(p.new_tokens);
    pairs += double(p.new_tokens) * (double(p.cached_tokens) + (double(p.new_tokens) + 1) / 2);
  }
  for (uint64_t c : decode_contexts) {
    tokens += 1;
    pairs += double(c) + 1;
  }
  return 2.0 * model_.ActiveParams() * tokens + per_pair * pairs;
}

double Roofline::StepBytes(const std::vector<PrefillWork>& prefills,
                           const std::vector<uint64_t>& decode_contexts) const {
  double tokens = 0, kv_tokens = 0;
  for (const PrefillWork& p : prefills) {
    tokens += double(p.new_tokens);
    kv_tokens += double(p.cached_tokens + p.new_tokens);
  }
  for (uint64_t c : decode_contexts) {
    tokens += 1;
    kv_tokens += double(c) + 1;
  }
  if (tokens == 0) return 0;
  double weights = model_.TotalParams();
  if (model_.experts) {  // only the experts some token of the step is routed to are read
    const double touched = std::min<double>(model_.experts, tokens * model_.top_k);
    weights -= model_.layers * (model_.experts - touched) * model_.ExpertParams();
  }
  return weights * model_.dtype_bytes + kv_tokens * double(model_.KvBytesPerToken());
}

double Roofline::StepSeconds(const std::vector<PrefillWork>& prefills,
                             const std::vector<uint64_t>& decode_contexts) const {
  const double compute = StepFlops(prefills, decode_contexts) / (tp_ * gpu_.peak_flops * mfu_);
  const double memory = StepBytes(prefills, decode_contexts) / (tp_ * gpu_.hbm_bw * mbu_);
  return std::max(compute, memory);
}

}  // namespace kvmesh::serve
