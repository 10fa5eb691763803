// Live sequences over one block store (shard_node/sequence_table.h).
#include "shard_node/sequence_table.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "absl/container/flat_hash_map.h"
#include "kernels/codec.h"
#include "shard_node/block_store.h"
#include "shard_node/codec_stage.h"
#include "shard_node/tenants.h"
#include "shard_node/tiered_store.h"

namespace kvmesh {
namespace {

using Bytes = std::vector<std::byte>;

// One block of a sequence. Exactly one of ref / priv / open holds the bytes
// (with a codec, ref holds the encoded block and dec its decoded values).
struct Block {
  BlockKey chain;                                // chain key (set when sealed)
  BlockRef ref;                                  // sealed, in the store, pinned
  std::shared_ptr<const Bytes> dec;              // codec: the decoded copy of ref
  std::shared_ptr<const Bytes> priv;             // sealed, refused by the store
  Bytes open;                                    // open: written in place

  bool sealed() const { return ref.valid() || priv != nullptr; }
  const std::byte* data() const {
    if (dec) return dec->data();
    if (ref.valid()) return ref.data().data();
    if (priv) return priv->data();
    return open.data();
  }
};

struct Seq {
  std::vector<TokenId> tokens;
  std::vector<Block> blocks;  // ceil(tokens / block_tokens)
  uint32_t sealed = 0;        // blocks [0, sealed) are sealed
};

}  // namespace

struct SequenceTable::Impl {
  BlockStore* store;
  ModelSpec model;
  BlockLayout layout;
  SequenceOptions options;
  // What blocks are found, read and stored through: the node's tiers when
  // options.tiers is set (demoted blocks are promoted back), else `store`.
  BlockStoreOps* serving;
  KeyDeriver deriver;
  size_t elem;  // bytes per element
  // Codec of sealed blocks (null: raw), its BlockMeta::codec id, the slice's
  // shape and the largest encoded block.
  std::unique_ptr<kernels::Codec> codec;
  uint8_t codec_id = 0;
  kernels::BlockShape shape;
  size_t max_encoded = 0;

  mutable std::mutex mu;
  std::unordered_map<SeqId, std::unique_ptr<Seq>> seqs;  // guarded by mu
  SeqId next_id = 1;                                     // guarded by mu
  SequenceStats stats;                                   // guarded by mu (all-time counters)
  // Decoded copies of encoded sealed blocks, shared by every sequence that
  // reads the block; an entry dies with its last reader.
  absl::flat_hash_map<BlockKey, std::weak_ptr<const Bytes>> decoded;  // guarded by mu
  size_t next_sweep = 64;                                             // guarded by mu

  Impl(BlockStore* s, const ModelSpec& m, const BlockLayout& l, SequenceOptions o)
      : store(s), model(m), layout(l), options(std::move(o)),
        serving(options.tiers ? static_cast<BlockStoreOps*>(options.tiers) : s),
        deriver(m.model_id, options.tenant_salt, m.block_tokens), elem(DTypeSize(m.dtype)) {}

  Seq* Find(SeqId id) const {
    std::lock_guard<std::mutex> lock(mu);
    auto it = seqs.find(id);
    return it == seqs.end() ? nullptr : it->second.get();
  }
  SeqId Add(std::unique_ptr<Seq> s) {
    std::lock_guard<std::mutex> lock(mu);
    SeqId id = next_id++;
    seqs.emplace(id, std::move(s));
    return id;
  }
  void Count(uint64_t SequenceStats::*field, uint64_t n = 1) {
    std::lock_guard<std::mutex> lock(mu);
    stats.*field += n;
  }
  // A stored block of this slice a sequence can use, whatever wrote it: raw
  // (read in place), or encoded (by this table's codec, another table's, or
  // the node's pressure level 2; read through a shared decoded copy, and a
  // miss if it does not decode to this slice's shape).
  bool Usable(const BlockRef& r) const {
    return r.meta().codec == 0 ? r.meta().size == layout.bytes() : r.meta().logical_size == layout.bytes();
  }
  static bool Encoded(const BlockRef& r) { return r.meta().codec != 0; }

