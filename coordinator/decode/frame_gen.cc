#include "coordinator/decode/frame_gen.h"

#include <algorithm>
#include <cmath>

#include "common/hash.h"

namespace kvmesh::decode {
namespace {

// Uniform [0, 1) from a hash of the arguments.
double U01(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t h = Mix64(Mix64(Mix64(a ^ 0x5851F42D4C957F2Dull) ^ b) ^ Mix64(c + 0x14057B7EF767814Full) ^ d);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

// Bilinear value noise with lattice spacing s at (x, y).
float ValueNoise(uint64_t seed, uint64_t octave, float x, float y, float s) {
  const float fx = x / s, fy = y / s;
  const float x0 = std::floor(fx), y0 = std::floor(fy);
  const float tx = fx - x0, ty = fy - y0;
  auto at = [&](float i, float j) {
    return static_cast<float>(U01(seed, octave, static_cast<uint64_t>(static_cast<int64_t>(i) + (1 << 20)),
                                  static_cast<uint64_t>(static_cast<int64_t>(j) + (1 << 20))));
  };
  const float a = at(x0, y0), b = at(x0 + 1, y0), c = at(x0, y0 + 1), d = at(x0 + 1, y0 + 1);
  return (a * (1 - tx) + b * tx) * (1 - ty) + (c * (1 - tx) + d * tx) * ty;
}

// A position bouncing between 0 and span.
float Bounce(float x, float span) {
  if (span <= 0) return 0;
  const float period = 2 * span;
  float m = std::fmod(x, period);
  if (m < 0) m += period;
  return m <= span ? m : period - m;
}

FrameGenParams Preset(const char* name, uint64_t seed, uint32_t sprites, uint32_t size, float speed, float pan,
                      float drift, float noise, uint32_t cut) {
  FrameGenParams p;
  p.name = name;
  p.seed = seed;
  p.sprites = sprites;
  p.sprite_size = size;
  p.sprite_speed = speed;
  p.pan_speed = pan;
  p.light_drift = drift;
  p.noise_sigma = noise;
  p.cut_every = cut;
  return p;
}

}  // namespace

Status FrameGenParams::Validate() const {
  if (width == 0 || height == 0) return InvalidArgument("frame generator: width and height must be > 0");
  if (sprite_size == 0 || sprite_size > std::min(width, height))
    return InvalidArgument("frame generator: sprite_size must be in [1, min(width, height)]");
  if (!(noise_sigma >= 0) || !(sprite_speed >= 0)) return InvalidArgument("frame generator: negative noise or speed");
  if (action_period == 0) return InvalidArgument("frame generator: action_period must be > 0");
  return Status::Ok();
}

const std::vector<FrameGenPreset>& FrameGenPresets() {
  static const std::vector<FrameGenPreset> kPresets = {
      {Preset("static", 7, 1, 8, 1.0f, 0, 0, 2.0f, 0), true,
       "one 8-px sprite over a textured background, sensor noise sigma 2 (<= 10% of patches change)"},
      {Preset("busy", 11, 4, 10, 1.5f, 0, 0, 2.0f, 0), true, "four 10-px sprites, noise sigma 2"},
      {Preset("static-b", 23, 2, 6, 0.7f, 0, 0, 3.0f, 0), false,
       "held out: two 6-px sprites, another background, noise sigma 3"},
      {Preset("drift", 31, 1, 8, 1.0f, 0, 0.4f, 2.0f, 0), false,
       "held out: 'static' with the lighting rising 0.4 gray levels per frame"},
      {Preset("pan", 41, 1, 8, 1.0f, 0.5f, 0, 2.0f, 0), false, "held out: the camera pans 0.5 px per frame"},
      {Preset("cuts", 53, 2, 8, 1.0f, 0, 0, 2.0f, 16), false, "held out: a scene cut every 16 frames"},
      {Preset("noisy", 67, 1, 8, 1.0f, 0, 0, 6.0f, 0), false, "held out: 'static' with sensor noise sigma 6"},
  };
  return kPresets;
}

Result<FrameGenParams> FrameGenPresetByName(const std::string& name) {
  std::string names;
  for (const FrameGenPreset& p : FrameGenPresets()) {
    if (p.params.name == name) return p.params;
    names += (names.empty() ? "" : ", ") + p.params.name;
  }
  return InvalidArgument("unknown scene \"" + name + "\" (known: " + names + ")");
}

FrameGenerator::FrameGenerator(FrameGenParams p) : p_(std::move(p)) {}

float FrameGenerator::Background(uint64_t scene, float x, float y) const {
  const uint64_t s = Mix64(p_.seed ^ Mix64(scene + 1));
  return 128.0f + 140.0f * (ValueNoise(s, 1, x, y, 9.0f) - 0.5f) + 70.0f * (ValueNoise(s, 2, x, y, 3.0f) - 0.5f) +
         30.0f * (ValueNoise(s, 3, x, y, 1.0f) - 0.5f);
}

uint32_t FrameGenerator::Action(uint32_t t) const { return (t / p_.action_period) % 8; }

std::vector<SpriteBox> FrameGenerator::Sprites(uint32_t t) const {
  const uint64_t scene = p_.cut_every ? t / p_.cut_every : 0;
  const float ts = static_cast<float>(p_.cut_every ? t % p_.cut_every : t);
  std::vector<SpriteBox> out;
  const float sx = static_cast<float>(p_.width - p_.sprite_size), sy = static_cast<float>(p_.height - p_.sprite_size);
  for (uint32_t k = 0; k < p_.sprites; ++k) {
    const double ang = 2 * M_PI * U01(p_.seed, scene, k, 1);
    const float x0 = static_cast<float>(U01(p_.seed, scene, k, 2)) * sx,
                y0 = static_cast<float>(U01(p_.seed, scene, k, 3)) * sy;
    const float vx = p_.sprite_speed * static_cast<float>(std::cos(ang)),
                vy = p_.sprite_speed * static_cast<float>(std::sin(ang));
    out.push_back(SpriteBox{static_cast<int32_t>(std::lround(Bounce(x0 + vx * ts, sx))),
                            static_cast<int32_t>(std::lround(Bounce(y0 + vy * ts, sy))), p_.sprite_size});
  }
  return out;
}

std::vector<uint8_t> FrameGenerator::Frame(uint32_t t) const {
  std::vector<uint8_t> f(size_t{p_.width} * p_.height);
  Frame(t, f);
  return f;
}

void FrameGenerator::Frame(uint32_t t, std::span<uint8_t> out) const {
  const uint64_t scene = p_.cut_every ? t / p_.cut_every : 0;
  const float ox = p_.pan_speed * static_cast<float>(t), oy = 0.5f * p_.pan_speed * static_cast<float>(t);
  const float light = p_.light_drift * static_cast<float>(t);
  std::vector<float> img(size_t{p_.width} * p_.height);
  for (uint32_t y = 0; y < p_.height; ++y)
    for (uint32_t x = 0; x < p_.width; ++x)
      img[size_t{y} * p_.width + x] = Background(scene, static_cast<float>(x) + ox, static_cast<float>(y) + oy);
  for (const SpriteBox& b : Sprites(t))
    for (uint32_t dy = 0; dy < b.size; ++dy)
      for (uint32_t dx = 0; dx < b.size; ++dx) {
        const int32_t x = b.x + static_cast<int32_t>(dx), y = b.y + static_cast<int32_t>(dy);
        if (x < 0 || y < 0 || x >= static_cast<int32_t>(p_.width) || y >= static_cast<int32_t>(p_.height)) continue;
        img[size_t(y) * p_.width + size_t(x)] = ((dx / 2 + dy / 2) % 2) ? 235.0f : 20.0f;  // a checkered sprite
      }
  for (size_t i = 0; i < img.size(); ++i) {
    float v = img[i] + light;
    if (p_.noise_sigma > 0) {  // Box-Muller from two hashed uniforms
      const double u1 = std::max(U01(p_.seed, t, i, 11), 1e-12), u2 = U01(p_.seed, t, i, 12);
      v += p_.noise_sigma * static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * M_PI * u2));
    }
    out[i] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
  }
}

}  // namespace kvmesh::decode
