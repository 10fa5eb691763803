// `kvmesh codec encode|decode|info|fit-basis` and `kvmesh bench codecs`:
// inspect a codec on your own tensors, and measure every codec's ratio,
// accuracy and speed (against memcpy in the same run).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "kernels/codec.h"
#include "cli/codec_bench.h"
#include "kernels/lowrank.h"

namespace kvmesh::cli {
namespace {

using kernels::BlockShape;

Result<std::vector<std::byte>> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus("cannot open " + path, errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

Status WriteAll(const std::string& path, std::span<const std::byte> b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return ErrnoStatus("cannot write " + path, errno);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) return IoError("writing " + path + " failed");
  return Status::Ok();
}

// "4,8,64,128" -> layers, heads, tokens, head_dim.
Result<BlockShape> ParseShape(const std::string& text, const std::string& dtype, uint32_t layer_begin) {
  BlockShape s;
  uint32_t v[4];
  std::istringstream in(text);
  for (int i = 0; i < 4; ++i) {
    long long x = -1;
    char comma = ',';
    if (!(in >> x) || x <= 0 || x > (1 << 24) || (i < 3 && (!(in >> comma) || comma != ',')))
      return InvalidArgument("--shape: expected L,H,T,D (four positive integers), got \"" + text + "\"");
    v[i] = static_cast<uint32_t>(x);
  }
  if (in >> std::ws; !in.eof()) return InvalidArgument("--shape: trailing characters in \"" + text + "\"");
  s.layer_begin = layer_begin;
  s.layers = v[0], s.heads = v[1], s.tokens = v[2], s.head_dim = v[3];
  KVMESH_ASSIGN_OR_RETURN(s.dtype, ParseDType(dtype));
  KVMESH_RETURN_IF_ERROR(s.Validate());
  return s;
}

Result<std::shared_ptr<const kernels::LowRankBasis>> LoadBasis(const std::string& path) {
  if (path.empty()) return std::shared_ptr<const kernels::LowRankBasis>();
  KVMESH_ASSIGN_OR_RETURN(kernels::LowRankBasis b, kernels::LowRankBasis::Load(path));
  return std::shared_ptr<const kernels::LowRankBasis>(std::make_shared<kernels::LowRankBasis>(std::move(b)));
}

struct CodecArgs {
  std::string codec = "int8", shape, dtype = "fp16", in, out, basis, ref, lossless = "none";
  uint32_t layer_begin = 0, rank = 0;
  std::vector<std::string> inputs;
};

Status Encode(const CodecArgs& a) {
  KVMESH_ASSIGN_OR_RETURN(BlockShape shape, ParseShape(a.shape, a.dtype, a.layer_begin));
  KVMESH_ASSIGN_OR_RETURN(auto raw, ReadAll(a.in));
  if (raw.size() != shape.bytes())
    return InvalidArgument(a.in + " holds " + std::to_string(raw.size()) + " bytes; shape " + shape.ToString() +
                           " needs " + std::to_string(shape.bytes()));
  KVMESH_ASSIGN_OR_RETURN(auto basis, LoadBasis(a.basis));
  std::string name = a.codec;
  if (a.lossless != "none") name += "+" + a.lossless;
  KVMESH_ASSIGN_OR_RETURN(kernels::CodecPolicy policy, kernels::PolicyFromName(name, shape, {}, basis));
  KVMESH_ASSIGN_OR_RETURN(auto codec, kernels::MakeCodec(policy));
  KVMESH_ASSIGN_OR_RETURN(size_t max, codec->MaxEncodedSize(shape));
  std::vector<std::byte> blob(max);
  KVMESH_ASSIGN_OR_RETURN(size_t n, codec->Encode(shape, raw, blob));
  blob.resize(n);
  KVMESH_RETURN_IF_ERROR(WriteAll(a.out, blob));
  std::vector<std::byte> back(shape.bytes());
  KVMESH_RETURN_IF_ERROR(codec->Decode(blob, back));
  const kernels::ErrorStats e = kernels::CompareBlocks(shape, raw, back);
  std::printf("%s: %s %s -> %zu bytes (ratio %.3f), rel-L2 %.3e (K %.3e, V %.3e), max abs err %.3e\n",
              a.out.c_str(), codec->name().c_str(), shape.ToString().c_str(), n,
              static_cast<double>(raw.size()) / static_cast<double>(n), e.rel_l2, e.rel_l2_k, e.rel_l2_v, e.max_abs);
  return Status::Ok();
}

Status Decode(const CodecArgs& a) {
  KVMESH_ASSIGN_OR_RETURN(auto blob, ReadAll(a.in));
  KVMESH_ASSIGN_OR_RETURN(kernels::BlockInfo info, kernels::InspectBlock(blob));
  KVMESH_ASSIGN_OR_RETURN(auto basis, LoadBasis(a.basis));
  std::vector<std::byte> raw(info.shape.bytes());
  kernels::DecodeOptions o;
  o.basis = basis.get();
  KVMESH_RETURN_IF_ERROR(kernels::DecodeBlock(blob, raw, o));
  KVMESH_RETURN_IF_ERROR(WriteAll(a.out, raw));
  std::printf("%s: %s, %zu bytes\n", a.out.c_str(), info.shape.ToString().c_str(), raw.size());
  if (!a.ref.empty()) {
    KVMESH_ASSIGN_OR_RETURN(auto ref, ReadAll(a.ref));
    if (ref.size() != raw.size()) return InvalidArgument("--ref " + a.ref + " has a different size");
    const kernels::ErrorStats e = kernels::CompareBlocks(info.shape, ref, raw);
    std::printf("vs %s: rel-L2 %.3e (K %.3e, V %.3e), max abs err %.3e, attention-output rel err %.3e\n",
                a.ref.c_str(), e.rel_l2, e.rel_l2_k, e.rel_l2_v, e.max_abs,
                kernels::AttentionRelError(info.shape, ref, raw, 4, 1));
  }
  return Status::Ok();
}

Status Info(const CodecArgs& a) {
  KVMESH_ASSIGN_OR_RETURN(auto blob, ReadAll(a.in));
  KVMESH_ASSIGN_OR_RETURN(kernels::BlockInfo info, kernels::InspectBlock(blob));
  std::printf("%s: kvmesh block v%u, %s, %zu segment(s), lossless %s, body %llu bytes, stored %llu, total %llu "
              "(ratio %.3f), checksum OK\n",
              a.in.c_str(), info.version, info.shape.ToString().c_str(), info.segments.size(),
              std::string(kernels::LosslessName(info.lossless)).c_str(),
              static_cast<unsigned long long>(info.body_bytes), static_cast<unsigned long long>(info.stored_bytes),
              static_cast<unsigned long long>(info.total_bytes),
              static_cast<double>(info.shape.bytes()) / static_cast<double>(info.total_bytes));
  for (const auto& s : info.segments)
    std::printf("  layers %u-%u: %s%s\n", s.layer_begin, s.layer_begin + s.layers - 1,
                kernels::CodecSpecName(s.spec).c_str(),
                s.basis_id ? (" basis " + std::to_string(s.basis_id)).c_str() : "");
  return Status::Ok();
}

Status FitBasis(const CodecArgs& a) {
  KVMESH_ASSIGN_OR_RETURN(BlockShape shape, ParseShape(a.shape, a.dtype, a.layer_begin));
  std::vector<std::vector<std::byte>> data;
  std::vector<std::span<const std::byte>> spans;
  for (const std::string& f : a.inputs) {
    KVMESH_ASSIGN_OR_RETURN(auto raw, ReadAll(f));
    if (raw.size() % shape.bytes() != 0)
      return InvalidArgument(f + " is not a whole number of " + shape.ToString() + " blocks");
    data.push_back(std::move(raw));
  }
  for (const auto& d : data)
    for (size_t off = 0; off < d.size(); off += shape.bytes())
      spans.push_back(std::span<const std::byte>(d).subspan(off, shape.bytes()));
  const uint32_t rank = a.rank ? a.rank : std::max<uint32_t>(1, shape.head_dim / 4);
  KVMESH_ASSIGN_OR_RETURN(kernels::LowRankBasis b, kernels::LowRankBasis::Fit(shape, spans, rank));
  KVMESH_RETURN_IF_ERROR(b.Save(a.out));
  std::printf("%s: rank %u basis of %s from %zu blocks, mean residual energy %.4f, id %llu\n", a.out.c_str(), rank,
              shape.ToString().c_str(), spans.size(), b.mean_residual(), static_cast<unsigned long long>(b.id()));
  return Status::Ok();
}

template <typename Fn>
void Run(const char* what, int* exit_code, Fn fn) {
  Status s = fn();
  if (!s.ok()) {
    std::cerr << "kvmesh codec " << what << ": " << s.ToString() << "\n";
    *exit_code = 1;
  }
}

}  // namespace

void AddCodecCommand(CLI::App& app, int* exit_code) {
  auto* codec = app.add_subcommand("codec", "Encode, decode and inspect compressed KV blocks");
  codec->require_subcommand(1);
  auto args = std::make_shared<CodecArgs>();
  std::string codec_help = "codec: fp16, bf16, int8, int4, fp8-e4m3, fp8-e5m2, lowrank, raw; options :gN :kivi|token|channel "
                           ":rN; or mixed:<codec>@<layers>,<codec>";

  auto* enc = codec->add_subcommand("encode", "Encode a raw little-endian block [layer][k|v][head][token][dim]");
  enc->add_option("--codec", args->codec, codec_help)->capture_default_str();
  enc->add_option("--shape", args->shape, "L,H,T,D (layers, kv heads, tokens, head dim)")->required();
  enc->add_option("--dtype", args->dtype, "raw element type: fp16, bf16, fp32")->capture_default_str();
  enc->add_option("--layer-begin", args->layer_begin, "absolute index of the first layer (mixed rules, lowrank)");
  enc->add_option("--lossless", args->lossless, "none, lz4, zstd")->capture_default_str();
  enc->add_option("--basis", args->basis, "lowrank basis file (from codec fit-basis)");
  enc->add_option("--in", args->in, "raw input file")->required();
  enc->add_option("--out", args->out, "compressed block to write")->required();
  enc->callback([args, exit_code] { Run("encode", exit_code, [&] { return Encode(*args); }); });

  auto* dec = codec->add_subcommand("decode", "Decode a compressed block to raw little-endian elements");
  dec->add_option("--in", args->in, "compressed block")->required();
  dec->add_option("--out", args->out, "raw file to write")->required();
  dec->add_option("--basis", args->basis, "lowrank basis file");
  dec->add_option("--ref", args->ref, "original raw file: print the error against it");
  dec->callback([args, exit_code] { Run("decode", exit_code, [&] { return Decode(*args); }); });

  auto* info = codec->add_subcommand("info", "Check a compressed block and print its header");
  info->add_option("--in", args->in, "compressed block")->required();
  info->callback([args, exit_code] { Run("info", exit_code, [&] { return Info(*args); }); });

  auto* fit = codec->add_subcommand("fit-basis", "Fit a lowrank basis (per-head PCA) from raw sample blocks");
  fit->add_option("--shape", args->shape, "L,H,T,D of each sample block")->required();
  fit->add_option("--dtype", args->dtype, "fp16, bf16, fp32")->capture_default_str();
  fit->add_option("--layer-begin", args->layer_begin, "absolute index of the first layer");
  fit->add_option("--rank", args->rank, "basis rank (default head_dim / 4)");
  fit->add_option("--in", args->inputs, "raw sample files (each a whole number of blocks)")->required();
  fit->add_option("--out", args->out, "basis file to write")->required();
  fit->callback([args, exit_code] { Run("fit-basis", exit_code, [&] { return FitBasis(*args); }); });
}

void ConfigureCodecBench(CLI::App* cmd, int* exit_code) {
  auto o = std::make_shared<kernels::BenchOptions>();
  auto json = std::make_shared<bool>(false);
  auto ws_mib = std::make_shared<size_t>(64);
  cmd->add_flag("--json", *json, "print JSON instead of a table");
  cmd->add_option("--codecs", o->codecs, "codecs to measure (default: all, see kvmesh codec encode --help)")
      ->delimiter(',');
  cmd->add_option("--layers", o->layers, "layers per block")->capture_default_str();
  cmd->add_option("--heads", o->heads, "kv heads per block")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "tokens per block")->capture_default_str();
  cmd->add_option("--head-dims", o->head_dims, "head dims to measure")->delimiter(',')->capture_default_str();
  cmd->add_option("--working-set-mib", *ws_mib, "raw MiB encoded per timed repetition")->capture_default_str();
  cmd->add_option("--reps", o->reps, "timed repetitions (medians are reported)")->capture_default_str();
  cmd->add_option("--threads", o->threads, "codec threads (1 = single-thread figures)")->capture_default_str();
  cmd->add_option("--accuracy-blocks", o->accuracy_blocks, "distinct blocks whose error is measured")
      ->capture_default_str();
  cmd->callback([o, json, ws_mib, exit_code] {
    o->working_set_bytes = *ws_mib << 20;
    Result<kernels::BenchReport> r = kernels::RunCodecBench(*o);
    if (!r.ok()) {
      std::cerr << "kvmesh bench codecs: " << r.status().ToString() << "\n";
      *exit_code = 1;
      return;
    }
    std::cout << (*json ? kernels::FormatBenchJson(*r) + "\n" : kernels::FormatBenchTable(*r));
  });
}

void AddBenchCodecsCommand(CLI::App& app, int* exit_code) {
  CLI::App* bench = nullptr;
  try {
    bench = app.get_subcommand("bench");
  } catch (const CLI::OptionNotFound&) {
    bench = app.add_subcommand("bench", "Benchmarks (each figure beside a baseline measured in the same run)");
    bench->require_subcommand(1);
  }
  ConfigureCodecBench(bench->add_subcommand("codecs", "Codec ratio, cache and attention error, GB/s vs memcpy"),
                      exit_code);
}

}  // namespace kvmesh::cli
