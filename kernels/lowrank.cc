#include "kernels/lowrank.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "common/checksum.h"
#include "kernels/quant_cpu.h"

namespace kvmesh::kernels {
namespace {

constexpr uint32_t kMagic = 0x524C564Bu;  // "KVLR"
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderWords = 8;

// Top-`rank` eigenvectors of the symmetric PSD matrix c (n x n) by orthogonal
// (subspace) iteration; rows of q (rank x n) come out orthonormal.
void TopEigenvectors(const std::vector<double>& c, uint32_t n, uint32_t rank, std::vector<double>* q) {
  std::mt19937_64 rng(0x5eedULL);
  std::normal_distribution<double> nd;
  q->assign(static_cast<size_t>(rank) * n, 0.0);
  for (double& v : *q) v = nd(rng);
  std::vector<double> z(q->size());
  auto orthonormalise = [&](std::vector<double>& m) {
    for (uint32_t r = 0; r < rank; ++r) {
      double* v = &m[static_cast<size_t>(r) * n];
      for (uint32_t attempt = 0;; ++attempt) {
        for (int pass = 0; pass < 2; ++pass) {
          for (uint32_t s = 0; s < r; ++s) {
            const double* u = &m[static_cast<size_t>(s) * n];
            double dot = 0;
            for (uint32_t i = 0; i < n; ++i) dot += u[i] * v[i];
            for (uint32_t i = 0; i < n; ++i) v[i] -= dot * u[i];
          }
        }
        double norm = 0;
        for (uint32_t i = 0; i < n; ++i) norm += v[i] * v[i];
        norm = std::sqrt(norm);
        if (norm > 1e-150 || attempt >= n) {
          if (norm > 0)
            for (uint32_t i = 0; i < n; ++i) v[i] /= norm;
          break;
        }
        // Degenerate (C has rank < r): try the next unit vector.
        for (uint32_t i = 0; i < n; ++i) v[i] = (i == attempt) ? 1.0 : 0.0;
      }
    }
  };
  orthonormalise(*q);
  for (int it = 0; it < 80; ++it) {
    for (uint32_t r = 0; r < rank; ++r) {
      const double* v = &(*q)[static_cast<size_t>(r) * n];
      double* out = &z[static_cast<size_t>(r) * n];
      for (uint32_t i = 0; i < n; ++i) {
        const double* row = &c[static_cast<size_t>(i) * n];
        double s = 0;
        for (uint32_t j = 0; j < n; ++j) s += row[j] * v[j];
        out[i] = s;
      }
    }
    q->swap(z);
    orthonormalise(*q);
  }
}

template <typename T>
void Put(std::vector<std::byte>* out, const T* p, size_t n) {
  const auto* b = reinterpret_cast<const std::byte*>(p);
  out->insert(out->end(), b, b + n * sizeof(T));
}

}  // namespace

Result<LowRankBasis> LowRankBasis::Fit(const BlockShape& shape,
                                       std::span<const std::span<const std::byte>> samples, uint32_t rank) {
  KVMESH_RETURN_IF_ERROR(shape.Validate());
  if (samples.empty()) return InvalidArgument("lowrank fit: needs at least one sample block");
  if (rank == 0 || rank > shape.head_dim)
    return InvalidArgument("lowrank fit: rank must be in 1.." + std::to_string(shape.head_dim));
  for (const auto& s : samples)
    if (s.size() < shape.bytes())
      return InvalidArgument("lowrank fit: a sample holds " + std::to_string(s.size()) + " bytes, the shape needs " +
                             std::to_string(shape.bytes()));
  LowRankBasis b;
  b.layer_begin_ = shape.layer_begin;
  b.layers_ = shape.layers;
  b.head_begin_ = shape.head_begin;
  b.heads_ = shape.heads;
  b.head_dim_ = shape.head_dim;
  b.rank_ = rank;
  const uint32_t n = shape.head_dim;
  const size_t planes = shape.planes();
  b.mean_.assign(planes * n, 0.0f);
  b.basis_.assign(planes * rank * n, 0.0f);
  b.residual_.assign(planes, 0.0f);
  const uint8_t type = static_cast<uint8_t>(shape.dtype);
  const size_t plane_bytes = shape.plane_elements() * DTypeSize(shape.dtype);
  std::vector<double> mean(n), cov(static_cast<size_t>(n) * n), row(n), q;
  for (size_t p = 0; p < planes; ++p) {
    std::fill(mean.begin(), mean.end(), 0.0);
    std::fill(cov.begin(), cov.end(), 0.0);
    size_t rows = 0;
    for (const auto& s : samples) {
      const auto* plane = reinterpret_cast<const uint8_t*>(s.data()) + p * plane_bytes;
      for (uint32_t t = 0; t < shape.tokens; ++t, ++rows)
        for (uint32_t d = 0; d < n; ++d) mean[d] += LoadElem(plane, size_t{t} * n + d, type);
    }
    for (double& m : mean) m /= static_cast<double>(rows);
    for (const auto& s : samples) {
      const auto* plane = reinterpret_cast<const uint8_t*>(s.data()) + p * plane_bytes;
      for (uint32_t t = 0; t < shape.tokens; ++t) {
        for (uint32_t d = 0; d < n; ++d) row[d] = LoadElem(plane, size_t{t} * n + d, type) - mean[d];
        for (uint32_t i = 0; i < n; ++i) {
          double* c = &cov[static_cast<size_t>(i) * n];
          for (uint32_t j = i; j < n; ++j) c[j] += row[i] * row[j];
        }
      }
    }
    for (uint32_t i = 0; i < n; ++i)
      for (uint32_t j = i; j < n; ++j) cov[static_cast<size_t>(j) * n + i] = cov[static_cast<size_t>(i) * n + j];
    double trace = 0;
    for (uint32_t i = 0; i < n; ++i) trace += cov[static_cast<size_t>(i) * n + i];
    TopEigenvectors(cov, n, rank, &q);
    double captured = 0;
    for (uint32_t r = 0; r < rank; ++r) {
      const double* v = &q[static_cast<size_t>(r) * n];
      for (uint32_t i = 0; i < n; ++i) {
        double s = 0;
        for (uint32_t j = 0; j < n; ++j) s += cov[static_cast<size_t>(i) * n + j] * v[j];
        captured += v[i] * s;
      }
    }
    for (uint32_t d = 0; d < n; ++d) b.mean_[p * n + d] = static_cast<float>(mean[d]);
    for (size_t i = 0; i < size_t{rank} * n; ++i) b.basis_[p * rank * n + i] = static_cast<float>(q[i]);
    b.residual_[p] = trace > 0 ? static_cast<float>(std::max(0.0, 1.0 - captured / trace)) : 0.0f;
  }
  b.ComputeId();
  return b;
}

std::vector<std::byte> LowRankBasis::Serialize() const {
  std::vector<std::byte> out;
  const uint32_t hdr[kHeaderWords] = {kMagic, kVersion, layer_begin_, layers_, head_begin_, heads_, head_dim_, rank_};
  Put(&out, hdr, kHeaderWords);
  Put(&out, mean_.data(), mean_.size());
  Put(&out, basis_.data(), basis_.size());
  Put(&out, residual_.data(), residual_.size());
  const uint64_t sum = Checksum64(out.data(), out.size());
  Put(&out, &sum, 1);
  return out;
}

void LowRankBasis::ComputeTranspose() {
  const size_t planes = size_t{2} * layers_ * heads_;
  basis_t_.resize(basis_.size());
  for (size_t p = 0; p < planes; ++p)
    for (uint32_t r = 0; r < rank_; ++r)
      for (uint32_t d = 0; d < head_dim_; ++d)
        basis_t_[(p * head_dim_ + d) * rank_ + r] = basis_[(p * rank_ + r) * head_dim_ + d];
}

void LowRankBasis::ComputeId() {
  ComputeTranspose();
  std::vector<std::byte> s = Serialize();
  std::memcpy(&id_, s.data() + s.size() - 8, 8);
}

Result<LowRankBasis> LowRankBasis::Parse(std::span<const std::byte> bytes) {
  uint32_t hdr[kHeaderWords];
  if (bytes.size() < sizeof(hdr) + 8) return DataLoss("lowrank basis: truncated (" + std::to_string(bytes.size()) + " bytes)");
  std::memcpy(hdr, bytes.data(), sizeof(hdr));
  if (hdr[0] != kMagic) return InvalidArgument("lowrank basis: not a basis file (bad magic)");
  if (hdr[1] != kVersion) return InvalidArgument("lowrank basis: unsupported version " + std::to_string(hdr[1]));
  LowRankBasis b;
  b.layer_begin_ = hdr[2];
  b.layers_ = hdr[3];
  b.head_begin_ = hdr[4];
  b.heads_ = hdr[5];
  b.head_dim_ = hdr[6];
  b.rank_ = hdr[7];
  if (b.layers_ == 0 || b.heads_ == 0 || b.head_dim_ == 0 || b.rank_ == 0 || b.rank_ > b.head_dim_ ||
      b.layers_ > 65536 || b.heads_ > 65536 || b.head_dim_ > 65536)
    return DataLoss("lowrank basis: bad dimensions");
  const size_t planes = size_t{2} * b.layers_ * b.heads_;
  const size_t floats = planes * b.head_dim_ + planes * b.rank_ * b.head_dim_ + planes;
  if (bytes.size() != sizeof(hdr) + floats * 4 + 8)
    return DataLoss("lowrank basis: size " + std::to_string(bytes.size()) + " does not match its dimensions");
  uint64_t sum;
  std::memcpy(&sum, bytes.data() + bytes.size() - 8, 8);
  if (sum != Checksum64(bytes.data(), bytes.size() - 8)) return DataLoss("lowrank basis: checksum mismatch");
  const std::byte* p = bytes.data() + sizeof(hdr);
  auto take = [&p](std::vector<float>* v, size_t n) {
    v->resize(n);
    std::memcpy(v->data(), p, n * 4);
    p += n * 4;
  };
  take(&b.mean_, planes * b.head_dim_);
  take(&b.basis_, planes * b.rank_ * b.head_dim_);
  take(&b.residual_, planes);
  b.id_ = sum;
  b.ComputeTranspose();
  return b;
}

Result<LowRankBasis> LowRankBasis::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus("cannot open lowrank basis " + path, errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  Result<LowRankBasis> b = Parse(std::as_bytes(std::span(s.data(), s.size())));
  if (!b.ok()) return b.status().WithContext(path);
  return b;
}

Status LowRankBasis::Save(const std::string& path) const {
  std::vector<std::byte> s = Serialize();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return ErrnoStatus("cannot write " + path, errno);
  out.write(reinterpret_cast<const char*>(s.data()), static_cast<std::streamsize>(s.size()));
  if (!out) return IoError("writing " + path + " failed");
  return Status::Ok();
}

double LowRankBasis::mean_residual() const {
  if (residual_.empty()) return 0;
  double s = 0;
  for (float r : residual_) s += r;
  return s / static_cast<double>(residual_.size());
}

Status LowRankBasis::Covers(uint32_t layer, uint32_t head, uint32_t head_dim, uint32_t rank) const {
  if (layer < layer_begin_ || layer - layer_begin_ >= layers_ || head < head_begin_ || head - head_begin_ >= heads_)
    return InvalidArgument("lowrank basis does not cover layer " + std::to_string(layer) + " head " +
                           std::to_string(head));
  if (head_dim != head_dim_)
    return InvalidArgument("lowrank basis has head_dim " + std::to_string(head_dim_) + ", the block " +
                           std::to_string(head_dim));
  if (rank == 0 || rank > rank_)
    return InvalidArgument("lowrank rank " + std::to_string(rank) + " exceeds the basis rank " + std::to_string(rank_));
  return Status::Ok();
}

const float* LowRankBasis::mean(uint32_t layer, uint32_t kv, uint32_t head) const {
  return &mean_[Index(layer, kv, head) * head_dim_];
}
const float* LowRankBasis::basis(uint32_t layer, uint32_t kv, uint32_t head) const {
  return &basis_[Index(layer, kv, head) * rank_ * head_dim_];
}
float LowRankBasis::residual(uint32_t layer, uint32_t kv, uint32_t head) const {
  return residual_[Index(layer, kv, head)];
}

void LowRankBasis::EncodePlane(uint32_t layer, uint32_t kv, uint32_t head, uint32_t rank, const uint8_t* in,
                               uint8_t in_type, uint32_t tokens, uint8_t* out) const {
  const float* m = mean(layer, kv, head);
  // Transposed basis [dim][rank]: c[r] accumulates over d in order (the same
  // sums as row . basis_r), with the inner loop over r free to vectorise.
  const float* bt = &basis_t_[Index(layer, kv, head) * rank_ * head_dim_];
  const uint32_t n = head_dim_;
  thread_local std::vector<float> row, coef;
  row.resize(n);
  coef.resize(rank_);
  const bool avx2 = HaveAvx2Path();
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint32_t d = 0; d < n; ++d) row[d] = LoadElem(in, size_t{t} * n + d, in_type) - m[d];
    if (avx2) {
      LowRankProjectAvx2(row.data(), n, bt, rank_, rank, coef.data());
      for (uint32_t r = 0; r < rank; ++r) StoreU16(out, size_t{t} * rank + r, FloatToHalf(coef[r]));
      continue;
    }
    std::fill(coef.begin(), coef.end(), 0.0f);
    for (uint32_t d = 0; d < n; ++d) {
      const float x = row[d];
      const float* v = bt + size_t{d} * rank_;
      for (uint32_t r = 0; r < rank; ++r) coef[r] += x * v[r];
    }
    for (uint32_t r = 0; r < rank; ++r) StoreU16(out, size_t{t} * rank + r, FloatToHalf(coef[r]));
  }
  const size_t used = size_t{tokens} * rank * 2;
  std::memset(out + used, 0, AlignUp(used, kPlaneAlign) - used);
}

