// gpufeed: libjpeg-turbo's decode after entropy decoding, on the GPU, bit for bit: the packed
// coefficients of a batch of images (src/coefficients/pack.rs) are expanded, dequantized and
// inverse-transformed with libjpeg-turbo's integer "islow" IDCT (jidctint.c) into component
// planes, which are then upsampled (jdsample.c, Pillow's and TurboJPEG's defaults: fancy
// upsampling, no merged upsampler) and colour-converted (jdcolor.c) into the rendered window.
//
// Every function mirrors its CPU rendition in src/coefficients/reference.rs line by line, with the
// C's integer types: JLONG is `long long` (64-bit, as on LP64 Linux), the IDCT workspace `int`,
// the multiplier table `short` (ISLOW_MULT_TYPE of a SIMD build). Where the JLONG values provably
// fit an `int`, they are computed in one, which gives the same numbers: an IDCT pass whose
// inputs are within GF_IDCT_INT_INPUT, and the colour conversion (gf_ycc_rgb). Integers only.
//
// Compiled at run time by NVRTC (no headers: nothing is included). Also compiled as C++ on the
// host with a few macros standing in for CUDA's (src/coefficients/host_check.rs), which runs both
// kernels' threads one after another against the CPU rendition: the kernels use no shared memory,
// no synchronisation and no warp functions, so that sequential run is exactly the GPU's result.
//
// Launches (src/coefficients/batch.rs):
//   gpufeed_idct_islow     grid (x: enough blocks for the largest job, y: job), one thread per
//                          8x8 block, a grid-stride loop over the job's blocks; packed
//                          coefficients, or dense ones (GF_DENSE) the entropy kernels wrote.
//   gpufeed_upsample_color grid (x: one block per window row, y: image), one thread per pair
//                          of output pixels, grid-stride loops over the window's rows and a
//                          row's pairs.

// One component of one image (src/coefficients/batch.rs IdctJob): its packed section in the
// coefficient buffer, its plane in the plane buffer.
struct GfIdctJob {
    unsigned long long section; // byte offset of the section (multiplier table first)
    unsigned long long plane;   // byte offset of the plane (blocks_wide * 8 bytes a row)
    unsigned int blocks;        // blocks in the window's rectangle
    unsigned int blocks_wide;   // the rectangle's width in blocks
    unsigned int dc;            // offsets from the section: i16 DC per block
    unsigned int masks;         // u64 mask per block (bit 0: AC values are i16)
    unsigned int groups;        // u32 offset of each group of 32 blocks' AC values
    unsigned int ac;            // the AC values, 1 or 2 bytes each
};

// One component plane as the upsampler reads it (src/coefficients/batch.rs PlaneRef).
struct GfPlane {
    unsigned long long offset; // byte offset of the plane in the plane buffer
    unsigned int pitch;        // bytes a row
    unsigned int x0;           // component sample coordinates of the plane's first sample
    unsigned int y0;
    unsigned int last_i;       // the component's last real sample column (downsampled_width - 1)
    unsigned int last_j;       // its last real sample row (downsampled_height - 1)
    unsigned int method;       // GF_UP_*
    unsigned int h;            // GF_UP_BOX: replication factors
    unsigned int v;
};

// One image's window (src/coefficients/batch.rs ColorJob).
struct GfColorJob {
    GfPlane comp[3];
    unsigned long long out;   // byte offset of the window's first pixel in the output buffer
    unsigned int out_pitch;   // bytes a row
    unsigned int x;           // the window in image pixels
    unsigned int y;
    unsigned int width;
    unsigned int height;
    unsigned int conversion;  // GF_CC_*
    unsigned int unused[2];
};

static_assert(sizeof(GfIdctJob) == 40, "GfIdctJob is batch.rs IdctJob");
static_assert(sizeof(GfPlane) == 40, "GfPlane is batch.rs PlaneRef");
static_assert(sizeof(GfColorJob) == 160, "GfColorJob is batch.rs ColorJob");

#define GF_UP_FULL 0
#define GF_UP_FANCY_H2V1 1
#define GF_UP_FANCY_H1V2 2
#define GF_UP_FANCY_H2V2 3
#define GF_UP_BOX 4

#define GF_CC_GRAY 0
#define GF_CC_YCBCR 1
#define GF_CC_RGB 2

