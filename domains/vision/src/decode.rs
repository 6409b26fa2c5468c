//! Decoding: JPEG with `zune-jpeg` (baseline, progressive, grayscale,
//! CMYK/YCCK, any subsampling, restart markers; EXIF orientation applied),
//! other formats with `image`. The header is read first and an image whose
//! header claims more than `max_pixels` is refused before any allocation.
//!
//! ```
//! use ferrofeed_vision::{decode, synth, DecodeOptions};
//! let jpeg = synth::jpeg(1, 0, 90).unwrap();
//! let img = decode(&jpeg, &DecodeOptions::default()).unwrap();
//! assert!(img.width >= 400 && img.height >= 300);
//! let tiny = DecodeOptions { max_pixels: 1000, ..Default::default() };
//! assert!(decode(&jpeg, &tiny).unwrap_err().to_string().contains("pixel limit"));
//! ```
use std::io::Cursor;

use zune_jpeg::zune_core::bytestream::ZCursor;
use zune_jpeg::zune_core::colorspace::ColorSpace;
use zune_jpeg::zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use crate::image::Image;

/// Which JPEG decoder to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The system libjpeg(-turbo) when it was built in (region decoding,
    /// DCT scaling), else zune-jpeg.
    Auto,
    /// zune-jpeg only (pure Rust, whole images).
    Zune,
}

/// Decoder settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodeOptions {
    /// Refuse images whose header claims more pixels than this.
    pub max_pixels: u64,
    /// Rotate/flip according to the EXIF orientation tag.
    pub apply_exif: bool,
    /// JPEG decoder choice.
    pub backend: Backend,
    /// With libjpeg: fast integer IDCT and plain chroma upsampling — faster,
    /// and no longer bit-exact with Pillow's defaults.
    pub fast: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            max_pixels: 100_000_000,
            apply_exif: true,
            backend: Backend::Auto,
            fast: false,
        }
    }
}

/// Why an image could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Zero bytes.
    #[error("empty file (0 bytes)")]
    Empty,
    /// The header claims too many pixels.
    #[error("image header claims {width}x{height} = {pixels} pixels, over the {max} pixel limit (--max-pixels)")]
    TooLarge {
        /// Claimed width.
        width: u64,
        /// Claimed height.
        height: u64,
        /// Their product.
        pixels: u64,
        /// The limit.
        max: u64,
    },
    /// Not a known image format.
    #[error("not an image: unknown format (first bytes {0})")]
    UnknownFormat(String),
    /// A JPEG the decoder rejects (corrupt, truncated, unsupported).
    #[error("corrupt or truncated JPEG: {0}")]
    Jpeg(String),
    /// Another format the decoder rejects.
    #[error("corrupt or unsupported image: {0}")]
    Other(String),
}

pub(crate) fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.len() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF
}

pub(crate) fn check_pixels(width: u64, height: u64, max: u64) -> Result<(), DecodeError> {
    let pixels = width.saturating_mul(height);
    if pixels > max {
        return Err(DecodeError::TooLarge {
            width,
            height,
            pixels,
            max,
        });
    }
    Ok(())
}

fn jpeg_options() -> DecoderOptions {
    DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(1 << 16)
        .set_max_height(1 << 16)
}

/// Width and height from the header alone.
pub fn peek_dimensions(bytes: &[u8]) -> Result<(u32, u32), DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    if is_jpeg(bytes) {
        let (_, w, h) = zune_headers(bytes)?;
        return Ok((w, h));
    }
    let reader = ::image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| DecodeError::Other(e.to_string()))?;
    if reader.format().is_none() {
        return Err(unknown(bytes));
    }
    reader
        .into_dimensions()
        .map_err(|e| DecodeError::Other(e.to_string()))
}

type ZuneDecoder<'a> = JpegDecoder<ZCursor<&'a [u8]>>;

/// A zune-jpeg decoder with its headers read, and the frame size.
fn zune_headers(bytes: &[u8]) -> Result<(ZuneDecoder<'_>, u32, u32), DecodeError> {
    let mut d = JpegDecoder::new_with_options(ZCursor::new(bytes), jpeg_options());
    d.decode_headers()
        .map_err(|e| DecodeError::Jpeg(format!("{e:?}")))?;
    let info = d
        .info()
        .ok_or_else(|| DecodeError::Jpeg("no frame header".into()))?;
    Ok((d, u32::from(info.width), u32::from(info.height)))
}

