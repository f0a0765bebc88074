/*
 * A faster sequential Huffman entropy decoder for libjpeg-turbo's decompressor, taking the place
 * of the library's own (jdhuff.c) for one image once jpeg_start_decompress has set it up.
 *
 * It is that decoder with one change to its fast path: a second lookup table per Huffman table
 * resolves a code together with the magnitude bits that follow it whenever both fit in the
 * table's index (GF_FAST_BITS bits for a DC table, GF_AC_BITS for an AC one; most coefficients
 * of a photo: a short code and a small value), giving the coefficient's run, value and length in
 * one lookup instead of a code lookup, a bit-buffer check, a bit extraction and a sign
 * extension. In an AC table an entry holds two symbols where the second fits after the first
 * (a coefficient, then a coefficient or the end of the block), and runs of 16 zeros and ends of
 * block resolve the same way. The tables are kept from one image to the next (most files of a
 * folder share theirs). The bit buffer is refilled six bytes at a time, in one load when none
 * of them is 0xFF. And files with restart markers take the fast path too (see decode_mcu). The rest is the library's code:
 * the slow path near markers and at the end of the data, restart markers, the zero bits stuffed
 * after a premature end. So the coefficients and the pixels are the library's, bit for bit, on
 * any data. So are the warnings, with two exceptions on damaged files: the bit buffer is
 * refilled at other points (once a coefficient rather than once a code and once its bits), so
 * when a damaged scan ends early the count of stray bytes libjpeg reports before the next marker
 * can differ by a few; and the fast path, the library's as this one, replaces a bad code by a
 * zero without the warning its slow path gives, so a file the library decodes on the slow path
 * (restart markers) can warn there and not here. The tests compare both decoders on clean,
 * truncated and corrupted files.
 *
 * Derived from libjpeg-turbo 3.1's jdhuff.c and jdhuff.h:
 *   This file was part of the Independent JPEG Group's software:
 *   Copyright (C) 1991-1997, Thomas G. Lane.
 *   libjpeg-turbo Modifications:
 *   Copyright (C) 2009-2011, 2016, 2018-2019, 2022, D. R. Commander.
 *   Copyright (C) 2018, Matthias Räncker.
 * distributed under the IJG license and the Modified (3-clause) BSD License (libjpeg-turbo's
 * LICENSE.md and README.ijg). This software is based in part on the work of the Independent
 * JPEG Group.
 */

#include <stddef.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "jpeglib.h"
#include "jerror.h"

#include "huffman.h"

/* The library's internal structures this decoder meets (jpegint.h), as libjpeg-turbo 3.1 lays
 * them out: its entropy decoder's public part, which the coefficient controller and
 * jpeg_skip_scanlines read, and the marker reader, which reads restart markers. */
#if !defined(LIBJPEG_TURBO_VERSION_NUMBER) || LIBJPEG_TURBO_VERSION_NUMBER < 3001000 || \
    LIBJPEG_TURBO_VERSION_NUMBER >= 3002000
#error "huffman.c mirrors libjpeg-turbo 3.1's internal structures; check jpegint.h and jdhuff.c"
#endif

struct jpeg_entropy_decoder {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
  /* Lossless mode's (its first argument after cinfo is a JDIFFIMAGE, not used here) */
  JDIMENSION (*decode_mcus)(j_decompress_ptr cinfo, void *diff_buf, JDIMENSION MCU_row_num,
                            JDIMENSION MCU_col_num, JDIMENSION nMCU);
  boolean (*process_restart)(j_decompress_ptr cinfo);
  boolean insufficient_data;
};

struct jpeg_marker_reader {
  void (*reset_marker_reader)(j_decompress_ptr cinfo);
  int (*read_markers)(j_decompress_ptr cinfo);
  jpeg_marker_parser_method read_restart_marker;
  boolean saw_SOI;
  boolean saw_SOF;
  int next_restart_num;
  unsigned int discarded_bytes;
};

struct jpeg_input_controller {
  int (*consume_input)(j_decompress_ptr cinfo);
  void (*reset_input_controller)(j_decompress_ptr cinfo);
  void (*start_input_pass)(j_decompress_ptr cinfo);
  void (*finish_input_pass)(j_decompress_ptr cinfo);
  boolean has_multiple_scans;
  boolean eoi_reached;
};

#define HUFF_LOOKAHEAD 8 /* the library's code lookup */
#define GF_FAST_BITS 10  /* a DC table's combined lookup: 4 KiB */
#define GF_AC_BITS 11    /* an AC table's: 8 KiB */
#define BIT_BUF_SIZE 64
#define MIN_GET_BITS (BIT_BUF_SIZE - 7)
#define BUFSIZE (DCTSIZE2 * 8)

typedef uint64_t bit_buf_type;

/* jutils.c's jpeg_natural_order: the natural-order position of the i'th zigzag coefficient, with
 * 16 extra entries so that a corrupt run past the block's end lands on its last coefficient. */
