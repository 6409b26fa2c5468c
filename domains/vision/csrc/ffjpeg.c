/*
 * Region decoding with the system libjpeg(-turbo): decode only the rows and
 * iMCU columns a crop needs, optionally at 1/2, 1/4 or 1/8 scale in the DCT
 * domain. Errors longjmp back here and come out as a message; nothing exits.
 */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

struct ff_err {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  int eof;
  char msg[JMSG_LENGTH_MAX];
};

static void ff_error_exit(j_common_ptr cinfo) {
  struct ff_err *e = (struct ff_err *)cinfo->err;
  (*cinfo->err->format_message)(cinfo, e->msg);
  longjmp(e->jump, 1);
}

static void ff_emit_message(j_common_ptr cinfo, int level) {
  struct ff_err *e = (struct ff_err *)cinfo->err;
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    e->eof = 1;
  }
}

static void ff_output_message(j_common_ptr cinfo) { (void)cinfo; }

static void copy_msg(char *dst, size_t cap, const char *src) {
  if (cap == 0) return;
  strncpy(dst, src, cap - 1);
  dst[cap - 1] = 0;
}

/* Errors longjmp to the caller's setjmp; warnings only note a truncation. */
static void ff_err_setup(struct jpeg_decompress_struct *cinfo, struct ff_err *err) {
  memset(err, 0, sizeof *err);
  cinfo->err = jpeg_std_error(&err->pub);
  err->pub.error_exit = ff_error_exit;
  err->pub.emit_message = ff_emit_message;
  err->pub.output_message = ff_output_message;
}

/*
 * A source of two memory segments read one after the other (a spliced
 * stream: new headers and a synthetic row, then the rest of the original
 * file); past the end it supplies an EOI and warns, as jpeg_mem_src does.
 */
struct ff_src {
  struct jpeg_source_mgr pub;
  const JOCTET *next;
  size_t next_len;
};

static const JOCTET ff_eoi[2] = {0xFF, JPEG_EOI};

static void ff_src_init(j_decompress_ptr cinfo) { (void)cinfo; }

static boolean ff_src_fill(j_decompress_ptr cinfo) {
  struct ff_src *s = (struct ff_src *)cinfo->src;
  if (s->next != NULL && s->next_len > 0) {
    s->pub.next_input_byte = s->next;
    s->pub.bytes_in_buffer = s->next_len;
    s->next = NULL;
    s->next_len = 0;
    return TRUE;
  }
  WARNMS(cinfo, JWRN_JPEG_EOF);
  s->pub.next_input_byte = ff_eoi;
  s->pub.bytes_in_buffer = 2;
  return TRUE;
}

static void ff_src_skip(j_decompress_ptr cinfo, long n) {
  struct ff_src *s = (struct ff_src *)cinfo->src;
  if (n <= 0) return;
  while (n > (long)s->pub.bytes_in_buffer) {
    n -= (long)s->pub.bytes_in_buffer;
    (void)ff_src_fill(cinfo);
  }
  s->pub.next_input_byte += n;
  s->pub.bytes_in_buffer -= (size_t)n;
}

static void ff_src_term(j_decompress_ptr cinfo) { (void)cinfo; }

static void ff_src_setup(j_decompress_ptr cinfo, struct ff_src *s, const unsigned char *a,
                         unsigned long alen, const unsigned char *b, unsigned long blen) {
  memset(s, 0, sizeof *s);
  s->pub.init_source = ff_src_init;
  s->pub.fill_input_buffer = ff_src_fill;
  s->pub.skip_input_data = ff_src_skip;
  s->pub.resync_to_restart = jpeg_resync_to_restart;
  s->pub.term_source = ff_src_term;
  s->pub.next_input_byte = a;
  s->pub.bytes_in_buffer = alen;
  s->next = b;
  s->next_len = blen;
  cinfo->src = &s->pub;
}

#define FF_OK 0
#define FF_ERROR 1
#define FF_UNSUPPORTED 2

/* Header only: size and whether libjpeg can produce RGB from it. */
int ff_jpeg_header(const unsigned char *data, unsigned long len, int *width,
                   int *height, char *msg, unsigned long msg_cap) {
  struct jpeg_decompress_struct cinfo;
  struct ff_err err;
  int rc = FF_OK;
  ff_err_setup(&cinfo, &err);
  if (setjmp(err.jump)) {
    copy_msg(msg, msg_cap, err.msg);
    jpeg_destroy_decompress(&cinfo);
    return FF_ERROR;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, len);
  jpeg_read_header(&cinfo, TRUE);
  *width = (int)cinfo.image_width;
  *height = (int)cinfo.image_height;
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    rc = FF_UNSUPPORTED;
  }
  jpeg_destroy_decompress(&cinfo);
  return rc;
}

