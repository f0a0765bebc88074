/*
 * The libjpeg API calls of turbojpeg-region that TurboJPEG 3 does not offer: decoding to pixels
 * with the faster Huffman decoder of huffman.c (the steps of TurboJPEG's tj3Decompress8
 * otherwise), reading a JPEG's DCT coefficients (jpeg_read_coefficients), optionally stopping
 * after the iMCU rows a caller needs, and writing JPEGs with any sampling factors (for tests and
 * benchmarks).
 *
 * libjpeg reports a fatal error by calling error_exit, which must not return. Here it longjmps
 * back to the setjmp of the gf_* function that called into libjpeg: every such function sets its
 * jump point first, and libjpeg never calls back into Rust, so a longjmp only ever crosses C
 * frames of libjpeg and of this file. Rust sees a status code and a message.
 */

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jpeglib.h"
#include "jerror.h"

#include "huffman.h"

/* Status codes, mirrored in src/ffi.rs. */
#define GF_OK 0
#define GF_ERROR 1        /* libjpeg refused the data: message() says why */
#define GF_UNSUPPORTED 2  /* a JPEG this reader does not take: message() says why */
#define GF_SCAN_LIMIT 3   /* a progressive JPEG with more scans than the limit */
#define GF_BAD_CALL 4     /* a call out of order or with bad arguments */

#define GF_MAX_COMPONENTS 4

/* One component of the image, as libjpeg's jpeg_component_info has it after the headers. */
typedef struct gf_component {
  int32_t id;
  int32_t h_samp;
  int32_t v_samp;
  int32_t quant_tbl_no;
  uint32_t blocks_wide;        /* width_in_blocks: blocks holding the component's samples */
  uint32_t blocks_high;        /* height_in_blocks */
  uint32_t padded_blocks_wide; /* the coefficient array's width: blocks_wide up to h_samp */
  uint32_t padded_blocks_high; /* its height: blocks_high up to v_samp */
  uint32_t samples_wide;       /* downsampled_width */
  uint32_t samples_high;       /* downsampled_height */
} gf_component;

typedef struct gf_header {
  uint32_t width;
  uint32_t height;
  int32_t num_components;
  int32_t color_space;     /* J_COLOR_SPACE as libjpeg guessed it */
  int32_t data_precision;
  int32_t progressive;
  int32_t arithmetic;
  int32_t restart_interval;
  int32_t saw_jfif;
  int32_t saw_adobe;
  int32_t adobe_transform;
  int32_t ccir601;
  int32_t max_h_samp;
  int32_t max_v_samp;
  uint32_t imcu_rows;       /* total_iMCU_rows */
  int32_t single_scan;      /* one scan holding every component: may stop early */
  gf_component comp[GF_MAX_COMPONENTS];
} gf_header;

typedef struct gf_coefficients {
  uint32_t imcu_rows_read;  /* iMCU rows holding the file's data */
  int32_t stopped_early;    /* the rows below imcu_rows_read were not decoded */
  int32_t block_smoothing;  /* libjpeg's decoder would smooth the blocks (jdcoefct.c) */
  int32_t warnings;         /* libjpeg's warnings about the data (before any early stop) */
  uint16_t quant[GF_MAX_COMPONENTS][DCTSIZE2]; /* each component's table, natural order */
} gf_coefficients;

typedef struct gf_reader {
  struct jpeg_decompress_struct cinfo;
  struct jpeg_error_mgr err;
  struct jpeg_progress_mgr progress;
  jmp_buf jump;
  int open;                       /* cinfo holds an image's state */
  jvirt_barray_ptr *arrays;       /* the coefficients after gf_read_coefficients */
  uint32_t stop_rows;             /* iMCU rows wanted; 0: all */
  int stopped_early;
  int scan_limit;                 /* 0: none */
  int warnings;
  int premature_end;              /* the data ended before the image (JWRN_JPEG_EOF) */
  char message[JMSG_LENGTH_MAX];  /* the last error, or the first warning */
  gf_huffman_cache *huffman;      /* the faster decoder's tables, made at its first image */
} gf_reader;

static void gf_error_exit(j_common_ptr cinfo) {
  gf_reader *r = (gf_reader *)cinfo->client_data;
  (*cinfo->err->format_message)(cinfo, r->message);
  longjmp(r->jump, GF_ERROR);
}

/* Warnings (msg_level -1) are counted and the first kept; trace messages are dropped. A warning
 * after an early stop comes from the stop itself (the data seems to end) and is not counted. */