static const int natural_order[DCTSIZE2 + 16] = {
  0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33,
  40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36,
  29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54,
  47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

/* A combined entry: bits 0-3 the bits taken (code and magnitude), bits 8-11 the run of zeros
 * before the coefficient, bit 12 end of block, bits 16-31 the coefficient (a DC difference in a
 * DC table). 0: not resolved here. */
#define FAST_TOTAL(e) ((e) & 15)
#define FAST_RUN(e) (((e) >> 8) & 15)
#define FAST_END_OF_BLOCK 0x1000
#define FAST_VALUE(e) ((e) >> 16)

/* An AC table's entry: one coefficient, or two (then the second is stored first, at
 * k + run + advance, and the first over it where advance is 0), the end of the block after
 * them or alone. Bits 0-3 the bits taken, 4-7 the zero run before the first coefficient, 8-11
 * the advance to the second (0: none; 1 + its zero run), bit 12 the block ends, bits 13-20 the
 * second value (signed), 21-31 the first (signed; 0 for a lone end of block or a run of 16
 * zeros, stored where a zero is anyway). 0: not resolved here. The coefficient of an end of
 * block paired after a coefficient is a 0 stored right after it. */
#define AC_TOTAL(e) ((e) & 15)
#define AC_RUN(e) (((e) >> 4) & 15)
#define AC_ADVANCE(e) (((e) >> 8) & 15)
#define AC_END_OF_BLOCK 0x1000
#define AC_VALUE2(e) ((int32_t)((uint32_t)(e) << 11) >> 24)
#define AC_VALUE1(e) ((e) >> 21)
#define AC_ENTRY(total, run, advance, value1, value2)                                       \
  ((int32_t)(((uint32_t)(value1) << 21) | (((uint32_t)(value2) & 0xFF) << 13) |            \
             ((uint32_t)(advance) << 8) | ((uint32_t)(run) << 4) | (uint32_t)(total)))

typedef struct {
  int32_t maxcode[18];   /* largest code of length k (-1 if none); [17] a sentinel */
  int32_t valoffset[18]; /* huffval[] index of the first symbol of length k, less its code */
  UINT8 huffval[256];    /* the table's symbols (a copy: the table outlives the image here) */
  int lookup[1 << HUFF_LOOKAHEAD]; /* (length << 8) | symbol, length 9: too long */
  int32_t fast[1 << GF_AC_BITS]; /* a DC table's (GF_FAST_BITS), an AC table's (GF_AC_BITS) */
} gf_derived_tbl;

/* Derived tables kept from image to image: most files of a folder share their Huffman tables
 * (an encoder's standard ones), and an AC table's lookup costs about 4% of a decode to build.
 * Eight: the most one scan uses (four components, a DC and an AC table each). */
#define GF_CACHED_TABLES 8

typedef struct {
  int used;              /* holds a table */
  int is_dc;
  UINT8 bits[17];        /* the table it was made from: its code counts (its symbols: tbl's) */
  unsigned long stamp;   /* the install that last used it (0: none) */
  gf_derived_tbl tbl;
} gf_cached_tbl;

struct gf_huffman_cache {
  unsigned long clock; /* installs so far */
  gf_cached_tbl slots[GF_CACHED_TABLES];
};

gf_huffman_cache *gf_huffman_cache_new(void) {
  return (gf_huffman_cache *)calloc(1, sizeof(gf_huffman_cache));
}

void gf_huffman_cache_free(gf_huffman_cache *cache) { free(cache); }

typedef struct {
  struct jpeg_entropy_decoder pub; /* must come first: the library reads it */
  bit_buf_type get_buffer;         /* the bit buffer at the start of the MCU */
  int bits_left;
  int last_dc_val[MAX_COMPS_IN_SCAN];
  unsigned int restarts_to_go;
  gf_derived_tbl *dc_derived[NUM_HUFF_TBLS];
  gf_derived_tbl *ac_derived[NUM_HUFF_TBLS];
  gf_derived_tbl *dc_cur[D_MAX_BLOCKS_IN_MCU];
  gf_derived_tbl *ac_cur[D_MAX_BLOCKS_IN_MCU];
  boolean dc_needed[D_MAX_BLOCKS_IN_MCU];
  boolean ac_needed[D_MAX_BLOCKS_IN_MCU];
} gf_entropy;

/* The working state of the slow path (jdhuff.h bitread_working_state). */
typedef struct {
  const JOCTET *next_input_byte;
  size_t bytes_in_buffer;
  bit_buf_type get_buffer;
  int bits_left;
  j_decompress_ptr cinfo;
} working_state;

/* An AC table's lookup (GF_AC_BITS bits, see AC_ENTRY): first each symbol whose code and
 * magnitude bits fit (values of 10 bits at most), then, where one leaves room, the symbol after
 * it: looked up in the same entries with its bits shifted to the top, taken when all its bits
 * lie within the index (the padding zeros unread) and its value fits 8 bits. */
static void make_ac_fast(const JHUFF_TBL *htbl, const unsigned int *huffcode, int32_t *fast) {
  int32_t single[1 << GF_AC_BITS];
  int p = 0, l, i, ctr;

  memset(single, 0, sizeof(single));
  for (l = 1; l <= 16; l++) {
    for (i = 1; i <= (int)htbl->bits[l]; i++, p++) {
      int symbol = htbl->huffval[p], run = symbol >> 4, size = symbol & 15;
      int end_of_block = symbol == 0, zeros = symbol == 0xF0;
      int lookbits = (int)huffcode[p] << (GF_AC_BITS - l);
      /* Sizes 0 with runs of 1 to 14 (ends of block to the library) stay on the slow path. */
      if ((size == 0 && !end_of_block && !zeros) || size > 10 || l + size > GF_AC_BITS) continue;
      for (ctr = 0; ctr < (1 << (GF_AC_BITS - l)); ctr++) {
        int32_t value = 0;
        if (size > 0) {
          int bits = (ctr >> (GF_AC_BITS - l - size)) & ((1 << size) - 1);
          value = bits < (1 << (size - 1)) ? bits - (1 << size) + 1 : bits;
        }
        single[lookbits + ctr] = AC_ENTRY(l + size, run, 0, value, 0) |
                                 (end_of_block ? AC_END_OF_BLOCK : 0);
      }
    }
  }
  for (i = 0; i < (1 << GF_AC_BITS); i++) {
    int32_t first = single[i], second;
    int taken = AC_TOTAL(first), total;
    fast[i] = first;
    if (first == 0 || (first & AC_END_OF_BLOCK) || taken >= GF_AC_BITS) continue;
    second = single[(i << taken) & ((1 << GF_AC_BITS) - 1)];
    total = taken + AC_TOTAL(second);
    if (second == 0 || total > GF_AC_BITS) continue;
    if (second & AC_END_OF_BLOCK)
      fast[i] = AC_ENTRY(total, AC_RUN(first), 1, AC_VALUE1(first), 0) | AC_END_OF_BLOCK;
    else if (AC_VALUE1(second) != 0 && AC_VALUE1(second) >= -128 && AC_VALUE1(second) <= 127 &&
             AC_RUN(second) < 15)
      fast[i] = AC_ENTRY(total, AC_RUN(first), 1 + AC_RUN(second), AC_VALUE1(first),
                         AC_VALUE1(second));
  }
}

/* jdhuff.c jpeg_make_d_derived_tbl, plus the combined table; 0 when the table is malformed (the
 * library, which built its own from the same table first, would have stopped). */
static int make_derived(const JHUFF_TBL *htbl, int is_dc, gf_derived_tbl *dtbl) {
  int p, i, l, si, numsymbols, lookbits, ctr;
  char huffsize[257];
  unsigned int huffcode[257];
  unsigned int code;

  memcpy(dtbl->huffval, htbl->huffval, sizeof(dtbl->huffval));

  p = 0;
  for (l = 1; l <= 16; l++) {
    i = (int)htbl->bits[l];
    if (i < 0 || p + i > 256) return 0;
    while (i--) huffsize[p++] = (char)l;
  }
  huffsize[p] = 0;
  numsymbols = p;

  code = 0;
  si = huffsize[0];
  p = 0;
  while (huffsize[p]) {
    while (((int)huffsize[p]) == si) {
      huffcode[p++] = code;
      code++;
    }
    if (((int64_t)code) >= (((int64_t)1) << si)) return 0;
    code <<= 1;
    si++;
  }

  p = 0;
  for (l = 1; l <= 16; l++) {
    if (htbl->bits[l]) {
      dtbl->valoffset[l] = (int32_t)p - (int32_t)huffcode[p];
      p += htbl->bits[l];
      dtbl->maxcode[l] = (int32_t)huffcode[p - 1];
    } else {
      dtbl->maxcode[l] = -1;
    }
  }
  dtbl->valoffset[17] = 0;
  dtbl->maxcode[17] = 0xFFFFF;

  for (i = 0; i < (1 << HUFF_LOOKAHEAD); i++) dtbl->lookup[i] = (HUFF_LOOKAHEAD + 1) << 8;
  if (is_dc)
    for (i = 0; i < (1 << GF_FAST_BITS); i++) dtbl->fast[i] = 0;
  else
    make_ac_fast(htbl, huffcode, dtbl->fast);
  p = 0;
  for (l = 1; l <= GF_FAST_BITS; l++) {
    for (i = 1; i <= (int)htbl->bits[l]; i++, p++) {
      int symbol = htbl->huffval[p];
      int run = is_dc ? 0 : symbol >> 4;
      int size = is_dc ? symbol : symbol & 15;
      int end_of_block = !is_dc && symbol == 0;
      if (l <= HUFF_LOOKAHEAD) {
        lookbits = (int)huffcode[p] << (HUFF_LOOKAHEAD - l);
        for (ctr = 1 << (HUFF_LOOKAHEAD - l); ctr > 0; ctr--)
          dtbl->lookup[lookbits++] = (l << HUFF_LOOKAHEAD) | symbol;
      }
      /* DC sizes past 15 (refused below) stay on the slow path. */
      if (!is_dc || size > 15 || l + size > GF_FAST_BITS) continue;
      lookbits = (int)huffcode[p] << (GF_FAST_BITS - l);
      for (ctr = 0; ctr < (1 << (GF_FAST_BITS - l)); ctr++) {
        int32_t value = 0, entry;
        if (size > 0) {
          int bits = (ctr >> (GF_FAST_BITS - l - size)) & ((1 << size) - 1);
          value = bits < (1 << (size - 1)) ? bits - (1 << size) + 1 : bits;
        }
        entry = (int32_t)((uint32_t)value << 16) | (run << 8) | (l + size);
        if (end_of_block) entry = FAST_END_OF_BLOCK | l;
        dtbl->fast[lookbits + ctr] = entry;
      }
    }
  }

  if (is_dc) {
    for (i = 0; i < numsymbols; i++) {
      int sym = htbl->huffval[i];
      if (sym < 0 || sym > 15) return 0;
    }
  }
  return 1;
}

/* The derived table of the image's DC or AC table `tblno`: the cache's where it holds one made
 * from the same code counts and symbols, else made anew in the slot used least recently (never
 * one this install took: no scan uses more tables than there are slots). NULL when the table is
 * missing or malformed. */
static gf_derived_tbl *derived_table(j_decompress_ptr cinfo, gf_huffman_cache *cache, int is_dc,
                                     int tblno) {
  const JHUFF_TBL *htbl;
  gf_cached_tbl *slot = &cache->slots[0];
  int i, count = 0;

  if (tblno < 0 || tblno >= NUM_HUFF_TBLS) return NULL;
  htbl = is_dc ? cinfo->dc_huff_tbl_ptrs[tblno] : cinfo->ac_huff_tbl_ptrs[tblno];
  if (htbl == NULL) return NULL;
  for (i = 1; i <= 16; i++) count += htbl->bits[i];
  if (count > 256) return NULL;
  for (i = 0; i < GF_CACHED_TABLES; i++) {
    gf_cached_tbl *cached = &cache->slots[i];
    if (cached->used && cached->is_dc == is_dc &&
        memcmp(cached->bits, htbl->bits, sizeof(cached->bits)) == 0 &&
        memcmp(cached->tbl.huffval, htbl->huffval, (size_t)count) == 0) {
      cached->stamp = cache->clock;
      return &cached->tbl;
    }
    if (cached->stamp < slot->stamp) slot = cached;
  }
  slot->used = 0;
  if (!make_derived(htbl, is_dc, &slot->tbl)) return NULL;
  slot->used = 1;
  slot->is_dc = is_dc;
  memcpy(slot->bits, htbl->bits, sizeof(slot->bits));
  slot->stamp = cache->clock;
  return &slot->tbl;
}

/* jdhuff.c jpeg_fill_bit_buffer. */
static boolean fill_bit_buffer(working_state *state, bit_buf_type get_buffer, int bits_left,
                               int nbits) {
  const JOCTET *next_input_byte = state->next_input_byte;
  size_t bytes_in_buffer = state->bytes_in_buffer;
  j_decompress_ptr cinfo = state->cinfo;

  if (cinfo->unread_marker == 0) {
    while (bits_left < MIN_GET_BITS) {
      int c;
      if (bytes_in_buffer == 0) {
        if (!(*cinfo->src->fill_input_buffer)(cinfo)) return FALSE;
        next_input_byte = cinfo->src->next_input_byte;
        bytes_in_buffer = cinfo->src->bytes_in_buffer;
      }
      bytes_in_buffer--;
      c = *next_input_byte++;
      if (c == 0xFF) {
        do {
          if (bytes_in_buffer == 0) {
            if (!(*cinfo->src->fill_input_buffer)(cinfo)) return FALSE;
            next_input_byte = cinfo->src->next_input_byte;
            bytes_in_buffer = cinfo->src->bytes_in_buffer;
          }
          bytes_in_buffer--;
          c = *next_input_byte++;
        } while (c == 0xFF);
        if (c == 0) {
          c = 0xFF;
        } else {
          cinfo->unread_marker = c;
          goto no_more_bytes;
        }
      }
      get_buffer = (get_buffer << 8) | (bit_buf_type)c;
      bits_left += 8;
    }
  } else {
  no_more_bytes:
    if (nbits > bits_left) {
      if (!cinfo->entropy->insufficient_data) {
        WARNMS(cinfo, JWRN_HIT_MARKER);
        cinfo->entropy->insufficient_data = TRUE;
      }
      get_buffer <<= MIN_GET_BITS - bits_left;
      bits_left = MIN_GET_BITS;
    }
  }

  state->next_input_byte = next_input_byte;
  state->bytes_in_buffer = bytes_in_buffer;
  state->get_buffer = get_buffer;
  state->bits_left = bits_left;
  return TRUE;
}

#define GET_BITS(nbits) (((int)(get_buffer >> (bits_left -= (nbits)))) & ((1 << (nbits)) - 1))
#define PEEK_BITS(nbits) (((int)(get_buffer >> (bits_left - (nbits)))) & ((1 << (nbits)) - 1))
#define DROP_BITS(nbits) (bits_left -= (nbits))

/* Figure F.12: extend the sign bit (the library's shift-and-add form). */
#define HUFF_EXTEND(x, s) \
  ((int)((unsigned int)(x) + \
         ((unsigned int)(((x) - (1 << ((s) - 1))) >> 31) & ((~0u << (s)) + 1))))

#define CHECK_BIT_BUFFER(state, nbits, action)                             \
  {                                                                        \
    if (bits_left < (nbits)) {                                             \
      if (!fill_bit_buffer(&(state), get_buffer, bits_left, nbits)) {     \
        action;                                                            \
      }                                                                    \
      get_buffer = (state).get_buffer;                                     \
      bits_left = (state).bits_left;                                       \
    }                                                                      \
  }

/* jdhuff.c jpeg_huff_decode: a code of at least min_bits bits, one bit at a time. */
static int huff_decode(working_state *state, bit_buf_type get_buffer, int bits_left,
                       const gf_derived_tbl *htbl, int min_bits) {
  int l = min_bits;
  int32_t code;

  CHECK_BIT_BUFFER(*state, l, return -1);
  code = GET_BITS(l);
  while (code > htbl->maxcode[l]) {
    code <<= 1;
    CHECK_BIT_BUFFER(*state, 1, return -1);
    code |= GET_BITS(1);
    l++;
  }
  state->get_buffer = get_buffer;
  state->bits_left = bits_left;
  if (l > 16) {
    WARNMS(state->cinfo, JWRN_HUFF_BAD_CODE);
    return 0;
  }
  return htbl->huffval[(int)(code + htbl->valoffset[l])];
}

#define HUFF_DECODE(result, state, htbl, failaction, slowlabel)                  \
  {                                                                              \
    int nb, look;                                                                \
    if (bits_left < HUFF_LOOKAHEAD) {                                            \
      if (!fill_bit_buffer(&state, get_buffer, bits_left, 0)) {                  \
        failaction;                                                              \
      }                                                                          \
      get_buffer = state.get_buffer;                                             \
      bits_left = state.bits_left;                                               \
      if (bits_left < HUFF_LOOKAHEAD) {                                          \
        nb = 1;                                                                  \
        goto slowlabel;                                                          \
      }                                                                          \
    }                                                                            \
    look = PEEK_BITS(HUFF_LOOKAHEAD);                                            \
    if ((nb = (htbl->lookup[look] >> HUFF_LOOKAHEAD)) <= HUFF_LOOKAHEAD) {       \
      DROP_BITS(nb);                                                             \
      result = htbl->lookup[look] & ((1 << HUFF_LOOKAHEAD) - 1);                 \
    } else {                                                                     \
    slowlabel:                                                                   \
      if ((result = huff_decode(&state, get_buffer, bits_left, htbl, nb)) < 0) { \
        failaction;                                                              \
      }                                                                          \
      get_buffer = state.get_buffer;                                             \
      bits_left = state.bits_left;                                               \
    }                                                                            \
  }

/* jdhuff.c process_restart. */
static boolean process_restart(j_decompress_ptr cinfo) {
  gf_entropy *entropy = (gf_entropy *)cinfo->entropy;
  int ci;

  cinfo->marker->discarded_bytes += (unsigned int)(entropy->bits_left / 8);
  entropy->bits_left = 0;
  if (!(*cinfo->marker->read_restart_marker)(cinfo)) return FALSE;
  for (ci = 0; ci < cinfo->comps_in_scan; ci++) entropy->last_dc_val[ci] = 0;
  entropy->restarts_to_go = cinfo->restart_interval;
  if (cinfo->unread_marker == 0) entropy->pub.insufficient_data = FALSE;
  return TRUE;
}

/* A block's DC coefficient: its difference `diff` added to the component's last (wrapping, as
 * the library's does on malformed files), written to the block when there is one. */
static inline void add_dc(j_decompress_ptr cinfo, int blkn, int diff, int *last_dc_val,
                          JBLOCKROW block) {
  int ci = cinfo->MCU_membership[blkn];
  int dc = (int)((unsigned int)diff + (unsigned int)last_dc_val[ci]);
  last_dc_val[ci] = dc;
  if (block) (*block)[0] = (JCOEF)dc;
}

/* jdhuff.c decode_mcu_slow: markers, the end of the data, suspension. */
static boolean decode_mcu_slow(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
  gf_entropy *entropy = (gf_entropy *)cinfo->entropy;
  bit_buf_type get_buffer = entropy->get_buffer;
  int bits_left = entropy->bits_left;
  working_state br_state;
  int last_dc_val[MAX_COMPS_IN_SCAN];
  int blkn;

  br_state.cinfo = cinfo;
  br_state.next_input_byte = cinfo->src->next_input_byte;
  br_state.bytes_in_buffer = cinfo->src->bytes_in_buffer;
  memcpy(last_dc_val, entropy->last_dc_val, sizeof(last_dc_val));

  for (blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++) {
    JBLOCKROW block = MCU_data ? MCU_data[blkn] : NULL;
    const gf_derived_tbl *dctbl = entropy->dc_cur[blkn];
    const gf_derived_tbl *actbl = entropy->ac_cur[blkn];
    int s, k, r;

    HUFF_DECODE(s, br_state, dctbl, return FALSE, label1);
    if (s) {
      CHECK_BIT_BUFFER(br_state, s, return FALSE);
      r = GET_BITS(s);
      s = HUFF_EXTEND(r, s);
    }
    if (entropy->dc_needed[blkn]) add_dc(cinfo, blkn, s, last_dc_val, block);

    if (entropy->ac_needed[blkn] && block) {
      for (k = 1; k < DCTSIZE2; k++) {
        HUFF_DECODE(s, br_state, actbl, return FALSE, label2);
        r = s >> 4;
        s &= 15;
        if (s) {
          k += r;
          CHECK_BIT_BUFFER(br_state, s, return FALSE);
          r = GET_BITS(s);
          s = HUFF_EXTEND(r, s);
          (*block)[natural_order[k]] = (JCOEF)s;
        } else {
          if (r != 15) break;
          k += 15;
        }
      }
    } else {
      for (k = 1; k < DCTSIZE2; k++) {
        HUFF_DECODE(s, br_state, actbl, return FALSE, label3);
        r = s >> 4;
        s &= 15;
        if (s) {
          k += r;
          CHECK_BIT_BUFFER(br_state, s, return FALSE);
          DROP_BITS(s);
        } else {
          if (r != 15) break;
          k += 15;
        }
      }
    }
  }

  cinfo->src->next_input_byte = br_state.next_input_byte;
  cinfo->src->bytes_in_buffer = br_state.bytes_in_buffer;
  entropy->get_buffer = get_buffer;
  entropy->bits_left = bits_left;
  memcpy(entropy->last_dc_val, last_dc_val, sizeof(last_dc_val));
  return TRUE;
}

/* The fast path's byte: an FF/00 pair is one 0xFF data byte; at a marker the byte is taken back
 * and zero bits go in instead, and the MCU is decoded again on the slow path (jdhuff.c). */
#define GET_BYTE                            \
  {                                         \
    int c0, c1;                             \
    c0 = *buffer++;                         \
    c1 = *buffer;                           \
    get_buffer = (get_buffer << 8) | c0;    \
    bits_left += 8;                         \
    if (c0 == 0xFF) {                       \
      buffer++;                             \
      if (c1 != 0) {                        \
        cinfo->unread_marker = c1;          \
        buffer -= 2;                        \
        get_buffer &= ~(bit_buf_type)0xFF;  \
      }                                     \
    }                                       \
  }

/* Six bytes into the buffer when it holds 16 bits or fewer, as the library's fast path; when
 * none of the six is 0xFF, in one load. The fast path runs only with 512 bytes or more a block
 * left in the source, so the eight bytes loaded are the data's. */
#define FILL_BIT_BUFFER_FAST                                                       \
  if (bits_left <= 16) {                                                           \
    uint64_t word, inverse;                                                        \
    memcpy(&word, buffer, 8);                                                      \
    inverse = ~word;                                                               \
    if (((inverse - 0x0101010101010101ULL) & ~inverse & 0x0000808080808080ULL) == 0) { \
      get_buffer = (get_buffer << 48) | (__builtin_bswap64(word) >> 16);           \
      bits_left += 48;                                                             \
      buffer += 6;                                                                 \
    } else {                                                                       \
      GET_BYTE GET_BYTE GET_BYTE GET_BYTE GET_BYTE GET_BYTE                        \
    }                                                                              \
  }

/* The library's HUFF_DECODE_FAST: a code through the 8-bit lookup, a longer one bit by bit. */
#define HUFF_DECODE_FAST(s, nb, htbl)                                         \
  FILL_BIT_BUFFER_FAST;                                                       \
  s = PEEK_BITS(HUFF_LOOKAHEAD);                                              \
  s = htbl->lookup[s];                                                        \
  nb = s >> HUFF_LOOKAHEAD;                                                   \
  DROP_BITS(nb);                                                              \
  s = s & ((1 << HUFF_LOOKAHEAD) - 1);                                        \
  if (nb > HUFF_LOOKAHEAD) {                                                  \
    s = (int)((get_buffer >> bits_left) & ((1 << (nb)) - 1));                 \
    while (s > htbl->maxcode[nb]) {                                           \
      s <<= 1;                                                                \
      s |= GET_BITS(1);                                                       \
      nb++;                                                                   \
    }                                                                         \
    if (nb > 16)                                                              \
      s = 0;                                                                  \
    else                                                                      \
      s = htbl->huffval[(int)(s + htbl->valoffset[nb]) & 0xFF];               \
  }

/* jdhuff.c decode_mcu_fast, with the combined lookup first. FALSE: a marker was met, and the MCU
 * is to be decoded again on the slow path from the state it started from. */
static boolean decode_mcu_fast(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
  gf_entropy *entropy = (gf_entropy *)cinfo->entropy;
  bit_buf_type get_buffer = entropy->get_buffer;
  int bits_left = entropy->bits_left;
  const JOCTET *buffer = cinfo->src->next_input_byte;
  int last_dc_val[MAX_COMPS_IN_SCAN];
  int blkn;

  memcpy(last_dc_val, entropy->last_dc_val, sizeof(last_dc_val));

  for (blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++) {
    JBLOCKROW block = MCU_data ? MCU_data[blkn] : NULL;
    const gf_derived_tbl *dctbl = entropy->dc_cur[blkn];
    const gf_derived_tbl *actbl = entropy->ac_cur[blkn];
    int s, k, r, l, entry;

    FILL_BIT_BUFFER_FAST
    entry = dctbl->fast[PEEK_BITS(GF_FAST_BITS)];
    if (entry) {
      DROP_BITS(FAST_TOTAL(entry));
      s = FAST_VALUE(entry);
    } else {
      HUFF_DECODE_FAST(s, l, dctbl);
      if (s) {
        FILL_BIT_BUFFER_FAST
        r = GET_BITS(s);
        s = HUFF_EXTEND(r, s);
      }
    }

    if (entropy->dc_needed[blkn]) add_dc(cinfo, blkn, s, last_dc_val, block);

    if (entropy->ac_needed[blkn] && block) {
      for (k = 1; k < DCTSIZE2; k++) {
        FILL_BIT_BUFFER_FAST
        entry = actbl->fast[PEEK_BITS(GF_AC_BITS)];
        if (entry) {
          int first = k + AC_RUN(entry), second = first + AC_ADVANCE(entry);
          /* Past the block's end: the next block's bits, or damage: the library's way below. */
          if (second < DCTSIZE2) {
            DROP_BITS(AC_TOTAL(entry));
            (*block)[natural_order[second]] = (JCOEF)AC_VALUE2(entry);
            (*block)[natural_order[first]] = (JCOEF)AC_VALUE1(entry);
            k = second;
            if (entry & AC_END_OF_BLOCK) break;
            continue;
          }
        }
        HUFF_DECODE_FAST(s, l, actbl);
        r = s >> 4;
        s &= 15;
        if (s) {
          k += r;
          FILL_BIT_BUFFER_FAST
          r = GET_BITS(s);
          s = HUFF_EXTEND(r, s);
          (*block)[natural_order[k]] = (JCOEF)s;
        } else {
          if (r != 15) break;
          k += 15;
        }
      }
    } else {
      for (k = 1; k < DCTSIZE2; k++) {
        FILL_BIT_BUFFER_FAST
        entry = actbl->fast[PEEK_BITS(GF_AC_BITS)];
        if (entry) {
          int second = k + AC_RUN(entry) + AC_ADVANCE(entry);
          if (second < DCTSIZE2) {
            DROP_BITS(AC_TOTAL(entry));
            k = second;
            if (entry & AC_END_OF_BLOCK) break;
            continue;
          }
        }
        HUFF_DECODE_FAST(s, l, actbl);
        r = s >> 4;
        s &= 15;
        if (s) {
          k += r;
          FILL_BIT_BUFFER_FAST
          DROP_BITS(s);
        } else {
          if (r != 15) break;
          k += 15;
        }
      }
    }
  }

  if (cinfo->unread_marker != 0) {
    cinfo->unread_marker = 0;
    return FALSE;
  }

  cinfo->src->bytes_in_buffer -= (size_t)(buffer - cinfo->src->next_input_byte);
  cinfo->src->next_input_byte = buffer;
  entropy->get_buffer = get_buffer;
  entropy->bits_left = bits_left;
  memcpy(entropy->last_dc_val, last_dc_val, sizeof(last_dc_val));
  return TRUE;
}

/* jdhuff.c decode_mcu, with one more kind of file on the fast path: one with restart markers
 * (most cameras write them), which the library decodes on its slow path throughout. The fast
 * path never reads past a marker: it takes the marker's bytes back and the MCU is decoded again
 * on the slow path, so restart markers are met and read as on the slow path. What a failed fast
 * attempt leaves behind is the one difference: it decodes on through zero bits and writes their
 * coefficients, and the slow path only writes the coefficients it decodes. In a file without
 * restart markers the library's own fast path does the same, and so the blocks keep what it
 * wrote; in a file with them, where the library never takes the fast path, the blocks are zeroed
 * again first (a damaged interval with a stray "FF FF 00" decodes otherwise). The last MCU of
 * each interval stays on the slow path: the fast path's read-ahead would meet the marker there
 * and the MCU be decoded twice. */
static boolean decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
  gf_entropy *entropy = (gf_entropy *)cinfo->entropy;
  int usefast = 1;
  int blkn;

  if (cinfo->restart_interval && entropy->restarts_to_go == 0)
    if (!process_restart(cinfo)) return FALSE;
  if (cinfo->src->bytes_in_buffer < BUFSIZE * (size_t)cinfo->blocks_in_MCU ||
      cinfo->unread_marker != 0 || (cinfo->restart_interval && entropy->restarts_to_go == 1))
    usefast = 0;

  if (!entropy->pub.insufficient_data) {
    if (usefast) {
      if (!decode_mcu_fast(cinfo, MCU_data)) {
        if (cinfo->restart_interval && MCU_data)
          for (blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++)
            memset(MCU_data[blkn], 0, sizeof(JBLOCK));
        goto use_slow;
      }
    } else {
    use_slow:
      if (!decode_mcu_slow(cinfo, MCU_data)) return FALSE;
    }
  }

  if (cinfo->restart_interval) entropy->restarts_to_go--;
  return TRUE;
}