// GfIdctJob.dc of a component whose coefficients are dense (decoded on the GPU) instead of
// packed: then masks | groups << 32 is the i16 offset of the rectangle's first block in the dense
// buffer and ac the blocks a row there; the section holds only the multiplier table.
#define GF_DENSE 0xFFFFFFFFu

#define GF_GROUP 32
#define GF_WIDE 1ULL

// ---- jidctint.c ----

#define GF_CONST_BITS 13
#define GF_PASS1_BITS 2

#define GF_FIX_0_298631336 ((long long)2446)
#define GF_FIX_0_390180644 ((long long)3196)
#define GF_FIX_0_541196100 ((long long)4433)
#define GF_FIX_0_765366865 ((long long)6270)
#define GF_FIX_0_899976223 ((long long)7373)
#define GF_FIX_1_175875602 ((long long)9633)
#define GF_FIX_1_501321110 ((long long)12299)
#define GF_FIX_1_847759065 ((long long)15137)
#define GF_FIX_1_961570560 ((long long)16069)
#define GF_FIX_2_053119869 ((long long)16819)
#define GF_FIX_2_562915447 ((long long)20995)
#define GF_FIX_3_072711026 ((long long)25172)

// DESCALE(x, n): RIGHT_SHIFT(x + (ONE << (n - 1)), n), an arithmetic shift of a JLONG.
__device__ __forceinline__ long long gf_descale(long long x, int n) {
    return (x + (1LL << (n - 1))) >> n;
}

// LEFT_SHIFT(a, b): (JLONG)((unsigned long)(a) << (b)).
__device__ __forceinline__ long long gf_left_shift(long long a, int b) {
    return (long long)((unsigned long long)a << b);
}

// The same in int, for the 1-D IDCT in int (gf_idct_pass_fits_int: the value fits).
__device__ __forceinline__ int gf_left_shift(int a, int b) {
    return (int)((unsigned int)a << b);
}

// DESCALE in int, where the sum fits (gf_idct_pass_fits_int).
__device__ __forceinline__ int gf_descale(int x, int n) {
    return (x + (1 << (n - 1))) >> n;
}

// The largest input magnitude for which a 1-D IDCT pass (gf_islow_1d) computed in int gives
// the JLONG result: every intermediate and output is a sum of the inputs times constants whose
// magnitudes add up to at most 178,219 (output 1: tmp11 and the odd part's tmp2), so with
// inputs within 12,000 every value stays within 2,138,628,000 and, with a descale's rounding
// term (at most 2^17), below 2^31. Real images stay far inside it (a dequantized coefficient of
// 8-bit samples is within about 2,100, pass 1's outputs within about 8,200); the rest take the
// JLONG pass.
#define GF_IDCT_INT_INPUT 12000

__device__ __forceinline__ bool gf_idct_pass_fits_int(const int v[8]) {
    bool fits = true;
    for (int k = 0; k < 8; k++) fits = fits && v[k] >= -GF_IDCT_INT_INPUT && v[k] <= GF_IDCT_INT_INPUT;
    return fits;
}

// DEQUANTIZE(coef, quantval): an int product of two shorts.
__device__ __forceinline__ int gf_dequantize(short coef, short quantval) {
    return (int)coef * (int)quantval;
}

// IDCT_range_limit(cinfo)[x & RANGE_MASK]: libjpeg's post-IDCT table (jdmaster.c
// prepare_range_limit_table), entries 0..128 -> 128..256, 128..512 -> 255, 512..896 -> 0,
// 896..1024 -> 0..128 (reference.rs idct_range_limit).
__device__ __forceinline__ unsigned char gf_idct_range_limit(int x) {
    int index = x & 1023;
    if (index < 128) return (unsigned char)(index + 128);
    if (index < 512) return 255;
    if (index < 896) return 0;
    return (unsigned char)(index - 896);
}

