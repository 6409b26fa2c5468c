"""The HTML report rendered by a real browser: headless Chromium (Debian's
`chromium`, installed by .ci/run) loads the page from a file with no server
and takes a screenshot, which must show the page and plots with data."""

import os
import re
import shutil
import subprocess

import pytest

import ferrofeed

PALETTE = ["#1f77b4", "#e8710a", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    pytest.fail("headless Chromium is needed for this test (Debian: apt-get install chromium)")


def screenshot(html, png, scheme="light"):
    subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1320,2000", f"--blink-settings=preferredColorScheme={0 if scheme == 'dark' else 1}",
         f"--screenshot={png}", f"file://{html}"],
        check=True, capture_output=True, timeout=120,
    )
    from PIL import Image

    return Image.open(png).convert("RGB")


def colour_pixels(img, hexes, box):
    want = {tuple(int(h[i:i + 2], 16) for i in (1, 3, 5)) for h in hexes}
    crop = img.crop(box)
    hits = 0
    for px in (crop.get_flattened_data() if hasattr(crop, "get_flattened_data") else crop.getdata()):
        if any(sum(abs(a - b) for a, b in zip(px, w)) < 40 for w in want):
            hits += 1
    return hits


@pytest.fixture(scope="module")
def page(vision_dir, tmp_path_factory):
    loader = ferrofeed.vision(vision_dir, batch_size=4, transform="eval", size=64, resize=72)
    for _ in loader:
        pass
    path = tmp_path_factory.mktemp("html") / "report.html"
    loader.report_html(path)
    return path


def test_the_page_holds_no_external_reference(page):
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>")
    for bad in ("http://", "https://", "src=\"//", "href=", "@import", "<script", "<link", "url("):
        assert bad not in html, bad
    srcs = re.findall(r'src="([^"]*)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_chromium_renders_the_page_with_plots(page, tmp_path, scheme):
    img = screenshot(page, tmp_path / f"{scheme}.png", scheme)
    w, h = img.size
    # Not blank: many distinct colours over the page.
    colours = img.resize((w // 4, h // 4)).getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "the page rendered blank"
    bg = img.getpixel((w - 2, h - 2))
    assert (sum(bg) < 200) == (scheme == "dark"), f"background {bg} in the {scheme} theme"
    # The plots (below the headline and the stage table) draw lines in the
    # stages' colours.
    assert colour_pixels(img, PALETTE, (0, 300, w, min(h, 1300))) > 300, "no plotted data"


def test_text_and_audio_pages(text_file, audio_dir, tmp_path):
    for loader, unit in [
        (ferrofeed.text(text_file, batch_size=16), "sequences/s"),
        (ferrofeed.audio(audio_dir, batch_size=4, chunk_seconds=1), "chunks/s"),
    ]:
        for _ in loader:
            pass
        p = tmp_path / f"{loader.domain}.html"
        loader.report_html(p)
        html = p.read_text()
        assert unit in html and f"ferrofeed {loader.domain}" in html and "<svg" in html
        assert "https://" not in html and "<script" not in html


def test_report_html_before_an_epoch_is_an_error(text_file, tmp_path):
    with pytest.raises(RuntimeError):
        ferrofeed.text(text_file).report_html(tmp_path / "x.html")