/* A later scan's start: never called for the single-scan images this decoder takes. */
static void start_pass(j_decompress_ptr cinfo) {
  ERREXIT(cinfo, JERR_NOT_COMPILED);
}

int gf_huffman_install(j_decompress_ptr cinfo, gf_huffman_cache *cache) {
  gf_entropy *entropy;
  int ci, blkn;

  /* One sequential Huffman scan holding every component, 8-bit, and no MCU decoded yet: the
   * state the library's decoder is in right after jpeg_start_decompress. */
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
      cinfo->inputctl == NULL || cinfo->inputctl->has_multiple_scans || cinfo->Ss != 0 ||
      cinfo->Se != DCTSIZE2 - 1 || cinfo->Ah != 0 || cinfo->Al != 0 ||
      cinfo->comps_in_scan != cinfo->num_components || cinfo->comps_in_scan > MAX_COMPS_IN_SCAN ||
      cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || cinfo->output_scanline != 0 ||
      cinfo->input_iMCU_row != 0 || cinfo->entropy == NULL ||
      cinfo->entropy->insufficient_data || cache == NULL)
    return 0;

  entropy = (gf_entropy *)(*cinfo->mem->alloc_small)((j_common_ptr)cinfo, JPOOL_IMAGE,
                                                     sizeof(gf_entropy));
  memset(entropy, 0, sizeof(*entropy));
  cache->clock++;
  for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
    jpeg_component_info *compptr = cinfo->cur_comp_info[ci];
    int dc = compptr->dc_tbl_no, ac = compptr->ac_tbl_no;
    if (dc < 0 || dc >= NUM_HUFF_TBLS || ac < 0 || ac >= NUM_HUFF_TBLS) return 0;
    entropy->dc_derived[dc] = derived_table(cinfo, cache, 1, dc);
    entropy->ac_derived[ac] = derived_table(cinfo, cache, 0, ac);
    if (entropy->dc_derived[dc] == NULL || entropy->ac_derived[ac] == NULL) return 0;
  }
  for (blkn = 0; blkn < cinfo->blocks_in_MCU; blkn++) {
    jpeg_component_info *compptr = cinfo->cur_comp_info[cinfo->MCU_membership[blkn]];
    entropy->dc_cur[blkn] = entropy->dc_derived[compptr->dc_tbl_no];
    entropy->ac_cur[blkn] = entropy->ac_derived[compptr->ac_tbl_no];
    if (compptr->component_needed) {
      entropy->dc_needed[blkn] = TRUE;
      entropy->ac_needed[blkn] = (compptr->DCT_scaled_size > 1);
    } else {
      entropy->dc_needed[blkn] = entropy->ac_needed[blkn] = FALSE;
    }
  }
  entropy->restarts_to_go = cinfo->restart_interval;
  entropy->pub.start_pass = start_pass;
  entropy->pub.decode_mcu = decode_mcu;
  entropy->pub.decode_mcus = NULL;
  entropy->pub.process_restart = process_restart;
  entropy->pub.insufficient_data = FALSE;
  cinfo->entropy = &entropy->pub;
  return 1;
}
