// Planes of bytes (masks) gathered through per-axis index maps: output byte (plane p, row y,
// column x) is source plane p's byte at (ys[y], xs[x]) - a nearest-neighbour resize, crop and
// flip in one lookup. A negative map value -g names pad call g: the byte is that call's fill
// (of the row's or the column's pad call, whichever came later, i.e. the more negative).
// Past a plane's mapped rows and columns the byte is the plane's `beyond`. Every byte of every
// plane is written. Bit for bit `Layout::mask_into` of src/targets/layout.rs.

// One output plane (48 bytes; `GatherPlane` in src/cuda/gather.rs).
struct GfGatherPlane {
    unsigned long long source;   // first byte of the source plane in `sources`
    unsigned int source_width;
    unsigned int source_height;
    unsigned int xs;             // the column map: maps[xs .. xs + xs_len]
    unsigned int xs_len;
    unsigned int ys;             // the row map: maps[ys .. ys + ys_len]
    unsigned int ys_len;
    unsigned int fills;          // pad call g's fill: maps[fills + g - 1], g <= fill_count
    unsigned int fill_count;
    unsigned int beyond;         // the byte past the mapped output
    unsigned int unused;
};

static_assert(sizeof(GfGatherPlane) == 48, "GfGatherPlane is 48 bytes");

// Grid: x over columns (blockDim.x threads a block), y over rows, z over planes; rows and
// planes beyond the grid's are taken in strides of it.
extern "C" __global__ void gpufeed_gather_planes(
    const unsigned char* __restrict__ sources,
    const GfGatherPlane* __restrict__ planes,
    unsigned int plane_count,
    const int* __restrict__ maps,
    unsigned char* __restrict__ out,
    unsigned int width,
    unsigned int height)
{
    const unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= width) {
        return;
    }
    for (unsigned int p = blockIdx.z; p < plane_count; p += gridDim.z) {
        const GfGatherPlane d = planes[p];
        const bool column_mapped = x < d.xs_len;
        const int sx = column_mapped ? maps[d.xs + x] : 0;
        unsigned char* plane = out + (unsigned long long)p * height * width;
        for (unsigned int y = blockIdx.y; y < height; y += gridDim.y) {
            unsigned int v = d.beyond;
            if (column_mapped && y < d.ys_len) {
                const int sy = maps[d.ys + y];
                const int m = min(sy, sx);
                if (m < 0) {
                    const unsigned int g = (unsigned int)(-m);
                    v = g <= d.fill_count ? (unsigned int)maps[d.fills + g - 1] : 0u;
                } else if ((unsigned int)sx < d.source_width
                           && (unsigned int)sy < d.source_height) {
                    v = sources[d.source + (unsigned long long)sy * d.source_width + sx];
                } else {
                    v = 0u;
                }
            }
            plane[(unsigned long long)y * width + x] = (unsigned char)v;
        }
    }
}
