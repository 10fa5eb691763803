// coordinator/decode/frame_gen.h — seeded synthetic video for the world
// model's tests and `kvmesh worldmodel` (docs/worldmodel.md): a static
// textured background, moving sprites, camera pans, lighting drift, sensor
// noise and scene cuts, each with a knob for how much of a frame it changes.
// Frame t is a pure function of (params, t).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvmesh/status.h"

namespace kvmesh::decode {

struct FrameGenParams {
  std::string name = "static";
  uint32_t width = 64, height = 64;
  uint64_t seed = 7;
  uint32_t sprites = 1;         // moving squares
  uint32_t sprite_size = 8;     // side in pixels
  float sprite_speed = 1.0f;    // pixels per frame (each sprite its own direction, bouncing)
  float pan_speed = 0.0f;       // camera pan, background pixels per frame (x; y at half)
  float light_drift = 0.0f;     // gray levels per frame added to the whole frame (a slow ramp)
  float noise_sigma = 0.0f;     // sensor noise, gray levels (Gaussian, fresh every frame)
  uint32_t cut_every = 0;       // a scene cut (new background and sprites) every N frames; 0 = none
  uint32_t action_period = 8;   // the action cycles through 0..7 every this many frames

  Status Validate() const;
};

// The parameter sets `kvmesh worldmodel --scene` names. tuned: the sets the
// tau/rho defaults were chosen on; the others are held out of tuning.
struct FrameGenPreset {
  FrameGenParams params;
  bool tuned = false;
  const char* what = "";
};
const std::vector<FrameGenPreset>& FrameGenPresets();
Result<FrameGenParams> FrameGenPresetByName(const std::string& name);

struct SpriteBox {
  int32_t x = 0, y = 0;  // top-left, frame pixels (may be partly outside)
  uint32_t size = 0;
};

class FrameGenerator {
 public:
  explicit FrameGenerator(FrameGenParams p);
  const FrameGenParams& params() const { return p_; }
  // Frame t, width * height gray pixels, row-major.
  std::vector<uint8_t> Frame(uint32_t t) const;
  void Frame(uint32_t t, std::span<uint8_t> out) const;
  uint32_t Action(uint32_t t) const;
  // Where the sprites are in frame t.
  std::vector<SpriteBox> Sprites(uint32_t t) const;

 private:
  float Background(uint64_t scene, float x, float y) const;
  FrameGenParams p_;
};

}  // namespace kvmesh::decode
