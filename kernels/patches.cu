// gpufeed: resized u8 HWC images of different sizes -> one patch-sequence token tensor, f16 /
// bf16 / f32, packed or padded, in the model's token order (src/patches/layout.rs).
//
// Compiled at run time by NVRTC (no headers: halves are written as raw 16-bit patterns).
//
// Value d of token k reads sample (channel c, row y, column x) of patch (pr, pc):
//   Qwen2-VL (merge > 0): tokens in merge x merge blocks, values (c, t, y, x);
//   SigLIP2 / timm (merge == 0): tokens row by row, values (y, x, c).
// A value depends on its sample byte and channel alone: `values[c * 256 + s]`, the 768 values of
// (channel, byte) computed on the host with the reference's float arithmetic
// (src/patches/normalize.rs NormalizeConstants::table). Rows past an image's tokens (padding) get
// pad[c].
//
// Each block first copies that table into shared memory and computes where value d of a token
// lies within its patch (channel, and byte offset from the patch's first sample); then each
// output element is a gather, a table read and a store. Where tokens are a multiple of four
// values long (every preset's) a thread makes four neighbouring values and stores them together
// (8 bytes, or 16 for float32); where a token repeats its patch over temporal copies (Qwen2-VL:
// values (c, t, y, x), the same for every t) it makes each four once and stores them in every
// copy. Otherwise two values a thread (tokens of an even length), or one. Grid (runs of
// GF_PATCH_RUN tokens, images): block (r, i) writes rows r * GF_PATCH_RUN .. of image i, its
// threads on consecutive elements.

struct GfPatchImage {
    unsigned long long offset;     // first byte of the image in the input
    unsigned long long first_row;  // first output row
    unsigned int width;            // pixels per image row
    unsigned int tokens;           // grid_h * grid_w
    unsigned int rows;             // output rows owned: tokens, or the padded length
    unsigned int grid_w;           // patches across
};

struct GfPatchPad {
    float pad[3];
};

#define GF_F32 0
#define GF_F16 1
#define GF_BF16 2

// GF_PATCH_RUN, the tokens a block writes, is defined by src/cuda/patches.rs, which sizes the
// grid with it.
// Values of a token whose places a block keeps in shared memory; longer tokens (patches of more
// than 6,144 values) compute each place as they go.
#define GF_PATCH_MAX_DIM 6144

// One value as the output stores it: a float32's bits, or a half's / bfloat16's in the low 16.
template <int KIND>
__device__ __forceinline__ unsigned int gf_patch_bits(float v) {
    if (KIND == GF_F32) return __float_as_uint(v);
    if (KIND == GF_F16) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
    // Round to nearest even; the values are finite.
    unsigned int u = __float_as_uint(v);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return u >> 16;
}

// Values i and i + 1 (i even) stored together: one 8-byte store of two float32s, or one
// 4-byte store of two 16-bit values.
template <int KIND>
__device__ __forceinline__ void gf_patch_store_pair(void* out, size_t i, float v0, float v1) {
    const unsigned int b0 = gf_patch_bits<KIND>(v0), b1 = gf_patch_bits<KIND>(v1);
    if (KIND == GF_F32) {
        uint2 pair;
        pair.x = b0;
        pair.y = b1;
        static_cast<uint2*>(out)[i / 2] = pair;
    } else {
        static_cast<unsigned int*>(out)[i / 2] = b0 | (b1 << 16);
    }
}

// Values i .. i + 3 (i a multiple of four, the output 16-byte aligned) stored together: one
// 16-byte store of four float32s, or one 8-byte store of four 16-bit values.
template <int KIND>
__device__ __forceinline__ void gf_patch_store_four(void* out, size_t i, float v0, float v1,
                                                    float v2, float v3) {
    const unsigned int b0 = gf_patch_bits<KIND>(v0), b1 = gf_patch_bits<KIND>(v1);
    const unsigned int b2 = gf_patch_bits<KIND>(v2), b3 = gf_patch_bits<KIND>(v3);
    if (KIND == GF_F32) {
        uint4 four;
        four.x = b0;
        four.y = b1;
        four.z = b2;
        four.w = b3;
        static_cast<uint4*>(out)[i / 4] = four;
    } else {
        uint2 four;
        four.x = b0 | (b1 << 16);
        four.y = b2 | (b3 << 16);
        static_cast<uint2*>(out)[i / 4] = four;
    }
}

template <int KIND>
__device__ __forceinline__ void gf_patch_store(void* out, size_t i, float v) {
    const unsigned int b = gf_patch_bits<KIND>(v);
    if (KIND == GF_F32) {
        static_cast<unsigned int*>(out)[i] = b;
    } else {
        static_cast<unsigned short*>(out)[i] = (unsigned short)b;
    }
}

// Where value d of a token lies within its patch: its channel in the top two bits, below them
// the byte offset of its sample from the patch's first sample in an image `width` pixels wide.
__device__ __forceinline__ unsigned int gf_patch_place(unsigned int d, unsigned int patch,
                                                       unsigned int merge, unsigned int temporal,
                                                       unsigned int width) {
    const unsigned int area = patch * patch;
    unsigned int c, y, x;
    if (merge > 0) {
        c = d / (temporal * area);
        const unsigned int within = d % area;
        y = within / patch;
        x = within - y * patch;
    } else {
        const unsigned int pixel = d / 3;
        c = d - pixel * 3;
        y = pixel / patch;
        x = pixel - y * patch;
    }
    return (c << 30) | ((y * width + x) * 3 + c);
}