/*
 * Decodes the region (x, y, w, h) of the full-resolution image in the
 * stream data[..len] followed by data2[..len2] at num/8
 * scale (num in 1..8; libjpeg-turbo scales in the IDCT). The delivered region starts at scaled column *out_x (aligned down
 * to an iMCU boundary by libjpeg) and row *out_y, and is *out_w by *out_h
 * RGB pixels, written with a stride of *out_w * 3 bytes into out. With
 * fast set, the integer fast IDCT and plain chroma replication are used
 * (faster, slightly less accurate than the defaults Pillow also uses).
 */
int ff_jpeg_decode_region(const unsigned char *data, unsigned long len,
                          const unsigned char *data2, unsigned long len2,
                          int num, int fast, int x, int y, int w, int h,
                          unsigned char *out, unsigned long out_cap,
                          int *out_x, int *out_y, int *out_w, int *out_h,
                          char *msg, unsigned long msg_cap) {
  struct jpeg_decompress_struct cinfo;
  struct ff_err err;
  struct ff_src src;
  JDIMENSION sx, sy, ex, ey, xoff, cw, row;
  ff_err_setup(&cinfo, &err);
  if (setjmp(err.jump)) {
    copy_msg(msg, msg_cap, err.msg);
    jpeg_destroy_decompress(&cinfo);
    return FF_ERROR;
  }
  jpeg_create_decompress(&cinfo);
  ff_src_setup(&cinfo, &src, data, len, data2, len2);
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return FF_UNSUPPORTED;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = (unsigned int)num;
  cinfo.scale_denom = 8;
  if (fast) {
    /* Integer fast IDCT and box ("non-fancy") chroma upsampling. */
    cinfo.dct_method = JDCT_IFAST;
    cinfo.do_fancy_upsampling = FALSE;
  }
  jpeg_start_decompress(&cinfo);
  if (cinfo.output_components != 3) {
    copy_msg(msg, msg_cap, "decoder did not produce RGB");
    jpeg_destroy_decompress(&cinfo);
    return FF_ERROR;
  }
  sx = (JDIMENSION)(((long)x * num) / 8);
  sy = (JDIMENSION)(((long)y * num) / 8);
  ex = (JDIMENSION)(((long)(x + w) * num + 7) / 8);
  ey = (JDIMENSION)(((long)(y + h) * num + 7) / 8);
  if (ex > cinfo.output_width) ex = cinfo.output_width;
  if (ey > cinfo.output_height) ey = cinfo.output_height;
  if (sx >= ex || sy >= ey) {
    copy_msg(msg, msg_cap, "empty region");
    jpeg_destroy_decompress(&cinfo);
    return FF_ERROR;
  }
  xoff = sx;
  cw = ex - sx;
  if (xoff > 0 || cw < cinfo.output_width) {
    jpeg_crop_scanline(&cinfo, &xoff, &cw);
  }
  if ((unsigned long)cw * 3UL * (unsigned long)(ey - sy) > out_cap) {
    copy_msg(msg, msg_cap, "output buffer too small");
    jpeg_destroy_decompress(&cinfo);
    return FF_ERROR;
  }
  if (sy > 0) {
    jpeg_skip_scanlines(&cinfo, sy);
  }
  /* Several rows per call: with one, libjpeg upsamples and converts into a
   * spare row group and copies each row out. */
  for (row = 0; row < ey - sy;) {
    JSAMPROW rows[16];
    JDIMENSION want = ey - sy - row, i, got;
    if (want > 16) want = 16;
    for (i = 0; i < want; i++) rows[i] = out + (unsigned long)(row + i) * cw * 3UL;
    got = jpeg_read_scanlines(&cinfo, rows, want);
    if (got == 0) break;
    row += got;
    if (err.eof) break;
  }
  if (err.eof || row < ey - sy) {
    copy_msg(msg, msg_cap, "premature end of JPEG data (truncated file)");
    jpeg_destroy_decompress(&cinfo);
    return FF_ERROR;
  }
  *out_x = (int)xoff;
  *out_y = (int)sy;
  *out_w = (int)cw;
  *out_h = (int)(ey - sy);
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return FF_OK;
}
