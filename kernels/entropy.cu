// gpufeed: baseline JPEG entropy decoding on the GPU, bit for bit libjpeg-turbo's coefficients
// (jdhuff.c decode_mcu), for a batch of images at once, with the self-synchronising parallel
// Huffman decode of Weissenberger and Schmidt ("Massively Parallel Huffman Decoding on GPUs",
// ICPP 2018; "Accelerating JPEG Decompression on GPUs", HiPC 2021).
//
// Input (src/coefficients/entropy.rs, entropy_batch.rs): each image's destuffed entropy-coded
// data (u32 words, big-endian bit order), its Huffman tables in lookup form, its restart
// intervals, each cut into subsequences of at most GF_SUB_BITS bits (one thread each).
//
// The decoder's state between two symbols is (bit position, block of the MCU, coefficient index
// in the block). A subsequence decodes every symbol that starts inside it; what it leaves is its
// exit state. Launches, all one thread per subsequence except the scan:
//   gpufeed_huff_zero    zero the batch's coefficient planes (the writes below skip zeros).
//   gpufeed_huff_sync    pass p: each subsequence decodes from its predecessor's exit state of
//                        pass p - 1 (pass 0: from its own first bit at the start of a block, a
//                        guess; the first subsequence of an interval knows its state; a guess
//                        that meets a code no table holds, or a run past coefficient 63, guesses
//                        again from the next bit), counting the blocks it completes and summing
//                        its DC differences per component;
//                        a pass whose exit states all equal the pass before's is the exact
//                        sequential decode, and later passes return at once.
//   gpufeed_huff_group,  each subsequence's first block and DC predictors: a prefix sum of the
//   gpufeed_huff_scan,   counts and sums of its interval, in two levels (sums of groups of 32
//   gpufeed_huff_expand  subsequences, one thread per interval walking the groups, one thread
//                        per group writing its subsequences').
//   gpufeed_huff_write   each subsequence decodes once more from its predecessor's final exit
//                        state and writes its coefficients (natural order, DC undifferenced) into
//                        the planes, stopping after the interval's last block, and checks that it
//                        ends in its own final exit state.
// Anomalies (a code no table holds, a run past coefficient 63, a symbol past the interval's
// data, too few blocks, no synchronisation) set bits of the image's status word; the caller
// decodes such an image on the CPU. Nothing is written outside the image's planes.
//
// Compiled at run time by NVRTC (no headers). Also compiled as C++ on the host with a few macros
// standing in for CUDA's (src/coefficients/entropy_host_check.rs), which runs every thread of
// every launch one after another: no shared memory, no synchronisation inside a launch, no warp
// functions, and each thread reads only what earlier launches wrote (the status words aside,
// which only ever gain bits), so that sequential run is the GPU's result.

#define GF_LOOKUP_BITS 10
#define GF_TABLE_WORDS ((1 << GF_LOOKUP_BITS) + 18 + 18 + 64)
#define GF_MAXCODE (1 << GF_LOOKUP_BITS)
#define GF_VALOFFSET (GF_MAXCODE + 18)
#define GF_SYMBOLS (GF_VALOFFSET + 18)
#define GF_MAX_BLOCKS_IN_MCU 10

#define GF_STATUS_BAD_CODE 1u
#define GF_STATUS_BAD_RUN 2u
#define GF_STATUS_OVERRUN 4u
#define GF_STATUS_SHORT 8u
#define GF_STATUS_NO_SYNC 16u

// One image (entropy_batch.rs HuffImage).
struct GfHuffImage {
    unsigned long long data;  // u32 word offset of its data in the data buffer
    unsigned long long coef;  // i16 offset of its first plane in the coefficient buffer
    unsigned int words;       // u32 words of its data (zero words past the end included)
    unsigned int tables;      // u32 word offset of its tables (DC, AC of each component)
    unsigned int mcus_wide;   // MCUs per MCU row
    unsigned int blocks_in_mcu;
    unsigned int plane[3];    // i16 offset of each component's plane from `coef`
    unsigned int plane_wide[3]; // blocks per row of each plane
    unsigned int h[3];        // blocks across and down each component's part of an MCU
    unsigned int v[3];
    unsigned int block[GF_MAX_BLOCKS_IN_MCU]; // component | column << 8 | row << 16
    unsigned int status;      // index of its status word
    unsigned int period;      // the MCU's blocks repeat their tables every `period` blocks
};

