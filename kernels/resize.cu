// gpufeed: a batch of decoded images in device memory -> Pillow's antialiased resize and crop,
// bit for bit, into u8 HWC RGB slots of one batch buffer.
//
// Compiled at run time by NVRTC (src/cuda.rs), which has no include path here: no headers.
//
// The host (src/cuda/resize/plan.rs) makes the choices: which passes run in which order (Pillow
// skips an axis whose size is unchanged, and Pillow 13 runs the vertical pass first when the
// height shrinks much more than the width), which rows or columns each pass covers, and each
// output's taps (src/resample/coefficients.rs). Pillow's integer weights (precompute_coeffs +
// normalize_coeffs_8bpc, 22 fraction bits) come from the host, or, for the bilinear and bicubic
// filters where the host leaves them here, from gpufeed_resize_weights, in the host's double
// operations one by one (each rounded on its own: no fused multiply-add). The passes only sum
// products in 32-bit integers from the same rounding half and clamp as Pillow's clip8 does, so
// they agree with the CPU rendition, and so with Pillow, byte for byte:
//
//   gpufeed_resize_weights  one thread per output of every axis whose weights are left here,
//                         before the passes.
//   gpufeed_resize_first  one thread per intermediate pixel of every image that resamples both
//                         axes: Pillow's first pass over only the rows (or columns) the second
//                         reads, into the 8-bit intermediate. Its grid is every image's blocks
//                         back to back (a prefix sum, searched per block).
//   gpufeed_resize_last   one thread per output pixel of every slot written: the pad value
//                         outside the kept rectangle, inside it the last (or only) pass, from the
//                         intermediate or the source region. Its grid is (blocks per slot,
//                         images) when every image has as many pixels, else every image's blocks
//                         back to back, as the first pass's.
//
// Every source is interleaved: RGB (a pixel step of 3) or gray (one channel, step 1), so channel
// c's sample lies c bytes after channel 0's (the descriptor's src[c] is src[0] + c) and one
// pointer, one row pitch and one step address them all. A thread's loop over its taps is
// unrolled four times, so that their loads issue together: the sums are integers, so the order
// in which they are added changes nothing.

#define GF_PRECISION_BITS 22
#define GF_HALF (1 << (GF_PRECISION_BITS - 1))

// One pass: src/cuda/resize/plan.rs's PassDescriptor. Output pixel (i, j) takes its taps from
// the bounds and weights of output i along input row fixed_first + j (horizontal), or of output
// j down input column fixed_first + i (vertical). Offsets count ints into `coeffs`; bounds are
// (first input sample, samples) pairs, weights `taps` per output.
struct GfPass {
    unsigned int vertical;
    unsigned int from_tmp;      // 1: reads the intermediate; 0: the source region
    unsigned int fixed_first;
    unsigned int taps;
    unsigned int bounds;
    unsigned int weights;
};

// One image of the batch: src/cuda/resize/plan.rs's ResizeDescriptor, field for field (152 bytes).
struct GfResizeImage {
    unsigned long long src[3];  // each channel's sample at the source region's top-left
    unsigned long long tmp;     // byte offset of the image's intermediate in `tmp`
    unsigned int src_pitch[3];  // bytes per row of each channel's plane
    unsigned int src_step;      // bytes from one pixel to the next along a row
    unsigned int channels;      // 3, or 1 for gray (spread to RGB on output)
    unsigned int slot;          // output slot
    unsigned int block0;        // first block of the image in the first pass's grid
    unsigned int tmp_width;     // intermediate pixels per row
    unsigned int tmp_height;    // intermediate rows; 0: no first pass
    GfPass first;               // into the intermediate
    GfPass last;                // into the slot's kept rectangle
    unsigned int dst_x;         // kept rectangle in the slot
    unsigned int dst_y;
    unsigned int dst_w;
    unsigned int dst_h;
    unsigned int pad;           // value outside the rectangle: red in the low byte, then green, blue
    unsigned int flip;          // 1: the slot mirrored left to right (a flip after the resize)
    unsigned int out_w;         // the image's output size: rows of out_w * 3 bytes from the
    unsigned int out_h;         //   slot's first byte
    unsigned int last_block0;   // first block of the image in the last pass's grid, when that
                                //   grid is every image's blocks back to back
};