  // The shared decoded copy of stored block `key` (encoded, Usable): from the
  // cache, else `fresh` when given (this writer's own decode), else decoded
  // from the store. DataLoss when the block is not this slice's shape.
  Result<std::shared_ptr<const Bytes>> Decoded(const BlockKey& key, const BlockRef& ref,
                                               std::shared_ptr<const Bytes> fresh) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = decoded.find(key);
      if (it != decoded.end()) {
        if (auto d = it->second.lock()) return d;
      }
    }
    if (!fresh) {
      std::span<const std::byte> blob = ref.data();
      KVMESH_ASSIGN_OR_RETURN(kernels::BlockInfo info, kernels::InspectBlock(blob));
      if (!(info.shape == shape)) return DataLoss("stored block " + key.ToHex() + " is " + info.shape.ToString() +
                                                  ", not this sequence slice's " + shape.ToString());
      auto d = std::make_shared<Bytes>(layout.bytes());
      KVMESH_RETURN_IF_ERROR(codec ? codec->Decode(blob, *d) : kernels::DecodeBlock(blob, *d));
      fresh = std::move(d);
    }
    std::lock_guard<std::mutex> lock(mu);
    std::weak_ptr<const Bytes>& slot = decoded[key];
    if (auto d = slot.lock()) return d;  // another thread decoded it first
    slot = fresh;
    if (decoded.size() >= next_sweep) {
      absl::erase_if(decoded, [](const auto& kv) { return kv.second.expired(); });
      next_sweep = 2 * decoded.size() + 64;
    }
    return fresh;
  }
  BlockKey PrevChain(const Seq& s, size_t b) const { return b == 0 ? deriver.root() : s.blocks[b - 1].chain; }
  BlockKey StoredKey(const BlockKey& chain) const {
    return ScopeKey(options.scope, KeyDeriver::Qualify(chain, layout.layers, layout.heads));
  }

  // Seals block b of s (full, open, all earlier blocks sealed).
  void Seal(Seq& s, size_t b) {
    const uint32_t bt = layout.block_tokens;
    Block& blk = s.blocks[b];
    blk.chain = KeyDeriver::Chain(PrevChain(s, b), std::span<const TokenId>(s.tokens).subspan(b * bt, bt));
    const BlockKey key = StoredKey(blk.chain);
    const bool existed = serving->Exists(key, false);
    PutOptions po;
    po.priority = options.priority;
    std::span<const std::byte> payload = blk.open;
    std::shared_ptr<const Bytes> dec;  // codec: the values every reader of this block sees
    thread_local Bytes enc;
    if (codec) {
      // Encode, then decode our own bytes: the block reads back dequantised
      // whether or not the store keeps it, so results never depend on pressure.
      enc.resize(max_encoded);
      Result<size_t> n = codec->Encode(shape, blk.open, enc);
      auto d = std::make_shared<Bytes>(layout.bytes());
      Status ok = n.ok() ? codec->Decode({enc.data(), *n}, *d) : n.status();
      if (ok.ok()) {
        payload = {enc.data(), *n};
        dec = std::move(d);
        po.codec = codec_id;
        po.logical_size = static_cast<uint32_t>(layout.bytes());
        std::lock_guard<std::mutex> lock(mu);
        stats.encoded_seals += 1;
        stats.encoded_raw_bytes += layout.bytes();
        stats.encoded_stored_bytes += *n;
      }
      // An encode failure (none is expected for a validated slice) keeps the
      // block raw and private below.
    }
    Status st = (codec && !dec) ? Internal("codec refused the block") : serving->Put(key, payload, po);
    Result<BlockRef> ref = st.ok() ? serving->Get(key) : Result<BlockRef>(st);
    if (ref.ok() && Usable(*ref) && Encoded(*ref)) {
      // Ours (dec) or, on a dedup, another writer's encoded block.
      Result<std::shared_ptr<const Bytes>> shared = Decoded(key, *ref, existed ? nullptr : dec);
      if (shared.ok()) {
        blk.dec = std::move(shared).value();
      } else {
        ref = shared.status();
      }
    }
    if (ref.ok() && Usable(*ref)) {
      blk.ref = std::move(ref).value();
      blk.open = {};
      Count(&SequenceStats::seals);
      if (existed) Count(&SequenceStats::seal_dedups);
    } else {
      blk.priv = dec ? std::move(dec) : std::make_shared<const Bytes>(std::move(blk.open));
      blk.open = {};
    }
    s.sealed = static_cast<uint32_t>(b + 1);
  }
};