// One subsequence (entropy_batch.rs HuffSub).
struct GfHuffSub {
    unsigned int image;
    unsigned int interval;    // index in the batch's intervals
    unsigned int start;       // its first bit in the image's data
    unsigned int end;         // one past its last bit
    unsigned int limit;       // one past the interval's last bit
    unsigned int first;       // 1 for an interval's first subsequence
};

// One restart interval (entropy_batch.rs HuffInterval).
struct GfHuffInterval {
    unsigned int image;
    unsigned int first_sub;   // its first subsequence in the batch's list
    unsigned int subs;        // its subsequences
    unsigned int first_block; // its first block in the image (first MCU * blocks in an MCU)
    unsigned int blocks;      // blocks it codes
    unsigned int unused;
};

// A subsequence's exit state and what its decode produced.
struct GfHuffExit {
    unsigned int pos;         // bit position after its last symbol
    unsigned int state;       // coefficient index | (block of the MCU % period) << 8
    unsigned int blocks;      // blocks it completed
    unsigned int changed;     // 1 when this pass changed (pos, state) (always in pass 0)
    unsigned int dc[GF_MAX_BLOCKS_IN_MCU / 2]; // DC differences summed (wrapping 16-bit, two a
                              // word) by block: bucket i holds the blocks base + i + j * (blocks
                              // in an MCU), base being the block its first symbol belongs to
};

// Where a subsequence starts writing (gpufeed_huff_scan).
struct GfHuffBase {
    unsigned int block;       // the image's block its first symbol belongs to
    unsigned int dc01;        // DC predictors of components 0 and 1 at its start
    unsigned int dc2;
    unsigned int unused;
};

static_assert(sizeof(GfHuffImage) == 128, "GfHuffImage is entropy_batch.rs HuffImage");
static_assert(sizeof(GfHuffSub) == 24, "GfHuffSub is entropy_batch.rs HuffSub");
static_assert(sizeof(GfHuffInterval) == 24, "GfHuffInterval is entropy_batch.rs HuffInterval");
static_assert(sizeof(GfHuffExit) == 36, "GfHuffExit");
static_assert(sizeof(GfHuffBase) == 16, "GfHuffBase");

// jpeg_natural_order.
__device__ const unsigned char gf_natural[64] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
    12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
    35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
    58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

__device__ __forceinline__ unsigned int gf_bswap(unsigned int w) {
#ifdef GF_HOST
    return __builtin_bswap32(w);
#else
    return __byte_perm(w, 0, 0x0123);
#endif
}

// Word `w` of the image's data in its bit order (zero past its words).
__device__ __forceinline__ unsigned int gf_word(const unsigned int* __restrict__ data,
                                                unsigned int words, unsigned int w) {
    return w < words ? gf_bswap(data[w]) : 0u;
}

// The data's next bits from a bit position on, 64 of them held in registers: `bits` left-aligned
// (its top bit is the one at the position), `have` of them valid, and the word after them,
// `ahead` (word `word` of the data), loaded a refill before it is needed. One load refills 32
// bits, where reading every symbol's 32 bits afresh would take two, and a refill does not wait
// on it.
struct GfBits {
    unsigned long long bits;
    unsigned int have, word, ahead;
};

__device__ __forceinline__ void gf_bits_at(const unsigned int* __restrict__ data,
                                           unsigned int words, unsigned int pos, GfBits& b) {
    const unsigned int w = pos >> 5;
    const unsigned long long two =
        (unsigned long long)gf_word(data, words, w) << 32 | gf_word(data, words, w + 1);
    b.bits = two << (pos & 31);
    b.have = 64 - (pos & 31);
    b.word = w + 2;
    b.ahead = gf_word(data, words, b.word);
}

