// Golden blobs: the committed input (tests/golden/input.f16, shape
// L2xH2xT16xD64 fp16) must encode to the committed blobs byte for byte, and
// the blobs must decode to the committed output checksums. A failure means
// the block format or a codec's arithmetic changed: bump the format version
// (docs/block-format.md) rather than regenerating. Regenerate only for a new
// codec: KVMESH_UPDATE_GOLDEN=1 tests/test_codec "[golden]".
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <map>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/checksum.h"
#include "kernels/codec.h"
#include "cli/codec_bench.h"
#include "kernels/lowrank.h"

using namespace kvmesh;
using namespace kvmesh::kernels;

namespace {

using Bytes = std::vector<std::byte>;
const std::string kDir = KVMESH_GOLDEN_DIR;
const BlockShape kShape{0, 2, 0, 2, 16, 64, DType::kFp16};

bool Updating() {
  const char* e = std::getenv("KVMESH_UPDATE_GOLDEN");
  return e && *e && std::string(e) != "0";
}

Bytes ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  Bytes b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return b;
}

void WriteFile(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

struct Golden {
  const char* file;
  const char* codec;  // PolicyFromName syntax
  bool compare_encoding;  // false for lossless stages (their output may change between library versions)
};
const Golden kGolden[] = {
    {"fp16.kvb", "fp16", true},          {"bf16.kvb", "bf16", true},
    {"int8.kvb", "int8:g32", true},      {"int8_token.kvb", "int8:token", true},
    {"int4.kvb", "int4:g32", true},      {"int4_token.kvb", "int4:token", true},
    {"fp8_e4m3.kvb", "fp8-e4m3", true},  {"fp8_e5m2.kvb", "fp8-e5m2", true},
    {"mixed.kvb", "mixed:fp16@1,int4", true}, {"lowrank.kvb", "lowrank:r16", true},
    {"int8_zstd.kvb", "int8+zstd", false},
};

}  // namespace

TEST_CASE("Golden blobs: the committed input encodes to the committed bytes and decodes to the committed values",
          "[codec][golden]") {
  Bytes input = ReadFile(kDir + "/input.f16");
  std::shared_ptr<LowRankBasis> basis;
  if (Updating()) {
    input.resize(kShape.bytes());
    GenerateKvBlock(kShape, 2026, input);
    WriteFile(kDir + "/input.f16", input);
    std::vector<Bytes> cal;
    std::vector<std::span<const std::byte>> spans;
    for (int i = 0; i < 3; ++i) {
      cal.emplace_back(kShape.bytes());
      GenerateKvBlock(kShape, 3000 + i, cal.back());
    }
    for (auto& c : cal) spans.push_back(c);
    basis = std::make_shared<LowRankBasis>(std::move(LowRankBasis::Fit(kShape, spans, 16)).value());
    REQUIRE(basis->Save(kDir + "/lowrank.basis").ok());
  } else {
    auto b = LowRankBasis::Load(kDir + "/lowrank.basis");
    REQUIRE(b.ok());
    basis = std::make_shared<LowRankBasis>(std::move(b).value());
  }
  REQUIRE(input.size() == kShape.bytes());
  std::ostringstream manifest;
  std::map<std::string, std::string> expected;
  if (!Updating()) {
    std::ifstream in(kDir + "/manifest.txt");
    std::string file, hash;
    while (in >> file >> hash) expected[file] = hash;
  }
  for (const Golden& g : kGolden) {
    INFO(g.file << " (" << g.codec << ")");
    auto policy = PolicyFromName(g.codec, kShape, {});
    if (!policy.ok()) {  // lowrank: use the committed basis
      CodecPolicy p;
      p.base = *ParseCodecSpec(g.codec);
      p.basis = basis;
      policy = p;
    }
    auto codec = MakeCodec(*policy);
    REQUIRE(codec.ok());
    Bytes blob(*(*codec)->MaxEncodedSize(kShape));
    auto n = (*codec)->Encode(kShape, input, blob);
    REQUIRE(n.ok());
    blob.resize(*n);
    if (Updating()) WriteFile(kDir + "/" + g.file, blob);
    const Bytes committed = ReadFile(kDir + "/" + g.file);
    if (g.compare_encoding) CHECK(committed == blob);
    Bytes out(kShape.bytes());
    DecodeOptions o;
    o.basis = basis.get();
    REQUIRE(DecodeBlock(committed, out, o).ok());
    char hash[17];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(Checksum64(out.data(), out.size())));
    manifest << g.file << " " << hash << "\n";
    if (!Updating()) CHECK(expected[g.file] == hash);
  }
  if (Updating()) {
    std::ofstream out(kDir + "/manifest.txt", std::ios::trunc);
    out << manifest.str();
  }
}
