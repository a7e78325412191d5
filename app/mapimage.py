"""The map picture: a :class:`maps_core.slices.MapSlice` drawn as a PNG.

Presentation only: the labels come from the maps. Colours are the Okabe-Ito palette,
chosen to stay distinguishable with the common colour-vision deficiencies; each class is
one colour, lightened for the fill. The overlay draws, in dark grey, the boundaries
between partition boxes the slice crosses (thin) and where the class changes (solid
black), the instance (a white disc ringed black) and its nearest counterfactual in the
slice (a black diamond), joined by a line. The PNG is written with the standard library
(zlib): no imaging dependency.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from maps_core.slices import MapSlice

#: Okabe & Ito (2008), "Color Universal Design": safe for colour-blind readers.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
BOX_EDGE = (120, 120, 120)
CLASS_EDGE = (0, 0, 0)


def class_colours(n_classes: int, fill: bool = True) -> np.ndarray:
    """RGB colour per class, shape (n_classes, 3), uint8; lightened (mixed 45% with white)
    for fills so that the overlay stays visible. Colours repeat past eight classes."""
    rgb = np.array([[int(h[i:i + 2], 16) for i in (1, 3, 5)] for h in OKABE_ITO], dtype=float)
    rgb = rgb[np.arange(n_classes) % len(OKABE_ITO)]
    if fill:
        rgb = rgb + 0.45 * (255.0 - rgb)
    return np.round(rgb).astype(np.uint8)


def render(sl: MapSlice, n_classes: int, instance: tuple[float, float] | None = None,
           counterfactual: tuple[float, float] | None = None, overlay: bool = True) -> np.ndarray:
    """The picture as an RGB array of shape (height, width, 3), uint8.

    ``instance`` and ``counterfactual`` are ``(a, b)`` values; with ``overlay=False`` the
    picture is the class fill only (one colour per pixel, from :func:`class_colours`).
    """
    img = class_colours(n_classes)[sl.labels]
    if not overlay:
        return img
    h, w = sl.labels.shape
    # box boundaries first, class boundaries over them
    for grid, colour in ((sl.boxes, BOX_EDGE), (sl.labels, CLASS_EDGE)):
        edge = np.zeros((h, w), dtype=bool)
        edge[:, 1:] |= grid[:, 1:] != grid[:, :-1]
        edge[1:, :] |= grid[1:, :] != grid[:-1, :]
        img[edge] = colour
    if instance is not None and counterfactual is not None:
        _line(img, sl.pixel_of(*instance), sl.pixel_of(*counterfactual), (0, 0, 0))
    if counterfactual is not None:
        _diamond(img, sl.pixel_of(*counterfactual), 6, (0, 0, 0))
    if instance is not None:
        _disc(img, sl.pixel_of(*instance), 6, (0, 0, 0))
        _disc(img, sl.pixel_of(*instance), 4, (255, 255, 255))
    return img


def _off_picture(c: tuple[float, float], r: float, w: int, h: int) -> bool:
    """Whether a mark of radius ``r`` at ``c`` misses the ``w x h`` raster (or ``c`` is not
    finite): nothing to draw, and a centre far off would overflow the pixel distances."""
    return not (-r <= c[0] <= w + r and -r <= c[1] <= h + r)


def _disc(img: np.ndarray, c: tuple[float, float], r: float, colour: tuple[int, int, int]) -> None:
    h, w, _ = img.shape
    if _off_picture(c, r, w, h):
        return
    yy, xx = np.mgrid[0:h, 0:w]
    img[(xx + 0.5 - c[0]) ** 2 + (yy + 0.5 - c[1]) ** 2 <= r * r] = colour


def _diamond(img: np.ndarray, c: tuple[float, float], r: float, colour: tuple[int, int, int]) -> None:
    h, w, _ = img.shape
    if _off_picture(c, r, w, h):
        return
    yy, xx = np.mgrid[0:h, 0:w]
    img[np.abs(xx + 0.5 - c[0]) + np.abs(yy + 0.5 - c[1]) <= r] = colour


def _clip(p: tuple[float, float], q: tuple[float, float], w: int,
          h: int) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The part of segment ``pq`` inside the raster ``[0, w] x [0, h]`` (Liang-Barsky), or
    None. A point may lie far outside the picture (a counterfactual beyond a narrow range,
    or any point of a range a few ulps wide): drawing then costs the picture's size, not
    the distance's; a non-finite end draws nothing."""
    if not all(np.isfinite(v) for v in (*p, *q)):
        return None
    t0, t1 = 0.0, 1.0
    dx, dy = q[0] - p[0], q[1] - p[1]
    if not (np.isfinite(dx) and np.isfinite(dy)):
        return None
    # (p_k, q_k) per side: left, right, top, bottom; p_k < 0 where the segment enters
    for pk, qk in ((-dx, p[0]), (dx, w - p[0]), (-dy, p[1]), (dy, h - p[1])):
        if pk == 0:
            if qk < 0:  # parallel to this side and outside it
                return None
        elif pk < 0:
            t0 = max(t0, qk / pk)
        else:
            t1 = min(t1, qk / pk)
    if t0 > t1:
        return None

    def at(t: float) -> tuple[float, float]:
        # clamped: with ends ~1e300 away, p + t * d is off by ulps of 1e300
        return (min(max(p[0] + t * dx, 0.0), float(w)), min(max(p[1] + t * dy, 0.0), float(h)))

    return at(t0), at(t1)


def _line(img: np.ndarray, p: tuple[float, float], q: tuple[float, float],
          colour: tuple[int, int, int]) -> None:
    h, w, _ = img.shape
    clipped = _clip(p, q, w, h)
    if clipped is None:
        return
    p, q = clipped
    n = int(max(abs(q[0] - p[0]), abs(q[1] - p[1]))) + 2
    xs = np.linspace(p[0], q[0], n).astype(int)
    ys = np.linspace(p[1], q[1], n).astype(int)
    ok = (xs >= 0) & (xs < w) & (ys >= 0) & (ys < h)
    img[ys[ok], xs[ok]] = colour


def png_bytes(img: np.ndarray) -> bytes:
    """Encode an RGB array of shape (height, width, 3), uint8, as a PNG file."""
    h, w, _ = img.shape
    raw = np.zeros((h, 1 + 3 * w), dtype=np.uint8)  # filter byte 0 (None) per row
    raw[:, 1:] = img.reshape(h, 3 * w)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b""))


__all__ = ["OKABE_ITO", "class_colours", "png_bytes", "render"]