// The next 32 bits (at least 32 are then held).
__device__ __forceinline__ unsigned int gf_bits_peek(const unsigned int* __restrict__ data,
                                                     unsigned int words, GfBits& b) {
    if (b.have < 32) {
        b.bits |= (unsigned long long)b.ahead << (32 - b.have);
        b.have += 32;
        b.ahead = gf_word(data, words, ++b.word);
    }
    return (unsigned int)(b.bits >> 32);
}

// Drops `len` bits (at most 31, and at most what the last peek left held).
__device__ __forceinline__ void gf_bits_drop(GfBits& b, unsigned int len) {
    b.bits <<= len;
    b.have -= len;
}

// Decodes one Huffman code from the 32 bits `bits`: its symbol, and its length in `len` (0 for a
// code the table does not hold: jdhuff.c jpeg_huff_decode's "corrupt data" case).
__device__ __forceinline__ unsigned int gf_huff(const unsigned int* __restrict__ table,
                                                unsigned int bits, unsigned int* len) {
    const unsigned int entry = table[bits >> (32 - GF_LOOKUP_BITS)];
    if (entry != 0) {
        *len = entry >> 8;
        return entry & 255;
    }
    for (unsigned int l = GF_LOOKUP_BITS + 1; l <= 16; l++) {
        const int code = (int)(bits >> (32 - l));
        if (code <= (int)table[GF_MAXCODE + l]) {
            const unsigned int index = (unsigned int)((int)table[GF_VALOFFSET + l] + code) & 255;
            *len = l;
            return (table[GF_SYMBOLS + (index >> 2)] >> (8 * (index & 3))) & 255;
        }
    }
    *len = 0;
    return 0;
}

// HUFF_EXTEND: the `s`-bit value `r` as a signed coefficient.
__device__ __forceinline__ int gf_extend(unsigned int r, unsigned int s) {
    return (r < (1u << (s - 1))) ? (int)r - (int)(1u << s) + 1 : (int)r;
}

// The decoder: one subsequence's symbols from a start state. With `out` null it only counts and
// sums (the sync passes); otherwise it writes, from block `block` on with DC predictors `pred`,
// stopping at block `stop`, and reports anomalies in `*status`.
struct GfDecode {
    unsigned int pos, k, b, blocks, error, bucket;
    unsigned short dc[GF_MAX_BLOCKS_IN_MCU];
};

// The component of each block of the MCU, two bits a block (GF_MAX_BLOCKS_IN_MCU of them).
__device__ __forceinline__ unsigned int gf_components(const GfHuffImage& im) {
    unsigned int mask = 0;
    for (unsigned int j = 0; j < GF_MAX_BLOCKS_IN_MCU && j < im.blocks_in_mcu; j++)
        mask |= (im.block[j] & 3u) << (2 * j);
    return mask;
}