// The 1-D inverse DCT both passes of jpeg_idct_islow run on eight values `v` (the LL&M
// butterflies, figure 8 of the paper for the odd part): the eight outputs, in order, before their
// pass's descale (reference.rs islow_1d).
template <typename T>
__device__ __forceinline__ void gf_islow_1d(const T v[8], T out[8]) {
    // Even part: reverse the even part of the forward DCT.
    T z1 = (v[2] + v[6]) * (T)GF_FIX_0_541196100;
    T tmp2 = z1 + v[6] * -(T)GF_FIX_1_847759065;
    T tmp3 = z1 + v[2] * (T)GF_FIX_0_765366865;
    T tmp0 = gf_left_shift(v[0] + v[4], GF_CONST_BITS);
    T tmp1 = gf_left_shift(v[0] - v[4], GF_CONST_BITS);
    const T tmp10 = tmp0 + tmp3;
    const T tmp13 = tmp0 - tmp3;
    const T tmp11 = tmp1 + tmp2;
    const T tmp12 = tmp1 - tmp2;

    // Odd part: y7, y5, y3, y1.
    tmp0 = v[7];
    tmp1 = v[5];
    tmp2 = v[3];
    tmp3 = v[1];
    z1 = tmp0 + tmp3;
    T z2 = tmp1 + tmp2;
    T z3 = tmp0 + tmp2;
    T z4 = tmp1 + tmp3;
    const T z5 = (z3 + z4) * (T)GF_FIX_1_175875602;
    z1 = z1 * -(T)GF_FIX_0_899976223;
    z2 = z2 * -(T)GF_FIX_2_562915447;
    z3 = z3 * -(T)GF_FIX_1_961570560 + z5;
    z4 = z4 * -(T)GF_FIX_0_390180644 + z5;
    tmp0 = tmp0 * (T)GF_FIX_0_298631336 + z1 + z3;
    tmp1 = tmp1 * (T)GF_FIX_2_053119869 + z2 + z4;
    tmp2 = tmp2 * (T)GF_FIX_3_072711026 + z2 + z3;
    tmp3 = tmp3 * (T)GF_FIX_1_501321110 + z1 + z4;

    out[0] = tmp10 + tmp3;
    out[1] = tmp11 + tmp2;
    out[2] = tmp12 + tmp1;
    out[3] = tmp13 + tmp0;
    out[4] = tmp13 - tmp0;
    out[5] = tmp12 - tmp1;
    out[6] = tmp11 - tmp2;
    out[7] = tmp10 - tmp3;
}

// A row's eight samples stored as one 8-byte word where `out` is 8-byte aligned (a plane's rows
// are: planes start 256-byte aligned and their pitch is whole blocks), else byte by byte.
__device__ __forceinline__ void gf_store8(unsigned char* out, const unsigned char samples[8]) {
    if (((unsigned long long)out & 7) != 0) {
        for (int c = 0; c < 8; c++) out[c] = samples[c];
        return;
    }
    unsigned long long word = 0;
    for (int c = 0; c < 8; c++) word |= (unsigned long long)samples[c] << (8 * c);
#ifdef GF_HOST
    memcpy(out, &word, 8);
#else
    *(unsigned long long*)out = word;
#endif
}