fn unknown(bytes: &[u8]) -> DecodeError {
    let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
    DecodeError::UnknownFormat(head.join(" "))
}

/// Decodes `bytes` to RGB.
pub fn decode(bytes: &[u8], opts: &DecodeOptions) -> Result<Image, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    if is_jpeg(bytes) {
        return decode_jpeg(bytes, opts);
    }
    let mut reader = ::image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| DecodeError::Other(e.to_string()))?;
    if reader.format().is_none() {
        return Err(unknown(bytes));
    }
    let (w, h) = peek_dimensions(bytes)?;
    check_pixels(u64::from(w), u64::from(h), opts.max_pixels)?;
    let mut limits = ::image::Limits::default();
    limits.max_alloc = Some(opts.max_pixels.saturating_mul(8).max(1 << 20));
    reader.limits(limits);
    let img = reader
        .decode()
        .map_err(|e| DecodeError::Other(e.to_string()))?
        .to_rgb8();
    let (w, h) = img.dimensions();
    Image::new(w, h, img.into_raw()).map_err(DecodeError::Other)
}

fn decode_jpeg(bytes: &[u8], opts: &DecodeOptions) -> Result<Image, DecodeError> {
    if !has_eoi_or_data(bytes) {
        return Err(DecodeError::Jpeg(
            "the file ends inside the image data (truncated)".into(),
        ));
    }
    let head = jpeg_header(bytes);
    check_pixels(
        u64::from(head.width),
        u64::from(head.height),
        opts.max_pixels,
    )?;
    let orientation = if opts.apply_exif { head.orientation } else { 1 };
    if opts.backend == Backend::Auto && crate::libjpeg::AVAILABLE {
        if let Some((w, h)) = crate::libjpeg::header(bytes).map_err(DecodeError::Jpeg)? {
            check_pixels(u64::from(w), u64::from(h), opts.max_pixels)?;
            if let Some(r) = crate::libjpeg::decode_region(
                bytes,
                &crate::libjpeg::Request::new(0, 0, w, h).fast(opts.fast),
            )
            .map_err(DecodeError::Jpeg)?
            {
                let img =
                    Image::new(r.info.width, r.info.height, r.data).map_err(DecodeError::Jpeg)?;
                return Ok(orient(img, orientation));
            }
        }
    }
    let (mut d, w, h) = zune_headers(bytes)?;
    check_pixels(u64::from(w), u64::from(h), opts.max_pixels)?;
    if !has_eoi_or_data(bytes) {
        return Err(DecodeError::Jpeg(
            "the file ends inside the image data (truncated)".into(),
        ));
    }
    let data = d
        .decode()
        .map_err(|e| DecodeError::Jpeg(format!("{e:?}")))?;
    let img = Image::new(w, h, data).map_err(DecodeError::Jpeg)?;
    Ok(orient(img, orientation))
}

/// A JPEG that stops before its end-of-image marker is truncated: the
/// decoder would fill the rest with grey, silently.
pub(crate) fn has_eoi_or_data(bytes: &[u8]) -> bool {
    // Trailing padding after EOI is common; look at the last 64 bytes.
    let tail = &bytes[bytes.len().saturating_sub(64)..];
    tail.windows(2).any(|w| w == [0xFF, 0xD9])
}

/// What the marker segments before a JPEG's image data say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    /// Width from the frame header (0 when none was found).
    pub width: u32,
    /// Height from the frame header.
    pub height: u32,
    /// EXIF orientation, 1–8 (1 when absent).
    pub orientation: u32,
}

/// Walks the marker segments up to the first scan: frame size and EXIF
/// orientation, without decoding anything.
pub fn jpeg_header(bytes: &[u8]) -> JpegHeader {
    let mut h = JpegHeader {
        width: 0,
        height: 0,
        orientation: 1,
    };
    let mut i = 2;
    while i + 4 <= bytes.len() {
        if bytes[i] != 0xFF {
            break;
        }
        let marker = bytes[i + 1];
        if marker == 0xFF {
            i += 1;
            continue;
        }
        if marker == 0xDA || marker == 0xD9 {
            break; // start of scan / end of image
        }
        let len = usize::from(u16::from_be_bytes([bytes[i + 2], bytes[i + 3]]));
        if len < 2 {
            break; // a segment length counts its own two bytes: malformed
        }
        let seg = &bytes[(i + 4).min(bytes.len())..(i + 2 + len).min(bytes.len())];
        let is_sof = matches!(marker, 0xC0..=0xCF) && !matches!(marker, 0xC4 | 0xC8 | 0xCC);
        if is_sof && seg.len() >= 5 && h.width == 0 {
            h.height = u32::from(u16::from_be_bytes([seg[1], seg[2]]));
            h.width = u32::from(u16::from_be_bytes([seg[3], seg[4]]));
        } else if marker == 0xE1 && seg.starts_with(b"Exif\0\0") && h.orientation == 1 {
            h.orientation = exif_orientation(&seg[6..]);
        }
        i += 2 + len;
    }
    h
}