static void gf_emit_message(j_common_ptr cinfo, int msg_level) {
  gf_reader *r = (gf_reader *)cinfo->client_data;
  if (msg_level >= 0 || r->stopped_early) return;
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) r->premature_end = 1;
  if (r->warnings == 0) (*cinfo->err->format_message)(cinfo, r->message);
  r->warnings++;
  cinfo->err->num_warnings++;
}

/* Called by jpeg_read_coefficients before each call of the input controller, that is between
 * iMCU rows of a single-scan file (jdtrans.c). Enforces the scan limit, and stops a single-scan
 * Huffman file once the rows wanted are in: the source is emptied, so that the entropy decoder
 * meets the end of the data at its next MCU (jdatasrc.c inserts an EOI marker), marks its data
 * insufficient and leaves every later MCU zero without decoding it (jdhuff.c decode_mcu). The
 * rows above stay as decoded. */
static void gf_progress(j_common_ptr common) {
  j_decompress_ptr cinfo = (j_decompress_ptr)common;
  gf_reader *r = (gf_reader *)common->client_data;
  if (r->scan_limit > 0 && cinfo->input_scan_number > r->scan_limit) {
    snprintf(r->message, sizeof(r->message), "more than %d scans", r->scan_limit);
    longjmp(r->jump, GF_SCAN_LIMIT);
  }
  if (r->stop_rows > 0 && !r->stopped_early && !cinfo->progressive_mode &&
      !cinfo->arith_code && cinfo->comps_in_scan == cinfo->num_components &&
      cinfo->input_iMCU_row >= r->stop_rows &&
      cinfo->input_iMCU_row < cinfo->total_iMCU_rows) {
    cinfo->src->bytes_in_buffer = 0;
    r->stopped_early = 1;
  }
}

static void gf_close(gf_reader *r) {
  if (r->open) jpeg_abort_decompress(&r->cinfo);
  r->open = 0;
  r->arrays = NULL;
  r->stopped_early = 0;
  r->stop_rows = 0;
  r->warnings = 0;
  r->premature_end = 0;
}

/* Forgets the image after a failure (its message already written) and returns `status`. */
static int gf_stop(gf_reader *r, int status) {
  gf_close(r);
  return status;
}

gf_reader *gf_reader_new(void) {
  gf_reader *volatile r = (gf_reader *)calloc(1, sizeof(gf_reader));
  if (r == NULL) return NULL;
  r->cinfo.err = jpeg_std_error(&r->err);
  r->err.error_exit = gf_error_exit;
  r->err.emit_message = gf_emit_message;
  r->cinfo.client_data = r;
  if (setjmp(r->jump)) {
    jpeg_destroy_decompress(&r->cinfo);
    free(r);
    return NULL;
  }
  jpeg_create_decompress(&r->cinfo);
  r->progress.progress_monitor = gf_progress;
  r->cinfo.progress = &r->progress;
  return r;
}

void gf_reader_free(gf_reader *r) {
  if (r == NULL) return;
  gf_huffman_cache_free(r->huffman);
  jpeg_destroy_decompress(&r->cinfo);
  free(r);
}

const char *gf_reader_message(const gf_reader *r) { return r->message; }

void gf_reader_set_scan_limit(gf_reader *r, int scans) { r->scan_limit = scans; }

/* Forgets the current image and frees libjpeg's memory for it. */
void gf_reader_close(gf_reader *r) { gf_close(r); }

/* jutils.c jround_up: `a` up to a multiple of `b`, as the coefficient controller sizes its
 * arrays (jdcoefct.c). */
static uint32_t gf_round_up(JDIMENSION a, int b) {
  uint32_t m = b > 0 ? (uint32_t)b : 1;
  return (uint32_t)((a + m - 1) / m * m);
}

/* Reads the headers of `data` (which must stay alive and unchanged until the next gf_open or
 * gf_reader_close) up to the first scan. */