// jpeg_idct_islow on one block: `coef` natural order, `quant` the multiplier table, 8 rows of 8
// samples written `stride` bytes apart from `out` (reference.rs idct_islow).
__device__ void gf_idct_islow(const short* coef, const short* quant, unsigned char* out,
                              unsigned int stride) {
    int workspace[64];
    long long v[8];
    long long result[8];

    // Pass 1: process columns from input, store into work array.
    for (int col = 0; col < 8; col++) {
        const short* inptr = coef + col;
        const short* quantptr = quant + col;
        int* wsptr = workspace + col;
        if (inptr[8 * 1] == 0 && inptr[8 * 2] == 0 && inptr[8 * 3] == 0 && inptr[8 * 4] == 0 &&
            inptr[8 * 5] == 0 && inptr[8 * 6] == 0 && inptr[8 * 7] == 0) {
            // AC terms all zero
            int dcval = (int)gf_left_shift(
                (long long)gf_dequantize(inptr[8 * 0], quantptr[8 * 0]), GF_PASS1_BITS);
            for (int row = 0; row < 8; row++) wsptr[8 * row] = dcval;
            continue;
        }
        int in[8];
        for (int row = 0; row < 8; row++) in[row] = gf_dequantize(inptr[8 * row], quantptr[8 * row]);
        if (gf_idct_pass_fits_int(in)) {
            int out[8];
            gf_islow_1d(in, out);
            for (int row = 0; row < 8; row++)
                wsptr[8 * row] = gf_descale(out[row], GF_CONST_BITS - GF_PASS1_BITS);
            continue;
        }
        for (int row = 0; row < 8; row++) v[row] = in[row];
        gf_islow_1d(v, result);
        for (int row = 0; row < 8; row++)
            wsptr[8 * row] = (int)gf_descale(result[row], GF_CONST_BITS - GF_PASS1_BITS);
    }

    // Pass 2: process rows from work array, store into output array.
    for (int row = 0; row < 8; row++) {
        const int* wsptr = workspace + 8 * row;
        unsigned char* outptr = out + row * stride;
        if (wsptr[1] == 0 && wsptr[2] == 0 && wsptr[3] == 0 && wsptr[4] == 0 && wsptr[5] == 0 &&
            wsptr[6] == 0 && wsptr[7] == 0) {
            // AC terms all zero (the NO_ZERO_ROW_TEST shortcut)
            unsigned char dcval =
                gf_idct_range_limit((int)gf_descale((long long)wsptr[0], GF_PASS1_BITS + 3));
            unsigned char samples[8];
            for (int col = 0; col < 8; col++) samples[col] = dcval;
            gf_store8(outptr, samples);
            continue;
        }
        unsigned char samples[8];
        if (gf_idct_pass_fits_int(wsptr)) {
            int out[8];
            gf_islow_1d(wsptr, out);
            for (int col = 0; col < 8; col++)
                samples[col] =
                    gf_idct_range_limit(gf_descale(out[col], GF_CONST_BITS + GF_PASS1_BITS + 3));
            gf_store8(outptr, samples);
            continue;
        }
        for (int col = 0; col < 8; col++) v[col] = (long long)wsptr[col];
        gf_islow_1d(v, result);
        for (int col = 0; col < 8; col++)
            samples[col] = gf_idct_range_limit(
                (int)gf_descale(result[col], GF_CONST_BITS + GF_PASS1_BITS + 3));
        gf_store8(outptr, samples);
    }
}

// ---- the transfer format (pack.rs) ----

// Bytes of a block's AC values: one per nonzero AC coefficient, two when the block is wide.
__device__ __forceinline__ unsigned int gf_ac_bytes(unsigned long long mask) {
    return (unsigned int)__popcll(mask & ~GF_WIDE) << (unsigned int)(mask & GF_WIDE);
}

// Block `b` of a packed component expanded into `coef` (natural order), as pack.rs Unpacked does.
__device__ void gf_expand(const unsigned char* section, const GfIdctJob& job, unsigned int b,
                          short* coef) {
    const short* dc = (const short*)(section + job.dc);
    const unsigned long long* masks = (const unsigned long long*)(section + job.masks);
    const unsigned int* groups = (const unsigned int*)(section + job.groups);
    const unsigned char* ac = section + job.ac;
    unsigned long long mask = masks[b];
    // The group's offset, plus the blocks before this one in the group.
    unsigned int at = groups[b / GF_GROUP];
    for (unsigned int j = b - b % GF_GROUP; j < b; j++) at += gf_ac_bytes(masks[j]);
    coef[0] = dc[b];
    for (int k = 1; k < 64; k++) {
        short v = 0;
        if ((mask >> k) & 1ULL) {
            if (mask & GF_WIDE) {
                // little-endian i16, possibly unaligned
                v = (short)(unsigned short)(ac[at] | ((unsigned int)ac[at + 1] << 8));
                at += 2;
            } else {
                v = (short)(signed char)ac[at];
                at += 1;
            }
        }
        coef[k] = v;
    }
}

// A dense block's 64 coefficients: eight 16-byte loads where the block is 16-byte aligned (the
// entropy kernels' planes are), else one at a time. A warp's threads read 32 blocks 128 bytes
// apart, so each load instruction touches 32 cache lines: eight of them instead of 64.
__device__ __forceinline__ void gf_load_block(const short* src, short* coef) {
    if (((unsigned long long)src & 15) != 0) {
        for (int i = 0; i < 64; i++) coef[i] = src[i];
        return;
    }
    for (int q = 0; q < 8; q++) {
        uint4 w;
#ifdef GF_HOST
        memcpy(&w, src + 8 * q, 16);
#else
        w = ((const uint4*)src)[q];
#endif
        const unsigned int words[4] = {w.x, w.y, w.z, w.w};
        for (int k = 0; k < 4; k++) {
            coef[8 * q + 2 * k] = (short)(words[k] & 0xFFFF);
            coef[8 * q + 2 * k + 1] = (short)(words[k] >> 16);
        }
    }
}

