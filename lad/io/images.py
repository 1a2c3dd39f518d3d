"""Opening images: every image lad shows a model, embeds or checks goes through `open_image`.

What a model sees is an 8-bit RGB picture the way a person looking at the file sees it: the
conversions (EXIF orientation, 16 → 8 bits scaled not clipped, transparency on a white
`BACKGROUND`, CMYK through its ICC profile) are docs/errors.md's "Images as the model sees them".
32-bit float images and integer images outside 0..65535 are refused: their range is unknown.

Formats: only the raster formats in `FORMATS` (JPEG, PNG, GIF, BMP, TIFF, WebP) are opened, by
decoding and by the converters that extract pictures alike; anything else (PostScript/EPS, which
PIL would hand to Ghostscript, PDF, SVG, ...) is refused naming the file.

Limits, checked on the header before any pixel is decoded, each error naming the file:

- at most `limits.IMAGE_PIXELS` pixels (default 178,956,970, PIL's own decompression-bomb limit); a
  user who trusts a larger file raises it with the environment variable LAD_MAX_IMAGE_PIXELS;
- an aspect ratio of at most `MAX_ASPECT` (vision processors refuse or mangle thinner strips);
- images whose longer side exceeds `MAX_SIDE` are downscaled (aspect kept, Lanczos; JPEGs are
  decoded at a reduced scale) before a processor sees them: no processor lad supports uses more
  pixels, and a 12000 × 12000 photo would otherwise cost gigabytes of float arrays.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from lad.errors import DataError
from lad.io import limits

BACKGROUND = (255, 255, 255)
MAX_SIDE = 4096
MAX_ASPECT = 100
# PIL's names of the formats lad opens ("MPO" is how PIL reads many cameras' JPEGs), and the
# suffix an extracted picture of each is saved with.
FORMATS = {
    "JPEG": ".jpg", "MPO": ".jpg", "PNG": ".png", "GIF": ".gif", "BMP": ".bmp", "TIFF": ".tif",
    "WEBP": ".webp",
}  # fmt: skip
_FORMAT_NAMES = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WebP")  # FORMATS as messages name them
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")
_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La")


def check_image(path: str | Path) -> tuple[int, int]:
    """Refuse a missing file, a folder, a format not in FORMATS, too many pixels or an extreme
    aspect ratio (from the header, before any pixel is decoded), and a file whose pixels do not
    decode (a truncated or corrupt file: decoded in full, as the model will); return (width,
    height)."""
    with _opened(Path(path)) as im:
        _decode(im)
        return im.size


def check_images(items: Iterable[Any]) -> None:
    """`check_image` of every picture of `items` (lad.core.items.Item), each once."""
    for path in dict.fromkeys(p for it in items for p in it.pictures):
        check_image(path)


def picture_suffix(data: bytes, where: str) -> str:
    """The file suffix of a picture given as bytes (a benchmark's embedded picture), after the
    checks `check_image` makes of a file: a format in FORMATS, within the pixel limits, decoding
    in full. `where` starts each error (the file and row that hold the bytes)."""
    try:
        with _open_unchecked(io.BytesIO(data)) as im:
            _check_size(f"{where}a picture", *im.size)
            try:
                _decode(im)
            except (OSError, ValueError, SyntaxError) as e:
                raise UndecodedPicture(
                    f"{where}a picture's pixels do not decode ({_why(e)}): truncated or damaged"
                ) from None
            return FORMATS[im.format]
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise DataError(
            f"{where}a picture's bytes are not an image lad reads ({_why(e)})"
        ) from None


class UndecodedPicture(DataError):
    """A picture of a format lad reads whose pixels do not decode (a truncated download): its
    question is skipped, not the whole conversion refused."""


def format_suffix(data: bytes) -> str | None:
    """The file suffix of a picture given as bytes, from its header, if its format is one of
    FORMATS; None otherwise (nothing is decoded)."""
    try:
        with _open_unchecked(io.BytesIO(data)) as im:
            return FORMATS[im.format]
    except (OSError, ValueError, SyntaxError):
        return None


def _draft(im: Image.Image, max_side: int = MAX_SIDE) -> tuple[int, int]:
    """The size `im` is shown at (its longer side at most `max_side`); a JPEG larger than that is
    set to decode at 1/2, 1/4 or 1/8 scale, at least that size."""
    w, h = im.size
    scale = min(1.0, max_side / max(w, h))
    target = (max(1, round(w * scale)), max(1, round(h * scale)))
    if scale < 1:
        im.draft(None, target)
    return target


def _decode(im: Image.Image) -> None:
    """Decode every pixel (at the scale open_image decodes at), so a file that fails to decode
    fails here."""
    _draft(im)
    im.load()


def _why(e: Exception) -> str:
    if isinstance(e, Image.UnidentifiedImageError):
        return f"not one of the formats lad reads: {', '.join(_FORMAT_NAMES)}"
    return str(e)


def open_image(path: str | Path, *, max_side: int = MAX_SIDE) -> Image.Image:
    """The image at `path` as the 8-bit RGB picture a person sees (module docstring)."""
    path = Path(path)
    try:
        with _opened(path) as im:
            target = _draft(im, max_side)
            rgb = to_rgb(im, path)
        if rgb.size != target:
            rgb = rgb.resize(target, Image.Resampling.LANCZOS)
        ImageOps.exif_transpose(rgb, in_place=True)
        return rgb
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise DataError(f"{path}: cannot read image ({e})") from None


def to_rgb(im: Image.Image, path: object = "image") -> Image.Image:
    """Convert a decoded PIL image of any mode to 8-bit RGB (module docstring); keeps `info`'s
    EXIF so the caller can still transpose."""
    exif = im.getexif()
    mode = im.mode
    if mode in (*_SIXTEEN_BIT, "I"):
        im = _sixteen_to_eight(im, path)
    elif mode == "F":
        raise DataError(
            f"{path}: a 32-bit floating-point image has no fixed range; save it as 8 or 16 bits"
        )
    elif mode == "CMYK":
        im = _cmyk_to_rgb(im)
    if im.mode in _ALPHA or "transparency" in im.info:
        background = Image.new("RGBA", im.size, (*BACKGROUND, 255))
        out = Image.alpha_composite(background, im.convert("RGBA")).convert("RGB")
    else:
        out = im.convert("RGB")
    if exif:
        out.info["exif"] = exif.tobytes()
    return out


def _sixteen_to_eight(im: Image.Image, path: object) -> Image.Image:
    """A 16-bit grey image (or an "I" image holding 16-bit values) scaled to 8-bit "L"; a
    transparent grey value becomes an alpha channel ("LA")."""
    values = np.asarray(im).astype(np.int64)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise DataError(
            f"{path}: a 32-bit integer image with values outside 0..65535 has no known range; "
            "save it as 8 or 16 bits"
        )
    grey = Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), "L")
    transparent = im.info.get("transparency")
    if isinstance(transparent, int):
        alpha = np.where(values == transparent, 0, 255).astype(np.uint8)
        grey = Image.merge("LA", (grey, Image.fromarray(alpha, "L")))
    return grey


def _cmyk_to_rgb(im: Image.Image) -> Image.Image:
    profile = im.info.get("icc_profile")
    if profile:
        from PIL import ImageCms

        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(profile))
            srgb = ImageCms.createProfile("sRGB")
            return ImageCms.profileToProfile(im, source, srgb, outputMode="RGB")
        except (ImageCms.PyCMSError, OSError):
            pass  # a broken profile: PIL's formula below
    return im.convert("RGB")


@contextmanager
def _opened(path: Path) -> Iterator[Any]:
    """PIL's image, header read, limits checked; PIL's own bomb check replaced by lad's limit."""
    if path.is_dir():
        raise DataError(f"{path}: is a folder, not an image file")
    if not path.is_file():
        raise DataError(f"{path}: image not found")
    try:
        with _open_unchecked(path) as im:
            _check_size(path, *im.size)
            yield im
    except (OSError, ValueError, SyntaxError) as e:
        raise DataError(f"{path}: cannot read image ({_why(e)})") from None


_PIL_LIMIT = threading.Lock()


def _open_unchecked(source: Path | io.BytesIO) -> Image.Image:
    """Image.open of the formats in FORMATS alone (PIL never tries another plugin, such as EPS's
    Ghostscript), without PIL's bomb check (lad checks the size itself, against a limit the user
    can raise). PIL's limit is a global read only inside Image.open, so it is lifted for that call
    alone, under a lock: input preparation opens images from several threads."""
    with _PIL_LIMIT:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            # The formats of FORMATS that PIL opens by a plugin of their own (its JPEG plugin
            # opens MPO files; WebP only where PIL was built with it).
            Image.init()
            return Image.open(source, formats=[f for f in FORMATS if f in Image.OPEN])
        finally:
            Image.MAX_IMAGE_PIXELS = saved


def _check_size(path: object, width: int, height: int) -> None:
    limit = limits.IMAGE_PIXELS.value
    if width * height > limit:
        raise DataError(
            f"{path}: {width} × {height} = {width * height:,} pixels is more than the limit of "
            f"{limit:,} (a decompression bomb?); if you trust the file, raise the limit with "
            f"{limits.IMAGE_PIXELS.env}={width * height}"
        )
    if min(width, height) < 1 or max(width, height) / min(width, height) > MAX_ASPECT:
        raise DataError(
            f"{path}: {width} × {height} pixels; lad refuses aspect ratios above {MAX_ASPECT}:1 "
            "(vision processors cannot tile such a strip); crop or pad it"
        )
