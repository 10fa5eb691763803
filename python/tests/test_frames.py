"""kvmesh.FrameStream (docs/worldmodel.md): world-model frames whose patches
reuse earlier frames' KV blocks by similarity, over nodes in this process."""

import random

import numpy as np
import pytest

import kvmesh

W = H = 32
PATCH = 8
PATCHES = (W // PATCH) * (H // PATCH)
BLOCK = 64  # bytes of a patch's block in these tests


def config():
    # One block per patch: block_tokens 1, fp32, 1 layer x 1 head x 8 (K and V: 64 bytes).
    return {"model": {"model_id": "frames-test", "num_layers": 1, "num_kv_heads": 1, "head_dim": 8,
                      "dtype": "fp32", "block_tokens": 1},
            "nodes": [{"id": "e0", "memory": {"host": "8MiB"}}, {"id": "e1", "memory": {"host": "8MiB"}}],
            "store": {"slot_bytes": "64KiB"}}


def background(seed):
    rng = random.Random(seed)
    return bytearray(rng.randrange(40, 216) for _ in range(W * H))


def noisy(frame, seed, sigma=2):
    rng = random.Random(seed)
    return bytearray(min(255, max(0, v + round(rng.gauss(0, sigma)))) for v in frame)


def blocks_of(frame_no):
    """A computed block per patch, naming the frame and patch that made it."""
    return b"".join(bytes([frame_no % 256, p]) * (BLOCK // 2) for p in range(PATCHES))


def run_frame(s, pixels, frame_no):
    m = s.match(pixels)
    out = bytearray(PATCHES * BLOCK)
    m = s.get_reused(out)
    s.commit(pixels, blocks_of(frame_no))
    return m, out


def test_identical_frames_reuse_every_patch_and_read_back_the_first_frames_blocks():
    with kvmesh.EmbeddedCluster(config()) as c:
        with c.frame_stream(stream_id=3, width=W, height=H, patch=PATCH) as s:
            assert s.patches == PATCHES
            bg = background(1)
            m, _ = run_frame(s, bg, 0)
            assert not any(p["reused"] for p in m)
            for t in range(1, 4):
                m, out = run_frame(s, bg, t)
                assert all(p["reused"] and p["source_frame"] == 0 for p in m)
                assert bytes(out) == blocks_of(0)  # the blocks frame 0 put, by reference
            assert s.stats["reused"] == 3 * PATCHES
            assert s.stats["blocks_put"] == PATCHES  # stored once
            assert s.references(m[0]["key"]) == 4
            assert s.history(0) == [m[0]["key"]] * 4


def test_sensor_noise_passes_the_gate_a_scene_cut_and_exact_mode_do_not():
    with kvmesh.EmbeddedCluster(config()) as c:
        s = c.frame_stream(stream_id=4, width=W, height=H, patch=PATCH)
        bg = background(2)
        run_frame(s, noisy(bg, 0), 0)
        m, _ = run_frame(s, noisy(bg, 1), 1)
        assert sum(p["reused"] for p in m) == PATCHES
        m, _ = run_frame(s, background(99), 2)  # a cut: another picture
        assert sum(p["reused"] for p in m) == 0
        s.end()
        e = c.frame_stream(stream_id=5, width=W, height=H, patch=PATCH, mode="exact")
        run_frame(e, noisy(bg, 0), 0)
        m, _ = run_frame(e, noisy(bg, 1), 1)
        assert sum(p["reused"] for p in m) == 0
        e.end()


def test_the_gate_comes_per_stream_and_bad_values_raise():
    with kvmesh.EmbeddedCluster(config()) as c:
        strict = c.frame_stream(stream_id=6, width=W, height=H, patch=PATCH, tau=0.9999, rho=0.0)
        bg = background(3)
        run_frame(strict, noisy(bg, 0), 0)
        m, _ = run_frame(strict, noisy(bg, 1), 1)
        assert sum(p["reused"] for p in m) == 0
        strict.end()
        with pytest.raises(kvmesh.InvalidArgumentError, match="mode"):
            c.frame_stream(mode="sometimes")
        with pytest.raises(kvmesh.InvalidArgumentError, match="multiples of patch"):
            c.frame_stream(width=30, height=H, patch=PATCH)
        s = c.frame_stream(stream_id=7, width=W, height=H, patch=PATCH)
        with pytest.raises(kvmesh.FailedPreconditionError):
            s.commit(bg, blocks_of(0))  # nothing matched yet
        with pytest.raises(kvmesh.InvalidArgumentError, match="pixels"):
            s.match(bytes(10))
        s.match(bg)
        with pytest.raises(kvmesh.InvalidArgumentError, match="one equal block per patch"):
            s.get_reused(bytearray(PATCHES * BLOCK + 1))


def test_refresh_turns_a_reused_patch_into_a_stored_one_and_end_releases_the_blocks():
    with kvmesh.EmbeddedCluster(config()) as c:
        s = c.frame_stream(stream_id=8, width=W, height=H, patch=PATCH)
        bg = background(4)
        run_frame(s, bg, 0)
        s.match(bg)
        s.get_reused(bytearray(PATCHES * BLOCK))
        s.refresh(5)
        s.commit(bg, blocks_of(1))
        assert s.stats["blocks_put"] == PATCHES + 1
        keys = s.history(5)
        assert keys[0] != keys[1]
        out = bytearray(PATCHES * BLOCK)
        s.match(bg)
        m = s.get_reused(out)
        assert m[5]["source_frame"] == 1 and out[5 * BLOCK] == 1
        s.commit(bg, blocks_of(2))
        s.end()
        assert s.stats["released"] == PATCHES + 1  # every block it stored, handed to Release


def test_context_tags_reuse_a_block_only_under_the_tag_it_was_committed_with():
    with kvmesh.EmbeddedCluster(config()) as c:
        s = c.frame_stream(stream_id=10, width=W, height=H, patch=PATCH)
        bg = background(6)
        tag_a = np.full(PATCHES, 0xA, dtype=np.uint64)
        # Wrong-sized tags are refused by match and by commit.
        with pytest.raises(kvmesh.InvalidArgumentError, match="tags"):
            s.match(bg, tags=tag_a[:-1])
        m = s.match(bg, tags=tag_a)
        assert not any(p["reused"] for p in m)
        with pytest.raises(kvmesh.InvalidArgumentError, match="tags"):
            s.commit(bg, blocks_of(0), tags=[1, 2])
        with pytest.raises(kvmesh.InvalidArgumentError, match="tags"):
            s.match(bg, tags=[-1] * PATCHES)
        s.match(bg, tags=tag_a)
        s.commit(bg, blocks_of(0), tags=tag_a)  # every patch computed, stored under tag A
        # Tag B on the first half of the patches (a sequence of ints), A on the rest:
        # the same pixels reuse only where the tag is still A.
        half = PATCHES // 2
        tag_ba = [0xB] * half + [0xA] * (PATCHES - half)
        m = s.match(bg, tags=tag_ba)
        assert [p["reused"] for p in m] == [False] * half + [True] * (PATCHES - half)
        out = bytearray(PATCHES * BLOCK)
        m = s.get_reused(out)
        assert out[half * BLOCK:] == blocks_of(0)[half * BLOCK:]  # tag A's blocks, by reference
        s.commit(bg, blocks_of(1), tags=tag_ba)
        # Matched with tag A again: frame 0's blocks everywhere (frame 1's tag-B blocks do not pass).
        m = s.match(bg, tags=tag_a)
        assert all(p["reused"] and p["source_frame"] == 0 for p in m)
        s.commit(bg, blocks_of(2), tags=tag_a)
        # No tags: the pixel gate alone reuses every patch, whatever tag its block has.
        m = s.match(bg)
        assert all(p["reused"] for p in m)
        s.commit(bg, blocks_of(3))
        assert s.stats["blocks_put"] == PATCHES + half
        s.end()


def test_a_stream_outliving_its_client_is_harmless():
    c = kvmesh.EmbeddedCluster(config())
    s = c.frame_stream(stream_id=9, width=W, height=H, patch=PATCH)
    run_frame(s, background(5), 0)
    c.close()
    with pytest.raises(kvmesh.FailedPreconditionError):
        run_frame(s, background(5), 1)
    del s