extern "C" __global__ void gpufeed_idct_islow(const unsigned char* coefficients,
                                              const short* dense, unsigned char* planes,
                                              const GfIdctJob* jobs) {
    const GfIdctJob job = jobs[blockIdx.y];
    const unsigned char* section = coefficients + job.section;
    // The multiplier table opens the section (8-byte aligned).
    const short* quant = (const short*)section;
    const unsigned int pitch = job.blocks_wide * 8;
    for (unsigned int b = blockIdx.x * blockDim.x + threadIdx.x; b < job.blocks;
         b += blockDim.x * gridDim.x) {
        short coef[64];
        unsigned int bx = b % job.blocks_wide;
        unsigned int by = b / job.blocks_wide;
        if (job.dc == GF_DENSE) {
            // Dense coefficients (kernels/entropy.cu): the rectangle's first block at i16 offset
            // masks | groups << 32, `ac` blocks a row.
            const short* src = dense + ((unsigned long long)job.masks |
                                        (unsigned long long)job.groups << 32) +
                               ((unsigned long long)by * job.ac + bx) * 64;
            gf_load_block(src, coef);
        } else {
            gf_expand(section, job, b, coef);
        }
        unsigned char* out = planes + job.plane + (unsigned long long)(by * 8) * pitch + bx * 8;
        gf_idct_islow(coef, quant, out, pitch);
    }
}

// ---- jdsample.c ----

// Sample (i, j) of a component, in component sample coordinates.
__device__ __forceinline__ int gf_at(const unsigned char* planes, const GfPlane& p,
                                     unsigned int i, unsigned int j) {
    return planes[p.offset + (unsigned long long)(j - p.y0) * p.pitch + (i - p.x0)];
}

// libjpeg-turbo's fancy upsamplers' formulas, shared by the one-pixel and the pixel-pair
// renditions below. h2v1_fancy_upsample's outputs 2i and 2i + 1 from input sample i and its
// left or right neighbour (the first and last columns repeat their sample):
__device__ __forceinline__ int gf_h2v1_even(int in, int left, bool first) {
    return first ? in : (in * 3 + left + 1) >> 2;
}
__device__ __forceinline__ int gf_h2v1_odd(int in, int right, bool last) {
    return last ? in : (in * 3 + right + 2) >> 2;
}
// h2v2_fancy_upsample's, from column sums (the nearer row's sample * 3 + the farther row's):
__device__ __forceinline__ int gf_h2v2_even(int colsum, int left, bool first) {
    return first ? (colsum * 4 + 8) >> 4 : (colsum * 3 + left + 8) >> 4;
}
__device__ __forceinline__ int gf_h2v2_odd(int colsum, int right, bool last) {
    return last ? (colsum * 4 + 7) >> 4 : (colsum * 3 + right + 7) >> 4;
}
// The fancy vertical routines' farther input row for output row y (above for the upper output
// row, below for the lower), the edge rows repeated (jdmainct.c context rows).
__device__ __forceinline__ unsigned int gf_far_row(const GfPlane& p, unsigned int y) {
    const unsigned int j = y >> 1;
    if ((y & 1) == 0) return j > 0 ? j - 1 : 0;
    return j + 1 < p.last_j ? j + 1 : p.last_j;
}

