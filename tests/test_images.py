"""lad.io.images.open_image: every PIL mode decoded to the 8-bit RGB a person sees, and its limits.

Expected pixels are worked by hand from the file's values (compositing: out = a·c + (1 − a)·255).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from lad.errors import DataError
from lad.io.images import MAX_SIDE, check_image, open_image


def _pixel(path: Path, xy: tuple[int, int] = (0, 0)) -> tuple[int, ...]:
    im = open_image(path)
    assert im.mode == "RGB"
    return im.getpixel(xy)


def test_16_bit_grey_is_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257, 32768, 65535]], dtype=np.uint16)  # 16-bit: 0, 1, 128, 255 in 8
    path = tmp_path / "grey16.png"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "I;16"
    im = open_image(path)
    assert [im.getpixel((x, 0)) for x in range(4)] == [(0,) * 3, (1,) * 3, (128,) * 3, (255,) * 3]


def test_16_bit_grey_with_a_transparent_value(tmp_path):
    path = tmp_path / "grey16t.png"
    Image.fromarray(np.array([[1000, 0]], dtype=np.uint16)).save(path, transparency=1000)
    im = open_image(path)
    assert im.getpixel((0, 0)) == (255, 255, 255)  # transparent: the white background
    assert im.getpixel((1, 0)) == (0, 0, 0)


def test_32_bit_integer_image_in_16_bit_range(tmp_path):
    path = tmp_path / "i32.tif"
    Image.fromarray(np.array([[65535, 0]], dtype=np.int32), "I").save(path)
    assert Image.open(path).mode == "I"
    im = open_image(path)
    assert (im.getpixel((0, 0)), im.getpixel((1, 0))) == ((255,) * 3, (0,) * 3)


def test_rgba_transparent_background_becomes_white(tmp_path):
    rgba = np.zeros((2, 2, 4), dtype=np.uint8)  # transparent black ...
    rgba[0, 1] = (255, 0, 0, 255)  # ... one opaque red pixel ...
    rgba[1, 0] = (0, 0, 255, 128)  # ... and one half-transparent blue
    path = tmp_path / "rgba.png"
    Image.fromarray(rgba, "RGBA").save(path)
    im = open_image(path)
    assert im.getpixel((0, 0)) == (255, 255, 255)
    assert im.getpixel((1, 0)) == (255, 0, 0)
    # 128/255 of blue over white: R = G = 255 · 127/255 = 127, B = 255.
    assert im.getpixel((0, 1)) == (127, 127, 255)


def test_grey_with_alpha(tmp_path):
    path = tmp_path / "la.png"
    Image.fromarray(np.array([[[0, 0], [0, 255]]], dtype=np.uint8), "LA").save(path)
    im = open_image(path)
    assert (im.getpixel((0, 0)), im.getpixel((1, 0))) == ((255,) * 3, (0,) * 3)


def test_palette_with_a_transparent_index(tmp_path):
    pal = Image.new("P", (2, 1))
    pal.putpalette([0, 0, 0, 0, 255, 0] + [0] * 762)
    pal.putpixel((0, 0), 0)
    pal.putpixel((1, 0), 1)
    path = tmp_path / "pal.png"
    pal.save(path, transparency=0)
    assert Image.open(path).mode == "P"
    im = open_image(path)
    assert (im.getpixel((0, 0)), im.getpixel((1, 0))) == ((255, 255, 255), (0, 255, 0))


def test_palette_with_partial_alpha(tmp_path):
    pal = Image.new("P", (1, 1))
    pal.putpalette([255, 0, 0] + [0] * 765)
    path = tmp_path / "pal-alpha.png"
    pal.save(path, transparency=bytes([51]))  # index 0: red at alpha 51 = 0.2
    # 0.2 · red + 0.8 · white = (255, 204, 204)
    assert _pixel(path) == (255, 204, 204)


def test_rgb_with_a_transparent_colour(tmp_path):
    path = tmp_path / "rgbt.png"
    Image.fromarray(np.array([[[10, 20, 30], [1, 2, 3]]], dtype=np.uint8)).save(
        path, transparency=(10, 20, 30)
    )
    im = open_image(path)
    assert (im.getpixel((0, 0)), im.getpixel((1, 0))) == ((255, 255, 255), (1, 2, 3))


def test_cmyk(tmp_path):
    path = tmp_path / "cmyk.tif"
    cmyk = np.array([[[0, 255, 255, 0], [0, 0, 0, 255], [0, 0, 0, 0]]], dtype=np.uint8)
    Image.fromarray(cmyk, "CMYK").save(path)
    im = open_image(path)
    # C, M, Y, K -> R = 255 − C − K etc.: red, black, white.
    assert [im.getpixel((x, 0)) for x in range(3)] == [(255, 0, 0), (0, 0, 0), (255, 255, 255)]


def test_bilevel_and_grey(tmp_path):
    one = tmp_path / "one.png"
    Image.fromarray(np.array([[True, False]])).save(one)
    assert Image.open(one).mode == "1"
    im = open_image(one)
    assert (im.getpixel((0, 0)), im.getpixel((1, 0))) == ((255,) * 3, (0,) * 3)
    grey = tmp_path / "grey.png"
    Image.fromarray(np.array([[77]], dtype=np.uint8)).save(grey)
    assert _pixel(grey) == (77, 77, 77)


@pytest.mark.parametrize(
    ("orientation", "blue_at"),
    [(1, (0, 0)), (3, (39, 19)), (6, (19, 0)), (8, (0, 39))],
)
def test_exif_orientation_is_applied(tmp_path, orientation, blue_at):
    # Stored 40 wide × 20 high, blue in the top-left 10 × 10, red elsewhere. Orientation 3
    # turns it 180°, 6 needs 90° clockwise to show upright, 8 90° counter-clockwise.
    stored = np.zeros((20, 40, 3), dtype=np.uint8)
    stored[:, :] = (255, 0, 0)
    stored[:10, :10] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = orientation
    path = tmp_path / f"o{orientation}.png"
    Image.fromarray(stored).save(path, exif=exif.tobytes())
    im = open_image(path)
    assert im.size == ((40, 20) if orientation in (1, 3) else (20, 40))
    assert im.getpixel(blue_at) == (0, 0, 255)
    assert im.getexif().get(0x0112, 1) == 1


def test_float_image_is_refused(tmp_path):
    path = tmp_path / "float.tif"
    Image.fromarray(np.array([[0.5]], dtype=np.float32), "F").save(path)
    with pytest.raises(DataError, match=r"float\.tif: .*floating-point"):
        open_image(path)


def test_32_bit_integers_beyond_16_bits_are_refused(tmp_path):
    path = tmp_path / "wide.tif"
    Image.fromarray(np.array([[70000]], dtype=np.int32), "I").save(path)
    with pytest.raises(DataError, match=r"wide\.tif: .*outside 0\.\.65535"):
        open_image(path)


def test_huge_image_is_downscaled_before_any_processor(tmp_path):
    path = tmp_path / "wide.jpg"
    Image.new("RGB", (2 * MAX_SIDE + 8, 200), (10, 200, 30)).save(path)
    im = open_image(path)
    assert im.size == (MAX_SIDE, 100)
    assert np.abs(np.asarray(im).astype(int) - (10, 200, 30)).max() <= 4
    small = tmp_path / "small.png"
    Image.new("RGB", (300, 150)).save(small)
    assert open_image(small, max_side=64).size == (64, 32)


def test_decompression_bomb_is_refused_from_the_header(tmp_path):
    path = tmp_path / "bomb.png"
    Image.new("1", (14_000, 14_000)).save(path)  # 196 M pixels in a few kB
    assert path.stat().st_size < 100_000
    with pytest.raises(DataError, match=r"bomb\.png: 14000 × 14000 = 196,000,000 pixels .*"):
        check_image(path)
    with pytest.raises(DataError, match=r"LAD_MAX_IMAGE_PIXELS=196000000"):
        open_image(path)


def test_pixel_limit_can_be_raised_or_lowered(tmp_path, monkeypatch):
    path = tmp_path / "forty.png"
    Image.new("RGB", (40, 40)).save(path)
    monkeypatch.setenv("LAD_MAX_IMAGE_PIXELS", "1000")
    with pytest.raises(DataError, match=r"forty\.png: 40 × 40 = 1,600 pixels .* limit of 1,000"):
        open_image(path)
    monkeypatch.setenv("LAD_MAX_IMAGE_PIXELS", "1600")
    assert open_image(path).size == (40, 40)
    monkeypatch.setenv("LAD_MAX_IMAGE_PIXELS", "lots")
    with pytest.raises(DataError, match=r"LAD_MAX_IMAGE_PIXELS must be .* Got 'lots'"):
        open_image(path)


def test_extreme_aspect_ratio_is_refused_naming_the_file(tmp_path):
    ok = tmp_path / "ok.png"
    Image.new("RGB", (1000, 10)).save(ok)
    assert check_image(ok) == (1000, 10)
    strip = tmp_path / "strip.png"
    Image.new("RGB", (5, 1010)).save(strip)
    with pytest.raises(DataError, match=r"strip\.png: 5 × 1010 pixels; .* above 100:1"):
        open_image(strip)


def test_folder_missing_and_corrupt_files(tmp_path):
    with pytest.raises(DataError, match=r"is a folder, not an image file"):
        open_image(tmp_path)
    with pytest.raises(DataError, match=r"gone\.png: image not found"):
        open_image(tmp_path / "gone.png")
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(DataError, match=r"bad\.png: cannot read image"):
        open_image(bad)
    truncated = tmp_path / "truncated.png"
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(truncated)
    truncated.write_bytes(truncated.read_bytes()[:2000])
    with pytest.raises(DataError, match=r"truncated\.png: cannot read image"):
        open_image(truncated)
    with pytest.raises(DataError, match=r"truncated\.png: cannot read image"):
        check_image(truncated)


def test_the_model_sees_the_decoded_picture(tmp_path):
    """Through the backend, a transparent RGBA, a 16-bit grey and an EXIF-rotated file give the
    same record as the 8-bit RGB picture they show."""
    from lad.backends import load_backend
    from lad.core.labels import get_scheme
    from lad.data.items import Item
    from lad.testing.tiny import build_tiny_model

    rng = np.random.default_rng(0)
    shown = [rng.integers(0, 256, (28, 42, 3), dtype=np.uint8) for _ in range(2)]
    shown[0][:, :10] = 255  # what a transparent band shows: the white background
    grey = (rng.random((28, 42)) * 255).round().astype(np.uint8)
    plain = [tmp_path / "a.png", tmp_path / "b.png", tmp_path / "c.png"]
    for path, pixels in zip(plain, [*shown, np.repeat(grey[:, :, None], 3, axis=2)], strict=True):
        Image.fromarray(pixels).save(path)
    # The same three pictures stored otherwise.
    rgba = np.concatenate([shown[0], np.full((28, 42, 1), 255, np.uint8)], axis=2)
    rgba[:, :10] = 0  # transparent black
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a-rgba.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored turned 90° counter-clockwise, shown upright
    Image.fromarray(np.rot90(shown[1])).save(tmp_path / "b-rot.png", exif=exif.tobytes())
    Image.fromarray(grey.astype(np.uint16) * 257).save(tmp_path / "c-16.png")
    other = [tmp_path / "a-rgba.png", tmp_path / "b-rot.png", tmp_path / "c-16.png"]
    assert [Image.open(p).mode for p in other] == ["RGBA", "RGB", "I;16"]

    backend = load_backend(
        str(build_tiny_model("qwen2_vl", tmp_path / "model")), device="cpu", dtype="float32"
    )
    scheme = get_scheme("digits")
    records = [
        next(backend.records([(Item("q", "red", paths, 0), 0, [0, 1, 2])], scheme=scheme))
        for paths in (plain, other)
    ]
    assert records[0].logprobs == records[1].logprobs
    assert records[0].attention == records[1].attention