SequenceTable::SequenceTable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SequenceTable::~SequenceTable() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->seqs.clear();  // BlockRefs unpin
}

Result<std::unique_ptr<SequenceTable>> SequenceTable::Create(BlockStore* store, const ModelSpec& model, Range layers,
                                                             Range heads, SequenceOptions options) {
  if (store == nullptr) return InvalidArgument("sequence table needs a block store");
  KVMESH_RETURN_IF_ERROR(model.Validate());
  KVMESH_ASSIGN_OR_RETURN(BlockLayout layout, BlockLayout::Slice(model, layers, heads));
  std::unique_ptr<kernels::Codec> codec;
  size_t stored_bytes = layout.bytes();
  const kernels::BlockShape shape = kernels::BlockShape::FromLayout(layout);
  if (options.codec.enabled()) {
    KVMESH_ASSIGN_OR_RETURN(kernels::CodecPolicy policy, MakeCodecPolicy(options.codec, "sequence codec"));
    KVMESH_ASSIGN_OR_RETURN(codec, kernels::MakeCodec(std::move(policy)));
    KVMESH_ASSIGN_OR_RETURN(stored_bytes, codec->MaxEncodedSize(shape));
  }
  if (stored_bytes > store->slot_bytes()) {
    return InvalidArgument("a sequence block of " + std::to_string(stored_bytes) +
                           " bytes does not fit the store's slots of " + std::to_string(store->slot_bytes()) +
                           " bytes");
  }
  auto impl = std::make_unique<Impl>(store, model, layout, std::move(options));
  impl->shape = shape;
  if (codec) {
    impl->codec_id = kernels::PrimaryCodecId(codec->policy());
    impl->codec = std::move(codec);
    impl->max_encoded = stored_bytes;
  }
  return std::unique_ptr<SequenceTable>(new SequenceTable(std::move(impl)));
}

const BlockLayout& SequenceTable::layout() const { return impl_->layout; }
const KeyDeriver& SequenceTable::deriver() const { return impl_->deriver; }

SeqId SequenceTable::Create() { return impl_->Add(std::make_unique<Seq>()); }

size_t SequenceTable::MatchPrefix(std::span<const TokenId> tokens) {
  Impl& im = *impl_;
  const uint32_t bt = im.layout.block_tokens;
  BlockKey chain = im.deriver.root();
  size_t run = 0;
  for (size_t b = 0; (b + 1) * bt <= tokens.size(); ++b) {
    chain = KeyDeriver::Chain(chain, tokens.subspan(b * bt, bt));
    if (!im.serving->Exists(im.StoredKey(chain), /*touch=*/true)) break;
    ++run;
  }
  return run;
}

SeqId SequenceTable::CreateFromPrefix(std::span<const TokenId> tokens, size_t max_blocks) {
  Impl& im = *impl_;
  const uint32_t bt = im.layout.block_tokens;
  auto s = std::make_unique<Seq>();
  BlockKey chain = im.deriver.root();
  for (size_t b = 0; b < max_blocks && (b + 1) * bt <= tokens.size(); ++b) {
    chain = KeyDeriver::Chain(chain, tokens.subspan(b * bt, bt));
    const BlockKey key = im.StoredKey(chain);
    Result<BlockRef> ref = im.serving->Get(key);  // promotes a demoted block
    if (!ref.ok() || !im.Usable(*ref)) break;
    Block blk;
    if (im.Encoded(*ref)) {
      Result<std::shared_ptr<const Bytes>> dec = im.Decoded(key, *ref, nullptr);
      if (!dec.ok()) break;  // a block that does not decode is a miss
      blk.dec = std::move(dec).value();
    }
    blk.chain = chain;
    blk.ref = std::move(ref).value();
    s->blocks.push_back(std::move(blk));
  }
  s->sealed = static_cast<uint32_t>(s->blocks.size());
  s->tokens.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(s->blocks.size() * bt));
  im.Count(&SequenceStats::attached_blocks, s->blocks.size());
  return im.Add(std::move(s));
}