// The byte offset of token k's first sample from the image's first: its patch's top-left.
__device__ __forceinline__ size_t gf_patch_corner(unsigned int k, unsigned int patch,
                                                  unsigned int merge, unsigned int grid_w,
                                                  unsigned int width) {
    unsigned int pr, pc;
    if (merge > 0) {
        const unsigned int per_block = merge * merge;
        const unsigned int block = k / per_block, in_block = k - block * per_block;
        const unsigned int blocks_wide = grid_w / merge;
        const unsigned int bh = block / blocks_wide, bw = block - bh * blocks_wide;
        pr = bh * merge + in_block / merge;
        pc = bw * merge + in_block % merge;
    } else {
        pr = k / grid_w;
        pc = k - pr * grid_w;
    }
    return ((size_t)pr * patch * width + (size_t)pc * patch) * 3;
}

template <int KIND>
__device__ __forceinline__ void gf_patches(const unsigned char* __restrict__ in,
                                           const GfPatchImage* __restrict__ images,
                                           void* __restrict__ out, unsigned int patch,
                                           unsigned int merge, unsigned int temporal,
                                           unsigned int dim,
                                           const float* __restrict__ values, GfPatchPad p) {
    __shared__ float s_value[3 * 256];
    __shared__ unsigned int s_place[GF_PATCH_MAX_DIM];
    __shared__ unsigned long long s_corner[GF_PATCH_RUN];
    const GfPatchImage im = images[blockIdx.y];
    const unsigned int k0 = blockIdx.x * GF_PATCH_RUN;
    if (k0 >= im.rows) return;
    const unsigned int run = min(im.rows - k0, (unsigned int)GF_PATCH_RUN);
    const bool placed = dim <= GF_PATCH_MAX_DIM;
    for (unsigned int e = threadIdx.x; e < 3 * 256; e += blockDim.x) s_value[e] = values[e];
    if (placed) {
        for (unsigned int d = threadIdx.x; d < dim; d += blockDim.x)
            s_place[d] = gf_patch_place(d, patch, merge, temporal, im.width);
    }
    for (unsigned int t = threadIdx.x; t < run; t += blockDim.x)
        s_corner[t] = gf_patch_corner(k0 + t, patch, merge, im.grid_w, im.width);
    __syncthreads();
    const unsigned char* pixels = in + im.offset;
    const size_t first = (size_t)(im.first_row + k0) * dim;
    const unsigned int elements = run * dim;
    // A value of token t at place d of its patch.
    auto value = [&](unsigned int t, unsigned int d) -> float {
        const unsigned int place =
            placed ? s_place[d] : gf_patch_place(d, patch, merge, temporal, im.width);
        const unsigned int c = place >> 30;
        if (k0 + t >= im.tokens) return p.pad[c];
        const unsigned int s = pixels[s_corner[t] + (place & 0x3FFFFFFFu)];
        return s_value[(c << 8) | s];
    };
    if ((dim & 3u) == 0 && (reinterpret_cast<size_t>(out) & 15u) == 0) {
        // Four values a thread. With temporal copies of a patch (merge > 0: values (c, t, y, x),
        // each channel's `temporal * area` values holding its `area` samples once a copy), a
        // thread makes four of one copy and stores them in each: `unique` values a token to
        // make, value u of which is value `(u / area) * temporal * area + u % area` of the token.
        const unsigned int area = patch * patch;
        const unsigned int copies =
            (merge > 0 && temporal > 1 && (area & 3u) == 0 && dim == 3 * temporal * area)
                ? temporal
                : 1;
        const unsigned int unique = dim / copies;
        const unsigned int fours = unique / 4;
        for (unsigned int e = threadIdx.x; e < run * fours; e += blockDim.x) {
            const unsigned int t = e / fours;
            const unsigned int u = 4 * (e - t * fours);
            const unsigned int d = copies > 1 ? (u / area) * dim / 3 + u % area : u;
            const float v0 = value(t, d), v1 = value(t, d + 1), v2 = value(t, d + 2),
                        v3 = value(t, d + 3);
            const size_t at = first + (size_t)t * dim + d;
            for (unsigned int c = 0; c < copies; c++)
                gf_patch_store_four<KIND>(out, at + (size_t)c * area, v0, v1, v2, v3);
        }
        return;
    }
    if ((dim & 1u) == 0) {
        // Tokens of an even length (every preset's): two values a thread, stored together
        // (the first value's index is even, so the pair is aligned).
        const unsigned int half = dim / 2;
        for (unsigned int e = threadIdx.x; e < elements / 2; e += blockDim.x) {
            const unsigned int t = e / half;
            const unsigned int d = 2 * (e - t * half);
            gf_patch_store_pair<KIND>(out, first + (size_t)t * dim + d, value(t, d),
                                      value(t, d + 1));
        }
        return;
    }
    for (unsigned int e = threadIdx.x; e < elements; e += blockDim.x) {
        const unsigned int t = e / dim;
        gf_patch_store<KIND>(out, first + e, value(t, e - t * dim));
    }
}

#define GF_PATCH_ENTRY(NAME, KIND)                                                            \
    extern "C" __global__ void gpufeed_patches_##NAME(                                        \
        const unsigned char* __restrict__ in, const GfPatchImage* __restrict__ images,        \
        void* __restrict__ out, unsigned int patch, unsigned int merge, unsigned int temporal, \
        unsigned int dim, const float* __restrict__ values, GfPatchPad p) {                   \
        gf_patches<KIND>(in, images, out, patch, merge, temporal, dim, values, p);            \
    }

GF_PATCH_ENTRY(f32, GF_F32)
GF_PATCH_ENTRY(f16, GF_F16)
GF_PATCH_ENTRY(bf16, GF_BF16)