// A warp's threads decode different symbols: one table lookup serves a DC and an AC code alike
// (a DC symbol is a size below 16, an AC symbol a run and a size), and a block's place in its
// plane follows from the one before without a division, so that the paths a warp takes in step
// stay short.
__device__ __forceinline__ void gf_decode(const unsigned int* __restrict__ data,
                                          const unsigned int* __restrict__ tables,
                                          const GfHuffImage& im, unsigned int end,
                                          unsigned int limit, GfDecode& d, short* out,
                                          unsigned int block, unsigned int stop,
                                          const unsigned short* pred, unsigned int* status) {
    const bool writing = out != 0;
    const unsigned int words = im.words, blocks_in_mcu = im.blocks_in_mcu, period = im.period;
    const unsigned int components = gf_components(im);
    // Where block `block` lies (writing only): its place in the MCU and the MCU's column and row,
    // from the block's index once, then advanced a block at a time, so an inconsistent state
    // cannot move a write outside the planes.
    unsigned int bb = 0, mx = 0, my = 0, comp = 0;
    short* dst = 0;
    if (writing) {
        const unsigned int mcu = block / blocks_in_mcu;
        bb = block - mcu * blocks_in_mcu;
        mx = mcu % im.mcus_wide;
        my = mcu / im.mcus_wide;
    }
    #define GF_LOCATE()                                                                   \
        if (writing && block < stop) {                                                    \
            const unsigned int info = im.block[bb];                                       \
            comp = info & 255;                                                            \
            const unsigned int bx = mx * im.h[comp] + ((info >> 8) & 255);                \
            const unsigned int by = my * im.v[comp] + (info >> 16);                       \
            dst = out + im.plane[comp] +                                                  \
                  ((unsigned long long)by * im.plane_wide[comp] + bx) * 64;              \
        }
    GF_LOCATE();
    GfBits in;
    gf_bits_at(data, words, d.pos, in);
    while (d.pos < end) {
        if (writing && block >= stop) return;
        const unsigned int bits = gf_bits_peek(data, words, in);
        const unsigned int c = (components >> (2 * d.b)) & 3;
        const bool dc = d.k == 0;
        unsigned int len;
        const unsigned int symbol =
            gf_huff(tables + (2 * c + (dc ? 0 : 1)) * GF_TABLE_WORDS, bits, &len);
        const unsigned int r = symbol >> 4, s = symbol & 15;
        if (len == 0 || (!dc && s && d.k + r > 63)) {
            if (writing) {
                d.error = len == 0 ? GF_STATUS_BAD_CODE : GF_STATUS_BAD_RUN;
                break;
            }
            // A guess gone wrong (the true decode of a valid file never gets here): guess again
            // from the next bit.
            d.k = 0;
            d.b = 0;
            d.pos += 1;
            gf_bits_drop(in, 1);
            continue;
        }
        const int value = s ? gf_extend((bits << len) >> (32 - s), s) : 0;
        len += s;
        if (writing && d.pos + len > limit) {
            atomicOr(status, GF_STATUS_OVERRUN);
            return;
        }
        if (dc) {
            if (writing) {
                // Constant indices only (a run-time index would put the decoder's state in
                // local memory).
                unsigned short sum = 0;
#pragma unroll
                for (int j = 0; j < 3; j++)
                    if ((unsigned int)j == comp) {
                        d.dc[j] = (unsigned short)(d.dc[j] + (unsigned short)value);
                        sum = (unsigned short)(pred[j] + d.dc[j]);
                    }
                dst[0] = (short)sum;
            } else {
#pragma unroll
                for (int j = 0; j < GF_MAX_BLOCKS_IN_MCU; j++)
                    if ((unsigned int)j == d.bucket)
                        d.dc[j] = (unsigned short)(d.dc[j] + (unsigned short)value);
            }
            d.k = 1;
        } else if (s) {
            d.k += r;
            if (writing) dst[gf_natural[d.k]] = (short)value;
            d.k++;
        } else {
            d.k = r == 15 ? d.k + 16 : 64; // sixteen zeros, or the end of the block
        }
        d.pos += len;
        gf_bits_drop(in, len);
        if (d.k >= 64) {
            d.k = 0;
            d.blocks++;
            d.b = d.b + 1 == period ? 0 : d.b + 1;
            d.bucket = d.bucket + 1 == blocks_in_mcu ? 0 : d.bucket + 1;
            if (writing) {
                block++;
                if (++bb == blocks_in_mcu) {
                    bb = 0;
                    if (++mx == im.mcus_wide) {
                        mx = 0;
                        my++;
                    }
                }
                GF_LOCATE();
            }
        }
    }
    #undef GF_LOCATE
    if (writing && d.error && block < stop) atomicOr(status, d.error);
}

__device__ __forceinline__ unsigned int gf_state(const GfDecode& d) {
    return d.k | d.b << 8;
}

// The start state of subsequence `i` from the exits of the pass before (`prev`, null in pass 0).
__device__ __forceinline__ void gf_start(const GfHuffSub& sub, const GfHuffExit* prev,
                                         unsigned int i, GfDecode& d) {
    d.pos = sub.start;
    d.k = 0;
    d.b = 0;
    d.blocks = 0;
    d.error = 0;
    d.bucket = 0;
    for (int j = 0; j < GF_MAX_BLOCKS_IN_MCU; j++) d.dc[j] = 0;
    if (!sub.first && prev != 0) {
        const GfHuffExit e = prev[i - 1];
        d.pos = e.pos;
        d.k = e.state & 255;
        d.b = (e.state >> 8) & 255;
    }
}