// The component's sample at full-resolution pixel (x, y) as its upsampling routine makes it
// (reference.rs upsampled).
__device__ int gf_upsampled(const unsigned char* planes, const GfPlane& p, unsigned int x,
                            unsigned int y) {
    if (p.method == GF_UP_FULL) {
        // fullsize_upsample
        return gf_at(planes, p, x, y);
    }
    if (p.method == GF_UP_BOX) {
        // int_upsample, h2v1_upsample, h2v2_upsample: replication
        return gf_at(planes, p, x / p.h, y / p.v);
    }
    if (p.method == GF_UP_FANCY_H2V1) {
        const unsigned int i = x >> 1;
        const int in = gf_at(planes, p, i, y);
        if ((x & 1) == 0) return gf_h2v1_even(in, i == 0 ? 0 : gf_at(planes, p, i - 1, y), i == 0);
        const bool last = i == p.last_i;
        return gf_h2v1_odd(in, last ? 0 : gf_at(planes, p, i + 1, y), last);
    }
    const unsigned int j = y >> 1, far = gf_far_row(p, y);
    if (p.method == GF_UP_FANCY_H1V2) {
        // h1v2_fancy_upsample: bias 1 above, 2 below
        int thiscolsum = gf_at(planes, p, x, j) * 3 + gf_at(planes, p, x, far);
        return (thiscolsum + ((y & 1) == 0 ? 1 : 2)) >> 2;
    }
    // h2v2_fancy_upsample: column sums, then across
    const unsigned int i = x >> 1;
    const int colsum = gf_at(planes, p, i, j) * 3 + gf_at(planes, p, i, far);
    if ((x & 1) == 0) {
        const int left = i == 0 ? 0 : gf_at(planes, p, i - 1, j) * 3 + gf_at(planes, p, i - 1, far);
        return gf_h2v2_even(colsum, left, i == 0);
    }
    const bool last = i == p.last_i;
    const int right = last ? 0 : gf_at(planes, p, i + 1, j) * 3 + gf_at(planes, p, i + 1, far);
    return gf_h2v2_odd(colsum, right, last);
}

// The samples of pixels x and x + 1 (x even) of row y of a component, as gf_upsampled makes
// them one at a time: an h2 routine makes both from one input sample and its neighbours, read
// once here.
__device__ void gf_upsampled_pair(const unsigned char* planes, const GfPlane& p, unsigned int x,
                                  unsigned int y, int* s) {
    if (p.method == GF_UP_FULL) {
        const unsigned char* row = planes + p.offset + (unsigned long long)(y - p.y0) * p.pitch;
        s[0] = row[x - p.x0];
        s[1] = row[x + 1 - p.x0];
        return;
    }
    const unsigned int i = x >> 1;
    const bool first = i == 0, last = i == p.last_i;
    if (p.method == GF_UP_FANCY_H2V1) {
        const unsigned char* row = planes + p.offset + (unsigned long long)(y - p.y0) * p.pitch;
        const int in = row[i - p.x0];
        s[0] = gf_h2v1_even(in, first ? 0 : row[i - 1 - p.x0], first);
        s[1] = gf_h2v1_odd(in, last ? 0 : row[i + 1 - p.x0], last);
        return;
    }
    if (p.method == GF_UP_FANCY_H2V2) {
        const unsigned char* near_row =
            planes + p.offset + (unsigned long long)((y >> 1) - p.y0) * p.pitch;
        const unsigned char* far_row =
            planes + p.offset + (unsigned long long)(gf_far_row(p, y) - p.y0) * p.pitch;
        const int colsum = near_row[i - p.x0] * 3 + far_row[i - p.x0];
        const int left = first ? 0 : near_row[i - 1 - p.x0] * 3 + far_row[i - 1 - p.x0];
        const int right = last ? 0 : near_row[i + 1 - p.x0] * 3 + far_row[i + 1 - p.x0];
        s[0] = gf_h2v2_even(colsum, left, first);
        s[1] = gf_h2v2_odd(colsum, right, last);
        return;
    }
    s[0] = gf_upsampled(planes, p, x, y);
    s[1] = gf_upsampled(planes, p, x + 1, y);
}

// ---- jdcolor.c ----

#define GF_SCALEBITS 16
#define GF_ONE_HALF (1 << (GF_SCALEBITS - 1))
#define GF_FIX_1_40200 91881
#define GF_FIX_1_77200 116130
#define GF_FIX_0_71414 46802
#define GF_FIX_0_34414 22554

// range_limit of the colour converters: a clamp to 0..255.
__device__ __forceinline__ unsigned char gf_range_limit(int x) {
    return (unsigned char)(x < 0 ? 0 : (x > 255 ? 255 : x));
}

