/* canvas.c — raster, bitmap font and PNG output for `mha plot`. */
#include "canvas.h"

#include <errno.h>
#include <png.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int canvas_init(canvas *c, int w, int h) {
    c->w = w;
    c->h = h;
    c->px = malloc((size_t)w * h * 3);
    if (!c->px) return -1;
    memset(c->px, 255, (size_t)w * h * 3);
    return 0;
}

void canvas_free(canvas *c) {
    free(c->px);
    c->px = NULL;
}

void canvas_rect(canvas *c, int x, int y, int w, int h, const uint8_t rgb[3]) {
    for (int j = y < 0 ? 0 : y; j < y + h && j < c->h; j++)
        for (int i = x < 0 ? 0 : x; i < x + w && i < c->w; i++)
            memcpy(c->px + ((size_t)j * c->w + i) * 3, rgb, 3);
}

/* 5x7 glyphs: one byte per row, bit 4 = leftmost pixel. */
typedef struct {
    char ch;
    uint8_t rows[7];
} glyph;

static const glyph font[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {' ', {0, 0, 0, 0, 0, 0, 0}},                      {'=', {0, 0, 0x1F, 0, 0x1F, 0, 0}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {':', {0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0}},          {'.', {0, 0, 0, 0, 0, 0x0C, 0x0C}},
    {',', {0, 0, 0, 0, 0x0C, 0x04, 0x08}},             {'-', {0, 0, 0, 0x1F, 0, 0, 0}},
    {'/', {0, 0x01, 0x02, 0x04, 0x08, 0x10, 0}},       {'_', {0, 0, 0, 0, 0, 0, 0x1F}},
    {'+', {0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0}},       {'|', {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'[', {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E}}, {']', {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E}},
    {'^', {0x04, 0x0A, 0x11, 0, 0, 0, 0}},
    {'?', {0x0E, 0x11, 0x01, 0x02, 0x04, 0, 0x04}},
};

static const glyph *find_glyph(char ch) {
    if (ch >= 'a' && ch <= 'z') ch = (char)(ch - 'a' + 'A');
    for (size_t i = 0; i < sizeof font / sizeof font[0]; i++)
        if (font[i].ch == ch) return &font[i];
    return &font[sizeof font / sizeof font[0] - 1];
}

int canvas_text_width(const char *s, int scale) {
    int n = (int)strlen(s);
    return n ? (6 * n - 1) * scale : 0;
}

void canvas_text(canvas *c, int x, int y, int scale, const char *s, const uint8_t rgb[3]) {
    for (; *s; s++, x += 6 * scale) {
        const glyph *g = find_glyph(*s);
        for (int r = 0; r < 7; r++)
            for (int b = 0; b < 5; b++)
                if (g->rows[r] & (0x10 >> b)) canvas_rect(c, x + b * scale, y + r * scale, scale, scale, rgb);
    }
}

void canvas_colormap(double t, uint8_t rgb[3]) {
    /* five anchors, linearly interpolated: dark violet, blue, teal, green, yellow */
    static const double anchor[5][3] = {
        {68, 1, 84}, {59, 82, 139}, {33, 145, 140}, {94, 201, 98}, {253, 231, 37}};
    if (!(t >= 0)) t = 0; /* also NaN */
    if (t > 1) t = 1;
    double u = t * 4;
    int k = u >= 4 ? 3 : (int)u;
    double f = u - k;
    for (int i = 0; i < 3; i++)
        rgb[i] = (uint8_t)(anchor[k][i] + f * (anchor[k + 1][i] - anchor[k][i]) + 0.5);
}

/* libpng reports errors through these instead of printing them: the
 * error handler keeps the message and jumps back to canvas_write_png. */
typedef struct {
    char msg[200];
} png_errors;

static void png_on_error(png_structp png, png_const_charp msg) {
    png_errors *e = png_get_error_ptr(png);
    snprintf(e->msg, sizeof e->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* a warning does not fail the write; nothing is printed */
}

int canvas_write_png(const canvas *c, const char *path, char *err, size_t err_cap) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, err_cap, "cannot create the file: %s", strerror(errno));
        return -1;
    }
    png_errors pe = {""};
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &pe, png_on_error, png_on_warning);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!png || !info) {
        png_destroy_write_struct(&png, &info);
        fclose(f);
        snprintf(err, err_cap, "libpng could not start");
        return -1;
    }
    if (setjmp(png_jmpbuf(png))) { /* libpng reports errors by longjmp */
        int e = errno;
        png_destroy_write_struct(&png, &info);
        fclose(f);
        snprintf(err, err_cap, "%s%s%s", pe.msg[0] ? pe.msg : "libpng failed",
                 e ? ": " : "", e ? strerror(e) : "");
        return -1;
    }
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)c->w, (png_uint_32)c->h, 8, PNG_COLOR_TYPE_RGB,
                 PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < c->h; y++) png_write_row(png, c->px + (size_t)y * c->w * 3);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    errno = 0;
    int ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) ok = 0, e = errno;
    if (!ok) {
        snprintf(err, err_cap, "cannot finish the file: %s", strerror(e));
        return -1;
    }
    return 0;
}