// The pass whose exits are final: the first pass that changed nothing, else the last.
__device__ __forceinline__ unsigned int gf_final_pass(const unsigned int* changed,
                                                      unsigned int passes) {
    for (unsigned int p = 1; p < passes; p++)
        if (changed[p] == 0) return p;
    return passes - 1;
}

extern "C" __global__ void gpufeed_huff_zero(unsigned int* __restrict__ coef,
                                             unsigned long long words) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < words; i += stride)
        coef[i] = 0;
}

// Pass `pass` of the synchronisation: exits[pass & 1] from exits[(pass - 1) & 1]. `changed[p]`
// is set when pass p's exits differ from pass p - 1's (always for pass 0); the first pass that
// changes nothing is final, and the passes after it return at once.
extern "C" __global__ void gpufeed_huff_sync(const unsigned int* __restrict__ data,
                                             const unsigned int* __restrict__ tables,
                                             const GfHuffImage* __restrict__ images,
                                             const GfHuffSub* __restrict__ subs,
                                             unsigned int n, GfHuffExit* exits,
                                             unsigned int* changed, unsigned int pass) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (pass > 0 && changed[pass - 1] == 0) return;
    const GfHuffSub sub = subs[i];
    const GfHuffExit* prev = pass > 0 ? exits + (unsigned long long)((pass - 1) & 1) * n : 0;
    GfHuffExit* next = exits + (unsigned long long)(pass & 1) * n;
    // A subsequence whose start state did not change (its predecessor's exit of the pass before
    // is what it was a pass earlier) ends as it did: copied, not decoded again.
    if (pass > 0 && (sub.first || !(prev[i - 1].changed & 1))) {
        GfHuffExit e = prev[i];
        e.changed = 0;
        next[i] = e;
        return;
    }
    // Read in place (cached), not copied: its per-block table is indexed at run time.
    const GfHuffImage& im = images[sub.image];
    GfDecode d;
    gf_start(sub, prev, i, d);
    gf_decode(data + im.data, tables + im.tables, im, sub.end,
              sub.limit, d, 0, 0, 0, 0, 0);
    GfHuffExit e;
    e.pos = d.pos;
    e.state = gf_state(d);
    e.blocks = d.blocks;
    for (int j = 0; j < GF_MAX_BLOCKS_IN_MCU / 2; j++)
        e.dc[j] = d.dc[2 * j] | (unsigned int)d.dc[2 * j + 1] << 16;
    e.changed = pass == 0 || prev[i].pos != e.pos || prev[i].state != e.state;
    next[i] = e;
    if (e.changed) changed[pass] = 1;
}

// Subsequences of one group (a prefix sum's first level).
#define GF_GROUP_SUBS 32u

// Whether group `g` is GF_GROUP_SUBS subsequences of one interval (the others are summed one
// subsequence at a time by their interval's thread).
__device__ __forceinline__ bool gf_whole_group(const GfHuffSub* __restrict__ subs, unsigned int n,
                                               unsigned int g) {
    const unsigned int first = g * GF_GROUP_SUBS, last = first + GF_GROUP_SUBS - 1;
    return last < n && subs[first].interval == subs[last].interval;
}

// Advances a running (block, DC predictors) over `e`: blocks completed and DC differences by
// bucket, bucket j being the blocks at `block + j` modulo the MCU (of their component).
__device__ __forceinline__ void gf_advance(const GfHuffImage& im, const GfHuffExit& e,
                                           unsigned long long& block, unsigned short& dc0,
                                           unsigned short& dc1, unsigned short& dc2) {
    unsigned int at = (unsigned int)(block % im.blocks_in_mcu);
#pragma unroll
    for (unsigned int j = 0; j < GF_MAX_BLOCKS_IN_MCU; j++) {
        if (j >= im.blocks_in_mcu) break;
        const unsigned int c = im.block[at] & 255;
        const unsigned short sum = (unsigned short)(e.dc[j >> 1] >> (16 * (j & 1)));
        if (c == 0)
            dc0 = (unsigned short)(dc0 + sum);
        else if (c == 1)
            dc1 = (unsigned short)(dc1 + sum);
        else
            dc2 = (unsigned short)(dc2 + sum);
        at = at + 1 == im.blocks_in_mcu ? 0 : at + 1;
    }
    block += e.blocks;
}

