/*
 * Compression codecs: lz4 and zstd, with an optional byte shuffle.
 *
 * An object's codec byte travels with it (PUT item, GET reply, Redis record,
 * objstore entry) and says how its stored bytes turn back into the raw
 * tensor: the low bits are the codec id, ECS_CODEC_SHUFFLE says that the
 * bytes were byte-shuffled (see below) before compression.  Both are wire
 * values: stable, never renumbered.  Objects are stored as sent, compressed
 * or not (docs/codec.md says why); the reader that asked for an object
 * decompresses it.
 *
 * Byte shuffle (as Blosc does): for element size E, byte 0 of every element
 * goes first, then byte 1 of every element, and so on; a tail of n % E bytes
 * stays at the end as is.  Floats of the same magnitude share their sign and
 * exponent bytes, so after the shuffle those bytes sit together and compress,
 * while the noisy low mantissa bytes no longer break them up.  The dtype
 * decides E: 2 for f16 and bf16, 4 for f32 and i32; no shuffle for the
 * others.  The map from dtype to E is part of the wire format.
 *
 * Request codecs (what a caller asks for) may also carry ECS_CODEC_AUTO:
 * compress only when a sample says it pays (ecs_codec_choose), else store
 * raw.  ECS_CODEC_AUTO never appears on the wire.
 *
 * Errors: 0 or a negative ECS_E* code.  Bad compressed input, a codec byte
 * that is not a wire value, or a raw length other than the stored one gives
 * ECS_ECODEC, never a write outside dst.
 *
 * Thread safety: every function is thread-safe.  Each thread keeps its own
 * zstd contexts and a scratch buffer for the shuffle (created on first use,
 * freed when the thread exits or calls ecs_codec_thread_release()); the
 * scratch grows to the largest shuffled object a thread has handled, up to
 * ECS_CODEC_SCRATCH_KEEP, above which it is freed after each call.
 */
#ifndef ECS_CODEC_H
#define ECS_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "ecstore/error.h"
#include "ecstore/tensor.h"

/* Codec ids: wire values (store/core/proto.h defines ECS_CODEC_NONE the same). */
#define ECS_CODEC_NONE 0
#define ECS_CODEC_LZ4 1
#define ECS_CODEC_ZSTD 2
#define ECS_CODEC_ID_MASK 0x0f
/* Wire flag: the raw bytes were byte-shuffled before compression. */
#define ECS_CODEC_SHUFFLE 0x80
/* Request flag, never on the wire: compress only when it pays. */
#define ECS_CODEC_AUTO 0x40

/* What "auto" compresses with when a sample says compression pays. */
#define ECS_CODEC_AUTO_DEFAULT ECS_CODEC_ZSTD
/* Auto stores raw when compression would not make the bytes at least this
 * many times smaller (raw / compressed). */
#define ECS_CODEC_AUTO_MIN_RATIO 1.1
/* Bytes that ecs_codec_choose() compresses to decide: all of a smaller
 * input, else ECS_CODEC_SAMPLE_PARTS slices spread evenly over it. */
#define ECS_CODEC_SAMPLE_BYTES (64 * 1024)
#define ECS_CODEC_SAMPLE_PARTS 4
/* zstd level when the caller passes 0 (docs/codec.md has the measurements). */
#define ECS_CODEC_ZSTD_DEFAULT_LEVEL 1
/* A thread keeps a shuffle scratch buffer up to this size between calls. */
#define ECS_CODEC_SCRATCH_KEEP (64u << 20)

/* Parses "none", "lz4", "zstd", "auto" (auto with ECS_CODEC_AUTO_DEFAULT),
 * "auto:lz4" or "auto:zstd" into a request codec.  ECS_OK or ECS_EINVAL. */
int ecs_codec_parse(const char *name, int *out);

/* Names a request or wire codec: "none", "lz4", "zstd+shuffle",
 * "auto:zstd", ... or "invalid".  A static string. */
const char *ecs_codec_name(int codec);

/* 1 when codec is a value that may appear on the wire, else 0. */
int ecs_codec_valid(int codec);