// NVRTC has no offsetof; src/cuda/resize/plan.rs's tests read the structs, field by field, and
// compare the C layout with the Rust one.
static_assert(sizeof(GfPass) == 24, "GfPass size");
static_assert(sizeof(GfResizeImage) == 152, "GfResizeImage size");

// One axis whose weights are computed here: src/cuda/resize/plan.rs's WeightJob, the values
// src/resample/coefficients.rs's loop starts from.
struct GfWeightJob {
    double in0;               // the box's first edge
    double scale;             // source samples per output
    double support;           // how far the stretched filter reaches
    double inv_filterscale;   // one over the filter's stretch
    int in_size;              // samples of the image resized (taps are clamped to it)
    unsigned int taps;        // weights per output
    unsigned int out_first;   // the first output's sample of the resize
    unsigned int out_len;     // outputs
    unsigned int weights;     // offset of the first output's weights in `coeffs`
    unsigned int filter;      // 0: bilinear; 1: bicubic
};

static_assert(sizeof(GfWeightJob) == 56, "GfWeightJob size");

// Rust's `as i32` of a double: toward zero, saturating, NaN to 0 (C's (int) where it is defined).
__device__ __forceinline__ int gf_trunc(double v) {
    if (!(v == v)) return 0;
    if (v >= 2147483647.0) return 2147483647;
    if (v <= -2147483648.0) return -2147483647 - 1;
    return (int)v;
}

// Resample.c's bilinear_filter and bicubic_filter (a = -0.5), operation for operation.
__device__ __forceinline__ double gf_filter(unsigned int bicubic, double x) {
    if (x < 0.0) x = -x;
    if (!bicubic) return x < 1.0 ? __dsub_rn(1.0, x) : 0.0;
    const double a = -0.5;
    if (x < 1.0) {
        return __dadd_rn(__dmul_rn(__dmul_rn(__dsub_rn(__dmul_rn(a + 2.0, x), a + 3.0), x), x),
                         1.0);
    }
    if (x < 2.0) {
        return __dmul_rn(
            __dsub_rn(__dmul_rn(__dadd_rn(__dmul_rn(__dsub_rn(x, 5.0), x), 8.0), x), 4.0), a);
    }
    return 0.0;
}

// The filter's value at tap t of an output centred at `center` whose first tap is `xmin`.
__device__ __forceinline__ double gf_tap(const GfWeightJob& job, double center, int xmin,
                                         int t) {
    const double x = (double)(t + xmin);
    return gf_filter(job.filter,
                     __dmul_rn(__dadd_rn(__dsub_rn(x, center), 0.5), job.inv_filterscale));
}

// Grid (blocks over the longest axis's outputs, jobs or 65535): each thread one output of a job,
// striding over both. Output o's row: its taps' filter values summed in order, each divided by
// the sum (unless it is 0), scaled to 22 fraction bits and rounded half away from zero; zeros
// past its taps. The values are computed twice rather than kept, the same bits each time.
extern "C" __global__ void gpufeed_resize_weights(const GfWeightJob* __restrict__ jobs,
                                                  unsigned int count, int* __restrict__ coeffs) {
    for (unsigned int j = blockIdx.y; j < count; j += gridDim.y) {
        const GfWeightJob job = jobs[j];
        for (unsigned int o = blockIdx.x * blockDim.x + threadIdx.x; o < job.out_len;
             o += gridDim.x * blockDim.x) {
            const double xx = (double)(job.out_first + o);
            const double center = __dadd_rn(job.in0, __dmul_rn(__dadd_rn(xx, 0.5), job.scale));
            int xmin = gf_trunc(__dadd_rn(__dsub_rn(center, job.support), 0.5));
            int xmax = gf_trunc(__dadd_rn(__dadd_rn(center, job.support), 0.5));
            xmin = xmin < 0 ? 0 : xmin;
            xmax = xmax > job.in_size ? job.in_size : xmax;
            const long long span = (long long)xmax - (long long)xmin;
            const int len = span < 0 ? 0 : (span > (long long)job.taps ? (int)job.taps : (int)span);
            double ww = 0.0;
            for (int t = 0; t < len; t++) ww = __dadd_rn(ww, gf_tap(job, center, xmin, t));
            int* row = coeffs + job.weights + (size_t)o * job.taps;
            for (int t = 0; t < (int)job.taps; t++) {
                int fixed = 0;
                if (t < len) {
                    double w = gf_tap(job, center, xmin, t);
                    if (ww != 0.0) w = __ddiv_rn(w, ww);
                    const double scaled = __dmul_rn(w, (double)(1 << GF_PRECISION_BITS));
                    fixed = gf_trunc(w < 0.0 ? __dadd_rn(-0.5, scaled) : __dadd_rn(0.5, scaled));
                }
                row[t] = fixed;
            }
        }
    }
}