// ycc_rgb_convert of one pixel, with build_ycc_rgb_table's entries computed in place. The C
// computes them in JLONG; in int they are the same numbers: with cb and cr in -128..127 no
// product or sum here passes 2^24 in magnitude.
__device__ __forceinline__ void gf_ycc_rgb(int luma, int cb, int cr, unsigned char* pixel) {
    cb -= 128;
    cr -= 128;
    const int cr_r = (GF_FIX_1_40200 * cr + GF_ONE_HALF) >> GF_SCALEBITS;
    const int cb_b = (GF_FIX_1_77200 * cb + GF_ONE_HALF) >> GF_SCALEBITS;
    const int cr_g = -GF_FIX_0_71414 * cr;
    const int cb_g = -GF_FIX_0_34414 * cb + GF_ONE_HALF;
    pixel[0] = gf_range_limit(luma + cr_r);
    pixel[1] = gf_range_limit(luma + ((cb_g + cr_g) >> GF_SCALEBITS));
    pixel[2] = gf_range_limit(luma + cb_b);
}

// One pixel's three upsampled samples converted (rgb_rgb_convert or ycc_rgb_convert), written
// at `pixel`.
__device__ __forceinline__ void gf_convert(const GfColorJob& job, int a, int b, int c,
                                           unsigned char* pixel) {
    if (job.conversion == GF_CC_RGB) {
        pixel[0] = (unsigned char)a;
        pixel[1] = (unsigned char)b;
        pixel[2] = (unsigned char)c;
        return;
    }
    gf_ycc_rgb(a, b, c, pixel);
}

// Pixel (x, y) of the image, upsampled and converted, written at `pixel`.
__device__ void gf_color_one(const unsigned char* planes, const GfColorJob& job, unsigned int x,
                             unsigned int y, unsigned char* pixel) {
    const int a = gf_upsampled(planes, job.comp[0], x, y);
    if (job.conversion == GF_CC_GRAY) {
        pixel[0] = (unsigned char)a;
        return;
    }
    gf_convert(job, a, gf_upsampled(planes, job.comp[1], x, y),
               gf_upsampled(planes, job.comp[2], x, y), pixel);
}

// Pixels (x, y) and (x + 1, y) (x even) of the image, upsampled and converted, written from
// `pixel` on.
__device__ void gf_color_pair(const unsigned char* planes, const GfColorJob& job, unsigned int x,
                              unsigned int y, unsigned char* pixel) {
    int a[2];
    gf_upsampled_pair(planes, job.comp[0], x, y, a);
    if (job.conversion == GF_CC_GRAY) {
        pixel[0] = (unsigned char)a[0];
        pixel[1] = (unsigned char)a[1];
        return;
    }
    int b[2], c[2];
    gf_upsampled_pair(planes, job.comp[1], x, y, b);
    gf_upsampled_pair(planes, job.comp[2], x, y, c);
    gf_convert(job, a[0], b[0], c[0], pixel);
    gf_convert(job, a[1], b[1], c[1], pixel + 3);
}

// Rows of the window by block (a grid-stride loop), each thread a pair of pixels of a row (an
// even image column and the next), which the h2 upsamplers make from the same input samples;
// a pair the window's edge cuts is made one pixel at a time.
extern "C" __global__ void gpufeed_upsample_color(const unsigned char* planes, unsigned char* out,
                                                  const GfColorJob* jobs) {
    const GfColorJob& job = jobs[blockIdx.y];
    const unsigned int channels = job.conversion == GF_CC_GRAY ? 1 : 3;
    const unsigned int x_end = job.x + job.width;
    const unsigned int first_pair = job.x >> 1;
    const unsigned int pairs = ((x_end + 1) >> 1) - first_pair;
    for (unsigned int row = blockIdx.x; row < job.height; row += gridDim.x) {
        const unsigned int y = job.y + row;
        unsigned char* line = out + job.out + (unsigned long long)row * job.out_pitch;
        for (unsigned int q = threadIdx.x; q < pairs; q += blockDim.x) {
            const unsigned int x = (first_pair + q) << 1;
            if (x >= job.x && x + 1 < x_end) {
                gf_color_pair(planes, job, x, y, line + (x - job.x) * channels);
                continue;
            }
            if (x >= job.x && x < x_end) gf_color_one(planes, job, x, y, line + (x - job.x) * channels);
            if (x + 1 >= job.x && x + 1 < x_end)
                gf_color_one(planes, job, x + 1, y, line + (x + 1 - job.x) * channels);
        }
    }
}