__device__ __forceinline__ GfHuffBase gf_base(unsigned long long block, unsigned short dc0,
                                              unsigned short dc1, unsigned short dc2) {
    GfHuffBase b;
    b.block = (unsigned int)(block < 0xFFFFFFFFull ? block : 0xFFFFFFFFull);
    b.dc01 = dc0 | (unsigned int)dc1 << 16;
    b.dc2 = dc2;
    b.unused = 0;
    return b;
}

// First level of the prefix sum: each whole group's blocks and DC differences by bucket,
// relative to its first subsequence's first block (as one subsequence's exit holds them).
extern "C" __global__ void gpufeed_huff_group(const GfHuffImage* __restrict__ images,
                                              const GfHuffSub* __restrict__ subs, unsigned int n,
                                              const GfHuffExit* __restrict__ exits,
                                              const unsigned int* __restrict__ changed,
                                              unsigned int passes, GfHuffExit* groups) {
    const unsigned int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (n + GF_GROUP_SUBS - 1) / GF_GROUP_SUBS || !gf_whole_group(subs, n, g)) return;
    const GfHuffExit* fin = exits + (unsigned long long)(gf_final_pass(changed, passes) & 1) * n;
    const unsigned int first = g * GF_GROUP_SUBS;
    const GfHuffImage& im = images[subs[first].image];
    unsigned int blocks = 0;
    unsigned short dc[GF_MAX_BLOCKS_IN_MCU] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (unsigned int s = first; s < first + GF_GROUP_SUBS; s++) {
        const GfHuffExit& e = fin[s];
        unsigned int at = blocks % im.blocks_in_mcu;
        for (unsigned int j = 0; j < im.blocks_in_mcu; j++) {
            dc[at] = (unsigned short)(dc[at] + (unsigned short)(e.dc[j >> 1] >> (16 * (j & 1))));
            at = at + 1 == im.blocks_in_mcu ? 0 : at + 1;
        }
        blocks += e.blocks;
    }
    GfHuffExit out;
    out.pos = 0;
    out.state = 0;
    out.blocks = blocks;
    out.changed = 0;
    for (unsigned int j = 0; j < GF_MAX_BLOCKS_IN_MCU / 2; j++)
        out.dc[j] = dc[2 * j] | (unsigned int)dc[2 * j + 1] << 16;
    groups[g] = out;
}

// One thread per interval: the first block and DC predictors of each of its subsequences outside
// whole groups and of each whole group, walking whole groups by their sums; an interval that
// decodes fewer blocks than it codes marks its image short.
extern "C" __global__ void gpufeed_huff_scan(const GfHuffImage* __restrict__ images,
                                             const GfHuffInterval* __restrict__ intervals,
                                             unsigned int n_intervals, unsigned int n,
                                             const GfHuffExit* __restrict__ exits,
                                             const unsigned int* __restrict__ changed,
                                             unsigned int passes,
                                             const GfHuffExit* __restrict__ groups,
                                             GfHuffBase* group_bases, GfHuffBase* bases,
                                             unsigned int* status) {
    const unsigned int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_intervals) return;
    const GfHuffInterval iv = intervals[t];
    const GfHuffExit* fin = exits + (unsigned long long)(gf_final_pass(changed, passes) & 1) * n;
    // Read in place (cached), not copied: its per-block table is indexed at run time.
    const GfHuffImage& im = images[iv.image];
    unsigned long long block = iv.first_block;
    unsigned short dc0 = 0, dc1 = 0, dc2 = 0;
    const unsigned int end = iv.first_sub + iv.subs;
    unsigned int s = iv.first_sub;
    while (s < end) {
        if (s % GF_GROUP_SUBS == 0 && s + GF_GROUP_SUBS <= end) {
            const unsigned int g = s / GF_GROUP_SUBS;
            group_bases[g] = gf_base(block, dc0, dc1, dc2);
            gf_advance(im, groups[g], block, dc0, dc1, dc2);
            s += GF_GROUP_SUBS;
        } else {
            bases[s] = gf_base(block, dc0, dc1, dc2);
            gf_advance(im, fin[s], block, dc0, dc1, dc2);
            s++;
        }
    }
    if (block < (unsigned long long)iv.first_block + iv.blocks)
        atomicOr(status + im.status, GF_STATUS_SHORT);
}