/// The EXIF orientation of a JPEG (1–8; 1 when absent).
pub fn jpeg_orientation(bytes: &[u8]) -> u32 {
    jpeg_header(bytes).orientation
}

/// The EXIF orientation (1–8), 1 when absent or unreadable.
fn exif_orientation(tiff: &[u8]) -> u32 {
    let Ok(exif) = exif::Reader::new().read_raw(tiff.to_vec()) else {
        return 1;
    };
    exif.get_field(exif::Tag::Orientation, exif::In::PRIMARY)
        .and_then(|f| f.value.get_uint(0))
        .filter(|o| (1..=8).contains(o))
        .unwrap_or(1)
}

/// Applies an EXIF orientation so the image displays upright.
pub fn orient(img: Image, orientation: u32) -> Image {
    if orientation <= 1 || orientation > 8 {
        return img;
    }
    let (w, h) = (img.width as usize, img.height as usize);
    let transposed = orientation >= 5;
    let (nw, nh) = if transposed { (h, w) } else { (w, h) };
    let mut out = vec![0u8; img.data.len()];
    for y in 0..nh {
        for x in 0..nw {
            // Source coordinates for destination (x, y).
            let (sx, sy) = match orientation {
                2 => (w - 1 - x, y),
                3 => (w - 1 - x, h - 1 - y),
                4 => (x, h - 1 - y),
                5 => (y, x),
                6 => (y, h - 1 - x),
                7 => (w - 1 - y, h - 1 - x),
                _ => (w - 1 - y, x),
            };
            let s = (sy * w + sx) * 3;
            let d = (y * nw + x) * 3;
            out[d..d + 3].copy_from_slice(&img.data[s..s + 3]);
        }
    }
    Image {
        width: nw as u32,
        height: nh as u32,
        data: out,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Image {
        // 3×2: pixel value = 10*y + x in every channel.
        let data = (0..2)
            .flat_map(|y| (0..3).flat_map(move |x| [10 * y + x; 3]))
            .collect();
        Image::new(3, 2, data).unwrap()
    }

    #[test]
    fn orientations_match_their_definitions() {
        let top_left = |i: &Image| i.pixel(0, 0)[0];
        assert_eq!(top_left(&orient(sample(), 2)), 2);
        assert_eq!(top_left(&orient(sample(), 3)), 12);
        assert_eq!(top_left(&orient(sample(), 4)), 10);
        let r6 = orient(sample(), 6); // rotate 90° clockwise
        assert_eq!((r6.width, r6.height), (2, 3));
        assert_eq!(r6.pixel(0, 0)[0], 10);
        assert_eq!(r6.pixel(1, 0)[0], 0);
        let r8 = orient(sample(), 8); // rotate 90° counter-clockwise
        assert_eq!(r8.pixel(0, 0)[0], 2);
    }

    #[test]
    fn bad_inputs_are_named_errors() {
        let o = DecodeOptions::default();
        assert!(matches!(decode(&[], &o), Err(DecodeError::Empty)));
        assert!(matches!(
            decode(b"hello world", &o),
            Err(DecodeError::UnknownFormat(_))
        ));
        let jpeg = crate::synth::jpeg(3, 1, 90).unwrap();
        let cut = &jpeg[..jpeg.len() / 2];
        assert!(
            matches!(decode(cut, &o), Err(DecodeError::Jpeg(_))),
            "truncated"
        );
        let mut garbage = jpeg.clone();
        for b in garbage.iter_mut().skip(700).take(4000) {
            *b = 0x5A;
        }
        // Corrupt entropy data either errors or decodes to noise; it must not panic.
        let _ = decode(&garbage, &o);
    }
}