Result<uint32_t> SequenceTable::Extend(SeqId seq, std::span<const TokenId> tokens) {
  Impl& im = *impl_;
  Seq* s = im.Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  const uint32_t bt = im.layout.block_tokens;
  const uint32_t pos = static_cast<uint32_t>(s->tokens.size());
  s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
  const size_t need = (s->tokens.size() + bt - 1) / bt;
  while (s->blocks.size() < need) {
    Block blk;
    blk.open.assign(im.layout.bytes(), std::byte{0});
    s->blocks.push_back(std::move(blk));
  }
  return pos;
}

Status SequenceTable::Write(SeqId seq, uint32_t layer, uint32_t pos, uint32_t n, std::span<const std::byte> k,
                            std::span<const std::byte> v) {
  Impl& im = *impl_;
  const BlockLayout& L = im.layout;
  Seq* s = im.Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  if (layer < L.layers.begin || layer >= L.layers.end)
    return InvalidArgument("layer " + std::to_string(layer) + " is outside the table's slice");
  const uint32_t bt = L.block_tokens;
  if (size_t{pos} + n > s->tokens.size()) return InvalidArgument("write past the sequence's extended length");
  if (pos < s->sealed * bt) return FailedPrecondition("write into a sealed block");
  const size_t H = L.heads.size(), row = size_t{L.head_dim} * im.elem;
  if (k.size() < n * H * row || v.size() < n * H * row) return InvalidArgument("k/v shorter than n x heads x head_dim");
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t p = pos + i;
    Block& blk = s->blocks[p / bt];
    for (size_t h = 0; h < H; ++h) {
      const uint32_t head = L.heads.begin + static_cast<uint32_t>(h);
      std::memcpy(blk.open.data() + L.Offset(layer, 0, head, p % bt), k.data() + (i * H + h) * row, row);
      std::memcpy(blk.open.data() + L.Offset(layer, 1, head, p % bt), v.data() + (i * H + h) * row, row);
    }
  }
  return Status::Ok();
}

Status SequenceTable::Commit(SeqId seq) {
  Impl& im = *impl_;
  Seq* s = im.Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  const uint32_t bt = im.layout.block_tokens;
  const size_t full = s->tokens.size() / bt;
  for (size_t b = s->sealed; b < full; ++b) im.Seal(*s, b);
  return Status::Ok();
}

Status SequenceTable::Append(SeqId seq, std::span<const TokenId> tokens, std::span<const std::byte> k,
                             std::span<const std::byte> v) {
  const BlockLayout& L = impl_->layout;
  const size_t per_layer = tokens.size() * L.heads.size() * L.head_dim * impl_->elem;
  if (k.size() < per_layer * L.layers.size() || v.size() < per_layer * L.layers.size())
    return InvalidArgument("k/v shorter than layers x n x heads x head_dim");
  KVMESH_ASSIGN_OR_RETURN(uint32_t pos, Extend(seq, tokens));
  const uint32_t n = static_cast<uint32_t>(tokens.size());
  for (uint32_t l = 0; l < L.layers.size(); ++l) {
    KVMESH_RETURN_IF_ERROR(Write(seq, L.layers.begin + l, pos, n, k.subspan(l * per_layer, per_layer),
                                 v.subspan(l * per_layer, per_layer)));
  }
  return Commit(seq);
}