int gf_open(gf_reader *r, const unsigned char *data, size_t len, gf_header *out) {
  j_decompress_ptr cinfo = &r->cinfo;
  int status, ci;
  gf_close(r);
  r->message[0] = '\0';
  if (data == NULL || len == 0 || (unsigned long)len != len) {
    snprintf(r->message, sizeof(r->message), "no data");
    return GF_BAD_CALL;
  }
  status = setjmp(r->jump);
  if (status != 0) return gf_stop(r, status);
  r->open = 1;
  jpeg_mem_src(cinfo, data, (unsigned long)len);
  jpeg_read_header(cinfo, TRUE);
  memset(out, 0, sizeof(*out));
  out->width = cinfo->image_width;
  out->height = cinfo->image_height;
  out->num_components = cinfo->num_components;
  out->color_space = (int32_t)cinfo->jpeg_color_space;
  out->data_precision = cinfo->data_precision;
  out->progressive = cinfo->progressive_mode;
  out->arithmetic = cinfo->arith_code;
  out->restart_interval = (int32_t)cinfo->restart_interval;
  out->saw_jfif = cinfo->saw_JFIF_marker;
  out->saw_adobe = cinfo->saw_Adobe_marker;
  out->adobe_transform = cinfo->Adobe_transform;
  out->ccir601 = cinfo->CCIR601_sampling;
  out->max_h_samp = cinfo->max_h_samp_factor;
  out->max_v_samp = cinfo->max_v_samp_factor;
  out->imcu_rows = cinfo->total_iMCU_rows;
  out->single_scan = !cinfo->progressive_mode && cinfo->comps_in_scan == cinfo->num_components;
  if (cinfo->num_components < 1 || cinfo->num_components > GF_MAX_COMPONENTS) {
    snprintf(r->message, sizeof(r->message), "%d components (1 to %d are read)",
             cinfo->num_components, GF_MAX_COMPONENTS);
    return gf_stop(r, GF_UNSUPPORTED);
  }
  for (ci = 0; ci < cinfo->num_components; ci++) {
    jpeg_component_info *c = &cinfo->comp_info[ci];
    gf_component *o = &out->comp[ci];
    o->id = c->component_id;
    o->h_samp = c->h_samp_factor;
    o->v_samp = c->v_samp_factor;
    o->quant_tbl_no = c->quant_tbl_no;
    o->blocks_wide = c->width_in_blocks;
    o->blocks_high = c->height_in_blocks;
    o->padded_blocks_wide = gf_round_up(c->width_in_blocks, c->h_samp_factor);
    o->padded_blocks_high = gf_round_up(c->height_in_blocks, c->v_samp_factor);
    o->samples_wide = c->downsampled_width;
    o->samples_high = c->downsampled_height;
  }
  if (cinfo->data_precision != 8) {
    snprintf(r->message, sizeof(r->message), "%d-bit samples (8-bit are read)",
             cinfo->data_precision);
    return gf_stop(r, GF_UNSUPPORTED);
  }
  return GF_OK;
}

/* Whether libjpeg's decoder would smooth the blocks of this image (jdcoefct.c smoothing_ok,
 * with do_block_smoothing at its default TRUE): a progressive file whose first AC coefficients
 * are not all complete, as when a file ends before its last scans. */
static int gf_smoothing_ok(j_decompress_ptr cinfo) {
  int ci, coefi;
  int useful = 0;
  if (!cinfo->progressive_mode || cinfo->coef_bits == NULL) return 0;
  for (ci = 0; ci < cinfo->num_components; ci++) {
    JQUANT_TBL *q = cinfo->comp_info[ci].quant_table;
    int *bits = cinfo->coef_bits[ci];
    if (q == NULL) return 0;
    /* Q00, Q01, Q10, Q20, Q11, Q02, Q03, Q12, Q21, Q30 in natural order */
    if (q->quantval[0] == 0 || q->quantval[1] == 0 || q->quantval[8] == 0 ||
        q->quantval[16] == 0 || q->quantval[9] == 0 || q->quantval[2] == 0 ||
        q->quantval[3] == 0 || q->quantval[10] == 0 || q->quantval[17] == 0 ||
        q->quantval[24] == 0)
      return 0;
    if (bits[0] < 0) return 0;
    for (coefi = 1; coefi < 10; coefi++)
      if (bits[coefi] != 0) useful = 1;
  }
  return useful;
}

/* Entropy-decodes the image opened by gf_open into libjpeg's coefficient arrays. With
 * stop_rows > 0, a single-scan Huffman file stops after that many iMCU rows. */
