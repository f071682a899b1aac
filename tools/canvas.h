/* canvas.h — a tiny RGB raster for `mha plot`: filled rectangles, a 5x7
 * bitmap font (drawn here, upper case, digits and a few signs), a colour
 * map, and PNG output through libpng. */
#ifndef MHA_TOOLS_CANVAS_H
#define MHA_TOOLS_CANVAS_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int w, h;
    uint8_t *px; /* (h, w, 3) */
} canvas;

int canvas_init(canvas *c, int w, int h); /* white; 0 ok, -1 no memory */
void canvas_free(canvas *c);
void canvas_rect(canvas *c, int x, int y, int w, int h, const uint8_t rgb[3]);
/* Text with its top-left corner at (x, y); each font pixel is scale x scale.
 * Lower case is drawn as upper case; unknown characters as '?'. */
void canvas_text(canvas *c, int x, int y, int scale, const char *s, const uint8_t rgb[3]);
int canvas_text_width(const char *s, int scale);
#define CANVAS_GLYPH_H 7
/* t in [0, 1] -> a dark-blue .. green .. yellow colour ramp. */
void canvas_colormap(double t, uint8_t rgb[3]);
/* Writes an 8-bit RGB PNG to path, flushed and fsync'ed; returns 0, or -1
 * with a one-line message in err (libpng's own messages are captured
 * there, never printed). */
int canvas_write_png(const canvas *c, const char *path, char *err, size_t err_cap);

#endif /* MHA_TOOLS_CANVAS_H */