void LowRankBasis::DecodePlane(uint32_t layer, uint32_t kv, uint32_t head, uint32_t rank, const uint8_t* enc,
                               uint32_t tokens, uint8_t* out, uint8_t out_type) const {
  const float* m = mean(layer, kv, head);
  const float* b = basis(layer, kv, head);
  const uint32_t n = head_dim_;
  thread_local std::vector<float> acc, coef;
  acc.resize(n);
  coef.resize(rank);
  const bool avx2 = HaveAvx2Path();
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint32_t r = 0; r < rank; ++r) coef[r] = HalfToFloat(LoadU16(enc, size_t{t} * rank + r));
    if (avx2) {
      LowRankReconstructAvx2(coef.data(), rank, b, m, n, acc.data());
      for (uint32_t d = 0; d < n; ++d) StoreElem(out, size_t{t} * n + d, out_type, acc[d]);
      continue;
    }
    std::memcpy(acc.data(), m, n * 4);
    for (uint32_t r = 0; r < rank; ++r) {
      const float* v = b + size_t{r} * n;
      const float c = coef[r];
      for (uint32_t d = 0; d < n; ++d) acc[d] += c * v[d];
    }
    for (uint32_t d = 0; d < n; ++d) StoreElem(out, size_t{t} * n + d, out_type, acc[d]);
  }
}

}  // namespace kvmesh::kernels