/* The shuffle element size for a dtype: 2, 4, or 0 (not shuffled). */
size_t ecs_codec_shuffle_elem(int dtype);

/* Worst-case compressed size of n raw bytes under a request codec: the room
 * dst needs so that ecs_codec_compress() cannot fail for lack of it.  0 for
 * an invalid codec or an n the codec cannot take (lz4: over ~2 GiB); note
 * that none with n == 0 is also, correctly, 0. */
size_t ecs_codec_bound(int codec, size_t n);

/* 1 when a compressed wire frame's sizes are ones a compressor could have
 * produced: codec a valid compressed wire codec (lz4 or zstd, with or
 * without the shuffle flag), nbytes in 1..ecs_codec_bound(raw_nbytes).
 * Both readers of a holder's GET reply (a client's get, a server's PULL)
 * check it before any size is used, so the decoder never sees a frame
 * larger than its output could justify. */
int ecs_codec_frame_ok(int codec, uint64_t nbytes, uint64_t raw_nbytes);

/* Compresses n bytes of a tensor of the given dtype into dst.
 *
 * codec is a request codec (none, lz4 or zstd, optionally | ECS_CODEC_AUTO).
 * dtype only decides the shuffle: 16- and 32-bit dtypes are shuffled, and
 * ECS_DTYPE_U8 compresses the same bytes unshuffled.  level is the zstd
 * level (0: ECS_CODEC_ZSTD_DEFAULT_LEVEL; clamped to zstd's range); lz4
 * ignores it.
 *
 * On ECS_OK, *out_len bytes of dst hold the stored form and *codec_used its
 * wire codec byte.  When that is ECS_CODEC_NONE (codec none, or auto found
 * no gain), dst holds a copy of src; callers that want to avoid the copy ask
 * ecs_codec_choose() first and send src themselves.
 *
 * Returns ECS_OK; ECS_EINVAL (bad codec, NULL pointer with n > 0);
 * ECS_EBUFSMALL (the output did not fit dst_cap: give it
 * ecs_codec_bound()); ECS_EOVERFLOW (n too large for lz4); ECS_ENOMEM;
 * ECS_ECODEC (the library failed). */
int ecs_codec_compress(int codec, int dtype, const void *src, size_t n, void *dst, size_t dst_cap,
                       size_t *out_len, uint8_t *codec_used, int level);

/* Decompresses n stored bytes with wire codec codec_used into exactly raw_len
 * bytes at dst.  src and dst must not overlap (except src == dst for none).
 * Returns ECS_OK, ECS_EINVAL (NULL pointer with a nonzero length),
 * ECS_ENOMEM, or ECS_ECODEC: an invalid codec byte, a shuffle flag on a
 * dtype that is not shuffled, corrupt input, or a raw length other than
 * raw_len.  On error dst's contents are unspecified, but nothing outside
 * dst[0, raw_len) is written. */
int ecs_codec_decompress(uint8_t codec_used, int dtype, const void *src, size_t n, void *dst, size_t raw_len);

/* Auto mode's decision: compresses a sample of src (ECS_CODEC_SAMPLE_BYTES
 * at most, shuffled as compress would) with the base codec of `codec` and
 * returns that base id when the sample shrinks by ECS_CODEC_AUTO_MIN_RATIO
 * or more, else ECS_CODEC_NONE.  Codec none gives none.  Returns a codec id
 * (>= 0) or ECS_EINVAL / ECS_ENOMEM. */
int ecs_codec_choose(int codec, int dtype, const void *src, size_t n, int level);

/* Byte shuffle of n bytes with element size elem (any elem >= 1; 1 copies),
 * and its inverse.  src and dst must not overlap. */
void ecs_codec_shuffle(void *dst, const void *src, size_t n, size_t elem);
void ecs_codec_unshuffle(void *dst, const void *src, size_t n, size_t elem);

/* Frees this thread's codec contexts and scratch now (they come back on next
 * use).  Threads that exit free them anyway. */
void ecs_codec_thread_release(void);

#endif /* ECS_CODEC_H */
