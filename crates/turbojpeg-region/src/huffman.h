/*
 * The faster sequential Huffman decoder of huffman.c, for the decompressor of shim.c.
 */
#ifndef GF_HUFFMAN_H
#define GF_HUFFMAN_H

#include <stdio.h>

#include "jpeglib.h"

/* Puts huffman.c's entropy decoder in the place of the library's for the image `cinfo` has just
 * started (jpeg_start_decompress returned, no scanline read or skipped): a single-scan,
 * sequential, 8-bit Huffman JPEG. Returns 1 when it did, 0 when the image is not one it takes
 * (the library's decoder then stays). */
int gf_huffman_install(j_decompress_ptr cinfo);

#endif