int gf_read_coefficients(gf_reader *r, uint32_t stop_rows, gf_coefficients *out) {
  j_decompress_ptr cinfo = &r->cinfo;
  int status, ci, i;
  if (!r->open || r->arrays != NULL) {
    snprintf(r->message, sizeof(r->message), "no image opened to read");
    return GF_BAD_CALL;
  }
  status = setjmp(r->jump);
  if (status != 0) {
    if (status == GF_ERROR && r->err.msg_code == JERR_NOTIMPL)
      status = GF_UNSUPPORTED; /* lossless JPEG: no coefficients */
    return gf_stop(r, status);
  }
  r->stop_rows = stop_rows;
  r->warnings = 0;
  r->message[0] = '\0';
  r->arrays = jpeg_read_coefficients(cinfo);
  if (r->arrays == NULL) {
    /* Only a suspending data source returns NULL; the memory source never suspends. */
    snprintf(r->message, sizeof(r->message), "the data source suspended");
    return gf_stop(r, GF_ERROR);
  }
  memset(out, 0, sizeof(*out));
  out->stopped_early = r->stopped_early;
  out->imcu_rows_read = r->stopped_early ? r->stop_rows : cinfo->total_iMCU_rows;
  out->block_smoothing = gf_smoothing_ok(cinfo);
  out->warnings = r->warnings;
  for (ci = 0; ci < cinfo->num_components; ci++) {
    JQUANT_TBL *q = cinfo->comp_info[ci].quant_table;
    if (q == NULL) {
      /* A component that no scan carried (a damaged multi-scan file): no table was latched. */
      snprintf(r->message, sizeof(r->message), "component %d has no scan", ci);
      return gf_stop(r, GF_ERROR);
    }
    for (i = 0; i < DCTSIZE2; i++) out->quant[ci][i] = q->quantval[i];
  }
  return GF_OK;
}

/* The addresses of `count` block rows of component `ci` from row `first`: each row holds
 * padded_blocks_wide blocks of 64 coefficients in natural order. Valid until the next gf_open
 * or gf_reader_close. */
int gf_block_rows(gf_reader *r, int ci, uint32_t first, uint32_t count, const int16_t **rows) {
  j_decompress_ptr cinfo = &r->cinfo;
  volatile uint32_t i = 0;
  int status;
  if (r->arrays == NULL || ci < 0 || ci >= cinfo->num_components) {
    snprintf(r->message, sizeof(r->message), "no coefficients to read");
    return GF_BAD_CALL;
  }
  status = setjmp(r->jump);
  if (status != 0) return status; /* a row outside the array: nothing was changed */
  for (; i < count; i++) {
    JBLOCKARRAY row = (*cinfo->mem->access_virt_barray)(
        (j_common_ptr)cinfo, r->arrays[ci], first + i, 1, FALSE);
    rows[i] = (const int16_t *)row[0][0];
  }
  return GF_OK;
}

/* ---- Decoding to pixels ---- */

/* Output formats of gf_decompress, mirrored in src/ffi.rs. */
#define GF_RGB 0
#define GF_GRAY 1
#define GF_CMYK 2

/* How gf_decompress decodes: the output format, the DCT scaling 1/denom, the region (x, y,
 * width, height: all zero for the whole image) and whether huffman.c's decoder takes the place
 * of the library's. */
typedef struct gf_request {
  int32_t format;
  int32_t denom;
  uint32_t x;
  uint32_t y;
  uint32_t width;
  uint32_t height;
  int32_t fast_huffman;
} gf_request;

/* What gf_decompress did: libjpeg's warnings about the data (the first is the reader's
 * message), whether one said the data ended before the image, and whether huffman.c decoded
 * the image. */
typedef struct gf_decompressed {
  int32_t warnings;
  int32_t premature_end;
  int32_t fast_huffman;
} gf_decompressed;

/* Decodes `data` as TurboJPEG's tj3Decompress8 does (fancy upsampling, the accurate integer
 * IDCT, jpeg_crop_scanline and jpeg_skip_scanlines for a region, rows below it never decoded)
 * into `dst`: the region's rows, `pitch` bytes apart, from its first pixel. The caller has
 * checked the region against the image's scaled size and `dst` against the region. */