Status SequenceTable::Truncate(SeqId seq, uint32_t n) {
  Impl& im = *impl_;
  Seq* s = im.Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  if (n > s->tokens.size())
    return InvalidArgument("truncate of " + std::to_string(n) + " tokens from a sequence of " +
                           std::to_string(s->tokens.size()));
  const uint32_t bt = im.layout.block_tokens;
  const size_t len = s->tokens.size() - n;
  const size_t keep = (len + bt - 1) / bt;
  s->tokens.resize(len);
  s->blocks.resize(keep);  // dropped sealed blocks unpin here
  if (s->sealed > keep) s->sealed = static_cast<uint32_t>(keep);
  if (len % bt != 0 && s->sealed == keep) {
    // The last kept block is sealed but now partial: copy it into an open block.
    Block& blk = s->blocks.back();
    std::vector<std::byte> open(im.layout.bytes());
    if (blk.dec) {
      std::memcpy(open.data(), blk.dec->data(), open.size());
    } else if (blk.ref.valid()) {
      im.store->backend().CopyOut(open.data(), blk.ref.data().data(), open.size());
    } else {
      std::memcpy(open.data(), blk.priv->data(), open.size());
    }
    blk = Block{};
    blk.open = std::move(open);
    s->sealed = static_cast<uint32_t>(keep - 1);
    im.Count(&SequenceStats::unseals);
  }
  return Status::Ok();
}

Result<SeqId> SequenceTable::Fork(SeqId seq) {
  Impl& im = *impl_;
  const Seq* s = im.Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  auto f = std::make_unique<Seq>();
  f->tokens = s->tokens;
  f->sealed = s->sealed;
  f->blocks.resize(s->blocks.size());
  for (size_t b = 0; b < s->blocks.size(); ++b) {
    const Block& src = s->blocks[b];
    Block& dst = f->blocks[b];
    dst.chain = src.chain;
    if (src.ref.valid()) {
      // Pin the same stored block once more (no copy). It is pinned by `s`,
      // so it is still there; a checksum failure falls back to a private copy.
      Result<BlockRef> ref = im.serving->Get(src.ref.meta().key);
      if (ref.ok()) {
        dst.ref = std::move(ref).value();
        dst.dec = src.dec;
      } else if (src.dec) {
        dst.priv = src.dec;
      } else {
        auto copy = std::make_shared<Bytes>(src.ref.meta().size);
        im.store->backend().CopyOut(copy->data(), src.ref.data().data(), copy->size());
        dst.priv = std::move(copy);
      }
    } else if (src.priv) {
      dst.priv = src.priv;
    } else {
      dst.open = src.open;
    }
  }
  im.Count(&SequenceStats::forks);
  return im.Add(std::move(f));
}

Status SequenceTable::Release(SeqId seq) {
  std::unique_ptr<Seq> s;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->seqs.find(seq);
    if (it == impl_->seqs.end()) return NotFound("sequence " + std::to_string(seq) + " does not exist");
    s = std::move(it->second);
    impl_->seqs.erase(it);
  }
  return Status::Ok();  // s unpins its blocks here, outside the table lock
}

Result<uint32_t> SequenceTable::Length(SeqId seq) const {
  const Seq* s = impl_->Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  return static_cast<uint32_t>(s->tokens.size());
}

Result<std::vector<TokenId>> SequenceTable::Tokens(SeqId seq) const {
  const Seq* s = impl_->Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  return s->tokens;
}

Result<uint32_t> SequenceTable::SealedBlocks(SeqId seq) const {
  const Seq* s = impl_->Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  return s->sealed;
}

Result<SequenceView> SequenceTable::View(SeqId seq) const {
  const Seq* s = impl_->Find(seq);
  if (s == nullptr) return NotFound("sequence " + std::to_string(seq) + " does not exist");
  SequenceView v;
  v.layout = impl_->layout;
  v.length = static_cast<uint32_t>(s->tokens.size());
  v.blocks.reserve(s->blocks.size());
  for (const Block& b : s->blocks) v.blocks.push_back(b.data());
  return v;
}

SequenceStats SequenceTable::Stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  SequenceStats st = impl_->stats;
  st.sequences = impl_->seqs.size();
  for (const auto& [key, d] : impl_->decoded) st.decoded_blocks += d.expired() ? 0 : 1;
  for (const auto& [id, s] : impl_->seqs) {
    for (const Block& b : s->blocks) {
      if (b.ref.valid()) ++st.sealed_blocks;
      else if (b.priv) ++st.private_blocks;
      else ++st.open_blocks;
    }
  }
  return st;
}

}  // namespace kvmesh