// Pillow's clip8: the sum's integer part (arithmetic shift: negative sums floor), clamped.
__device__ __forceinline__ unsigned char gf_clip8(int sum) {
    const int v = sum >> GF_PRECISION_BITS;
    return (unsigned char)(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// C channels: out[c] = clip8(HALF + sum over k < len of p[k * stride + c] * w[k]), in 32-bit
// integers as Pillow sums them (the two headroom bits keep the sum from overflowing).
template <int C>
__device__ __forceinline__ void gf_taps(const unsigned char* __restrict__ p, size_t stride,
                                        const int* __restrict__ w, int len, unsigned char* out) {
    int sum[C];
#pragma unroll
    for (int c = 0; c < C; c++) sum[c] = GF_HALF;
#pragma unroll 4
    for (int k = 0; k < len; k++) {
        const int wk = __ldg(w + k);
        const unsigned char* at = p + (size_t)k * stride;
#pragma unroll
        for (int c = 0; c < C; c++) sum[c] += (int)__ldg(at + c) * wk;
    }
#pragma unroll
    for (int c = 0; c < C; c++) out[c] = gf_clip8(sum[c]);
}

// Output pixel (i, j) of `pass` of image `im` into v[0 .. im->channels).
__device__ __forceinline__ void gf_pass_pixel(const GfResizeImage* __restrict__ im,
                                              const GfPass& pass, const int* __restrict__ coeffs,
                                              const unsigned char* tmp, unsigned int i,
                                              unsigned int j, unsigned char* v) {
    const bool vertical = pass.vertical != 0;
    const unsigned int index = vertical ? j : i;
    const int start = __ldg(coeffs + pass.bounds + 2 * index);
    const int len = __ldg(coeffs + pass.bounds + 2 * index + 1);
    const int* w = coeffs + pass.weights + (size_t)index * pass.taps;
    // The first tap's input pixel.
    const size_t x = vertical ? (size_t)pass.fixed_first + i : (size_t)start;
    const size_t y = vertical ? (size_t)start : (size_t)pass.fixed_first + j;
    const unsigned char* p;
    size_t stride;
    if (pass.from_tmp) {
        const size_t pitch = (size_t)im->tmp_width * im->channels;
        p = tmp + im->tmp + y * pitch + x * im->channels;
        stride = vertical ? pitch : im->channels;
    } else {
        p = reinterpret_cast<const unsigned char*>(im->src[0]) + y * im->src_pitch[0] +
            x * im->src_step;
        stride = vertical ? im->src_pitch[0] : im->src_step;
    }
    if (im->channels == 3) {
        gf_taps<3>(p, stride, w, len, v);
    } else {
        gf_taps<1>(p, stride, w, len, v);
    }
}

// The image whose blocks of a pass include `block`: the last one whose first block (block0 of
// the first pass, last_block0 of the last) is at or before it (images without a first pass own
// no blocks of it and are passed over).
template <bool LAST>
__device__ __forceinline__ unsigned int gf_block_owner(const GfResizeImage* __restrict__ images,
                                                       unsigned int count, unsigned int block) {
    unsigned int lo = 0, hi = count;
    while (hi - lo > 1) {
        const unsigned int mid = (lo + hi) / 2;
        if ((LAST ? images[mid].last_block0 : images[mid].block0) <= block) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// The first pass of every image that has one, into its intermediate (tmp_height rows of
// tmp_width pixels of `channels` bytes).
extern "C" __global__ void gpufeed_resize_first(const GfResizeImage* __restrict__ images,
                                                unsigned int count,
                                                const int* __restrict__ coeffs,
                                                unsigned char* __restrict__ tmp) {
    const GfResizeImage* im = images + gf_block_owner<false>(images, count, blockIdx.x);
    const unsigned int width = im->tmp_width;
    const unsigned int unit = (blockIdx.x - im->block0) * blockDim.x + threadIdx.x;
    if (unit >= im->tmp_height * width) return;
    const unsigned int j = unit / width;
    const unsigned int i = unit - j * width;
    unsigned char v[3];
    gf_pass_pixel(im, im->first, coeffs, tmp, i, j, v);
    unsigned char* out = tmp + im->tmp + (size_t)unit * im->channels;
    for (unsigned int c = 0; c < im->channels; c++) out[c] = v[c];
}

// The last pass into each image's slot: every byte of the image's out_w x out_h pixels from the
// slot's first byte (slots slot_bytes apart), the pad colour around the kept rectangle. Grid
// (blocks for the largest image, images) when gridDim.y is the image count, else (every image's
// blocks back to back, 1).
extern "C" __global__ void gpufeed_resize_last(const GfResizeImage* __restrict__ images,
                                               unsigned int count,
                                               const int* __restrict__ coeffs,
                                               const unsigned char* __restrict__ tmp,
                                               unsigned char* __restrict__ out,
                                               unsigned long long slot_bytes) {
    const bool per_image = gridDim.y == count;
    const GfResizeImage* im =
        images + (per_image ? blockIdx.y : gf_block_owner<true>(images, count, blockIdx.x));
    const unsigned int block = per_image ? blockIdx.x : blockIdx.x - im->last_block0;
    const unsigned int out_width = im->out_w;
    const unsigned int pixels = out_width * im->out_h;
    const unsigned int pixel = block * blockDim.x + threadIdx.x;
    if (pixel >= pixels) return;
    const unsigned int y = pixel / out_width;
    const unsigned int written = pixel - y * out_width;
    unsigned char* dst = out + (size_t)im->slot * slot_bytes + (size_t)pixel * 3;
    // The pixel whose value lands here: itself, or its mirror image when the slot is flipped.
    const unsigned int x = im->flip ? out_width - 1 - written : written;
    // Unsigned: a pixel left of or above the rectangle wraps to a large index.
    const unsigned int i = x - im->dst_x;
    const unsigned int j = y - im->dst_y;
    unsigned char v[3];
    if (i >= im->dst_w || j >= im->dst_h) {
        v[0] = (unsigned char)(im->pad & 255u);
        v[1] = (unsigned char)((im->pad >> 8) & 255u);
        v[2] = (unsigned char)((im->pad >> 16) & 255u);
    } else {
        gf_pass_pixel(im, im->last, coeffs, tmp, i, j, v);
        if (im->channels == 1) v[1] = v[2] = v[0];
    }
    dst[0] = v[0];
    dst[1] = v[1];
    dst[2] = v[2];
}

// One image copied from the GPU lane's ring into its place of a batch: src/cuda/lane's
// GatherDescriptor.
struct GfGather {
    unsigned long long src;  // address of the image in the ring
    unsigned long long dst;  // byte offset of its place in the batch buffer
};
static_assert(sizeof(GfGather) == 16, "GfGather size");

// Grid (blocks per image, images): each block copies a strided share of one image's `bytes`
// bytes, 16 at a time when the addresses and size allow, else byte by byte.
extern "C" __global__ void gpufeed_gather(const GfGather* __restrict__ images,
                                          unsigned char* __restrict__ out,
                                          unsigned long long bytes) {
    const GfGather g = images[blockIdx.y];
    const unsigned char* src = reinterpret_cast<const unsigned char*>(g.src);
    unsigned char* dst = out + g.dst;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (((g.src | (unsigned long long)(size_t)dst | bytes) & 15) == 0) {
        const uint4* s = reinterpret_cast<const uint4*>(src);
        uint4* d = reinterpret_cast<uint4*>(dst);
        for (size_t i = first; i < bytes / 16; i += step) d[i] = s[i];
    } else {
        for (size_t i = first; i < bytes; i += step) dst[i] = src[i];
    }
}