int gf_decompress(gf_reader *r, const unsigned char *data, size_t len, const gf_request *req,
                  unsigned char *dst, size_t pitch, gf_decompressed *out) {
  j_decompress_ptr cinfo = &r->cinfo;
  JSAMPROW rows[32];
  JDIMENSION crop_x, crop_w, first, end, lines;
  int status;
  gf_close(r);
  r->message[0] = '\0';
  memset(out, 0, sizeof(*out));
  if (data == NULL || len == 0 || (unsigned long)len != len || dst == NULL ||
      req->format < GF_RGB || req->format > GF_CMYK) {
    snprintf(r->message, sizeof(r->message), "no data or a bad request");
    return GF_BAD_CALL;
  }
  status = setjmp(r->jump);
  if (status != 0) return gf_stop(r, status);
  r->open = 1;
  jpeg_mem_src(cinfo, data, (unsigned long)len);
  jpeg_read_header(cinfo, TRUE);
  cinfo->out_color_space = req->format == GF_RGB    ? JCS_EXT_RGB
                           : req->format == GF_GRAY ? JCS_GRAYSCALE
                                                    : JCS_CMYK;
  cinfo->do_fancy_upsampling = TRUE;
  cinfo->dct_method = JDCT_ISLOW;
  cinfo->scale_num = 1;
  cinfo->scale_denom = (unsigned int)req->denom;
  jpeg_start_decompress(cinfo);
  if (req->fast_huffman) {
    if (r->huffman == NULL) r->huffman = gf_huffman_cache_new();
    out->fast_huffman = gf_huffman_install(cinfo, r->huffman);
  }

  if (req->x != 0 || (req->width != 0 && req->width != cinfo->output_width)) {
    crop_x = req->x;
    crop_w = req->width;
    jpeg_crop_scanline(cinfo, &crop_x, &crop_w);
    if (crop_x != req->x || crop_w != req->width) {
      snprintf(r->message, sizeof(r->message), "the region's columns %u+%u became %u+%u",
               req->x, req->width, crop_x, crop_w);
      return gf_stop(r, GF_BAD_CALL);
    }
  }
  first = req->height != 0 ? req->y : 0;
  end = req->height != 0 ? req->y + req->height : cinfo->output_height;
  if (first > 0 && jpeg_skip_scanlines(cinfo, first) != first) {
    snprintf(r->message, sizeof(r->message), "could not skip to row %u", first);
    return gf_stop(r, GF_BAD_CALL);
  }
  while (cinfo->output_scanline < end) {
    JDIMENSION want = end - cinfo->output_scanline, i;
    if (want > 32) want = 32;
    for (i = 0; i < want; i++)
      rows[i] = dst + (size_t)(cinfo->output_scanline - first + i) * pitch;
    if (jpeg_read_scanlines(cinfo, rows, want) == 0) {
      /* Only a suspending data source reads nothing; the memory source never suspends. */
      snprintf(r->message, sizeof(r->message), "the data source suspended");
      return gf_stop(r, GF_ERROR);
    }
  }
  if (end < cinfo->output_height) {
    lines = cinfo->output_height - end;
    if (jpeg_skip_scanlines(cinfo, lines) != lines) {
      snprintf(r->message, sizeof(r->message), "could not skip the rows below %u", end);
      return gf_stop(r, GF_BAD_CALL);
    }
  }
  jpeg_finish_decompress(cinfo);
  out->warnings = r->warnings;
  out->premature_end = r->premature_end;
  return gf_stop(r, GF_OK);
}

/* ---- Writing JPEGs ---- */

typedef struct gf_encode {
  uint32_t width;
  uint32_t height;
  int32_t input_components;  /* 3: packed RGB, 1: gray */
  int32_t jpeg_color_space;  /* JCS_YCbCr, JCS_RGB or JCS_GRAYSCALE */
  int32_t quality;           /* 1..100 */
  int32_t progressive;
  int32_t arithmetic;
  int32_t optimize;
  int32_t restart_interval;  /* MCUs per restart interval, or 0 */
  int32_t restart_rows;      /* MCU rows per restart interval, or 0 */
  int32_t h_samp[GF_MAX_COMPONENTS];
  int32_t v_samp[GF_MAX_COMPONENTS];
} gf_encode;

/* The encoder's error manager and a growing malloc'd output buffer, kept together so that
 * the error path finds what to free. */
typedef struct gf_encoder_state {
  struct jpeg_error_mgr err;
  struct jpeg_destination_mgr dest;
  jmp_buf jump;
  unsigned char *data;
  size_t capacity;
  size_t length;
  char message[JMSG_LENGTH_MAX];
} gf_encoder_state;

static gf_encoder_state *gf_state(j_compress_ptr cinfo) {
  return (gf_encoder_state *)cinfo->client_data;
}

static void gf_encoder_exit(j_common_ptr cinfo) {
  gf_encoder_state *e = (gf_encoder_state *)cinfo->client_data;
  (*cinfo->err->format_message)(cinfo, e->message);
  longjmp(e->jump, GF_ERROR);
}

static void gf_encoder_quiet(j_common_ptr cinfo, int msg_level) {
  (void)cinfo;
  (void)msg_level;
}