// Second level: the subsequences of each whole group from the group's start.
extern "C" __global__ void gpufeed_huff_expand(const GfHuffImage* __restrict__ images,
                                               const GfHuffSub* __restrict__ subs,
                                               unsigned int n,
                                               const GfHuffExit* __restrict__ exits,
                                               const unsigned int* __restrict__ changed,
                                               unsigned int passes,
                                               const GfHuffBase* __restrict__ group_bases,
                                               GfHuffBase* bases) {
    const unsigned int g = blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (n + GF_GROUP_SUBS - 1) / GF_GROUP_SUBS || !gf_whole_group(subs, n, g)) return;
    const GfHuffExit* fin = exits + (unsigned long long)(gf_final_pass(changed, passes) & 1) * n;
    const unsigned int first = g * GF_GROUP_SUBS;
    const GfHuffImage& im = images[subs[first].image];
    const GfHuffBase b = group_bases[g];
    unsigned long long block = b.block;
    unsigned short dc0 = (unsigned short)(b.dc01 & 0xFFFF), dc1 = (unsigned short)(b.dc01 >> 16),
                   dc2 = (unsigned short)b.dc2;
    for (unsigned int s = first; s < first + GF_GROUP_SUBS; s++) {
        bases[s] = gf_base(block, dc0, dc1, dc2);
        gf_advance(im, fin[s], block, dc0, dc1, dc2);
    }
}

// The coefficients: each subsequence decodes from its predecessor's final exit and writes.
extern "C" __global__ void gpufeed_huff_write(const unsigned int* __restrict__ data,
                                              const unsigned int* __restrict__ tables,
                                              const GfHuffImage* __restrict__ images,
                                              const GfHuffSub* __restrict__ subs,
                                              const GfHuffInterval* __restrict__ intervals,
                                              unsigned int n, const GfHuffExit* __restrict__ exits,
                                              const unsigned int* __restrict__ changed,
                                              unsigned int passes,
                                              const GfHuffBase* __restrict__ bases,
                                              short* __restrict__ coef, unsigned int* status) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const GfHuffSub sub = subs[i];
    // Read in place (cached), not copied: its per-block table is indexed at run time.
    const GfHuffImage& im = images[sub.image];
    const GfHuffInterval iv = intervals[sub.interval];
    const GfHuffExit* fin = exits + (unsigned long long)(gf_final_pass(changed, passes) & 1) * n;
    const GfHuffBase base = bases[i];
    const unsigned int stop = iv.first_block + iv.blocks;
    if (base.block >= stop) return;
    GfDecode d;
    gf_start(sub, fin, i, d);
    const unsigned short pred[3] = {(unsigned short)(base.dc01 & 0xFFFF),
                                    (unsigned short)(base.dc01 >> 16),
                                    (unsigned short)base.dc2};
    unsigned int* st = status + im.status;
    // The last pass still changed this subsequence's exit: its image's decode has not settled
    // (the first pass that changes nothing is the sequential decode; without one, the starts
    // are not known to be right).
    if (changed[passes - 1] != 0 && (fin[i].changed & 1)) {
        atomicOr(st, GF_STATUS_NO_SYNC);
        return;
    }
    gf_decode(data + im.data, tables + im.tables, im, sub.end,
              sub.limit, d, coef + im.coef, base.block, stop, pred, st);
    const unsigned int reached = base.block + d.blocks;
    if (reached < stop && !d.error &&
        (fin[i].pos != d.pos || fin[i].state != gf_state(d)))
        atomicOr(st, GF_STATUS_NO_SYNC);
}
