/*
 * The faster sequential Huffman decoder of huffman.c, for the decompressor of shim.c.
 */
#ifndef GF_HUFFMAN_H
#define GF_HUFFMAN_H

#include <stdio.h>

#include "jpeglib.h"

/* The decoder's tables, kept from one image to the next of a decompressor (one thread's). */
typedef struct gf_huffman_cache gf_huffman_cache;

/* An empty cache (NULL when out of memory), and its end. */
gf_huffman_cache *gf_huffman_cache_new(void);
void gf_huffman_cache_free(gf_huffman_cache *cache);

/* Puts huffman.c's entropy decoder in the place of the library's for the image `cinfo` has just
 * started (jpeg_start_decompress returned, no scanline read or skipped): a single-scan,
 * sequential, 8-bit Huffman JPEG, its tables found in or added to `cache` (which must outlive
 * the image's decoding and serve no other image meanwhile). Returns 1 when it did, 0 when the
 * image is not one it takes, or `cache` is NULL (the library's decoder then stays). */
int gf_huffman_install(j_decompress_ptr cinfo, gf_huffman_cache *cache);

#endif