static void gf_dest_init(j_compress_ptr cinfo) {
  gf_encoder_state *e = gf_state(cinfo);
  e->capacity = 1 << 16;
  e->data = (unsigned char *)malloc(e->capacity);
  if (e->data == NULL) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
  e->dest.next_output_byte = e->data;
  e->dest.free_in_buffer = e->capacity;
}

/* The buffer is full: twice the size. */
static boolean gf_dest_grow(j_compress_ptr cinfo) {
  gf_encoder_state *e = gf_state(cinfo);
  unsigned char *bigger = (unsigned char *)realloc(e->data, e->capacity * 2);
  if (bigger == NULL) ERREXIT1(cinfo, JERR_OUT_OF_MEMORY, 10);
  e->data = bigger;
  e->dest.next_output_byte = bigger + e->capacity;
  e->dest.free_in_buffer = e->capacity;
  e->capacity *= 2;
  return TRUE;
}

static void gf_dest_term(j_compress_ptr cinfo) {
  gf_encoder_state *e = gf_state(cinfo);
  e->length = e->capacity - e->dest.free_in_buffer;
}

/* Compresses `pixels` (rows packed, input_components bytes a pixel) as `p` says. On success
 * *out holds the file (malloc'd: release with gf_free) and *out_len its length; on failure
 * `message` (JMSG_LENGTH_MAX bytes) says why. */
int gf_compress(const gf_encode *p, const unsigned char *pixels, unsigned char **out,
                size_t *out_len, char *message) {
  struct jpeg_compress_struct cinfo;
  gf_encoder_state *e;
  int ci;
  *out = NULL;
  *out_len = 0;
  e = (gf_encoder_state *)calloc(1, sizeof(gf_encoder_state));
  if (e == NULL) {
    snprintf(message, JMSG_LENGTH_MAX, "out of memory");
    return GF_ERROR;
  }
  memset(&cinfo, 0, sizeof(cinfo));
  cinfo.err = jpeg_std_error(&e->err);
  e->err.error_exit = gf_encoder_exit;
  e->err.emit_message = gf_encoder_quiet;
  cinfo.client_data = e;
  /* Everything the error path needs is behind `e`, which is not changed after setjmp. */
  if (setjmp(e->jump)) {
    jpeg_destroy_compress(&cinfo);
    free(e->data);
    memcpy(message, e->message, JMSG_LENGTH_MAX);
    free(e);
    return GF_ERROR;
  }
  jpeg_create_compress(&cinfo);
  e->dest.init_destination = gf_dest_init;
  e->dest.empty_output_buffer = gf_dest_grow;
  e->dest.term_destination = gf_dest_term;
  cinfo.dest = &e->dest;
  cinfo.image_width = p->width;
  cinfo.image_height = p->height;
  cinfo.input_components = p->input_components;
  cinfo.in_color_space = p->input_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_colorspace(&cinfo, (J_COLOR_SPACE)p->jpeg_color_space);
  jpeg_set_quality(&cinfo, p->quality, TRUE);
  for (ci = 0; ci < cinfo.num_components && ci < GF_MAX_COMPONENTS; ci++) {
    if (p->h_samp[ci] > 0) cinfo.comp_info[ci].h_samp_factor = p->h_samp[ci];
    if (p->v_samp[ci] > 0) cinfo.comp_info[ci].v_samp_factor = p->v_samp[ci];
  }
  cinfo.arith_code = p->arithmetic ? TRUE : FALSE;
  cinfo.optimize_coding = p->optimize && !p->arithmetic ? TRUE : FALSE;
  cinfo.restart_interval = (unsigned int)p->restart_interval;
  cinfo.restart_in_rows = p->restart_rows;
  if (p->progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = (JSAMPROW)(pixels + (size_t)cinfo.next_scanline * p->width *
                                           (size_t)p->input_components);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  *out = e->data;
  *out_len = e->length;
  free(e);
  return GF_OK;
}

void gf_free(unsigned char *buffer) { free(buffer); }

/* sizeof of the structures shared with Rust, so that a mismatch is caught. */
size_t gf_layout(int which) {
  switch (which) {
  case 0: return sizeof(gf_component);
  case 1: return sizeof(gf_header);
  case 2: return sizeof(gf_coefficients);
  case 3: return sizeof(gf_encode);
  case 4: return sizeof(gf_request);
  case 5: return sizeof(gf_decompressed);
  default: return 0;
  }
}
