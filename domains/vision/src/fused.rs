//! The decode-and-transform stage: decode, then a [`Transform`]'s plan —
//! fused for JPEGs into decoding only the region the plan keeps (at a
//! reduced IDCT scale when the output is smaller, through the scan index
//! when one is kept), else a full decode and the same plan.
//!
//! ```
//! use ferrofeed_vision::{DecodeTransform, Transform};
//! let jpeg = ferrofeed_vision::synth::jpeg(1, 3, 90).unwrap();
//! let stage = DecodeTransform::new(Transform::eval(256, 224));
//! let img = stage.run(&jpeg, &mut ferrofeed_core::rng::sample_rng(0)).unwrap();
//! assert_eq!((img.width, img.height), (224, 224));
//! ```
use std::cell::RefCell;
use std::sync::Arc;

use ferrofeed_core::{BoxError, Stage, StageCtx};
use ferrofeed_stages::Bytes;
use rand::Rng;

use crate::cache::ImageCache;
use crate::decode::{decode, DecodeOptions};
use crate::disk_cache::ImageDiskCache;
use crate::image::Image;
use crate::jpeg::{Layout, ScanIndex};
use crate::libjpeg::{RegionInfo, Request};
use crate::transform::{Plan, Transform};

thread_local! {
    /// Each worker's buffer for decoded JPEG regions, reused across images.
    static REGION: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Each worker's buffer for the scan index's stand-in streams.
    static STAND_IN: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// The fused stage `Bytes → Image`: decode, then the transform; with a
/// cache, decoded images are kept by dataset index and later epochs only
/// transform them.
#[derive(Debug, Clone)]
pub struct DecodeTransform {
    /// The transform after decoding.
    pub transform: Transform,
    /// Decoder limits.
    pub decode: DecodeOptions,
    /// Decoded images kept across epochs.
    pub cache: Option<Arc<ImageCache>>,
    /// Decoded images kept on disk across epochs and runs (behind `cache`
    /// when both are set).
    pub disk: Option<Arc<ImageDiskCache>>,
    /// Where each JPEG's MCUs start, kept across epochs (by the sample's
    /// dataset index) so a crop decodes only its own MCUs (see
    /// [`crate::jpeg`]); `None` decodes from the top every time. The first
    /// epoch fills it and runs a little slower; with one pass over the data,
    /// set `None`.
    pub seek: Option<Arc<ScanIndex>>,
}

/// The default byte cap of a [`DecodeTransform`]'s scan index: about 3,600
/// images of 500×375 (~9 KB each).
pub const DEFAULT_SEEK_BYTES: usize = 32 << 20;

impl DecodeTransform {
    /// With default decoder limits and no cache.
    pub fn new(transform: Transform) -> Self {
        DecodeTransform {
            transform,
            decode: DecodeOptions::default(),
            cache: None,
            disk: None,
            seek: Some(ScanIndex::new(DEFAULT_SEEK_BYTES)),
        }
    }

    /// Keeps decoded images in `cache`.
    pub fn with_cache(mut self, cache: Arc<ImageCache>) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Keeps decoded images on disk in `disk`.
    pub fn with_disk_cache(mut self, disk: Arc<ImageDiskCache>) -> Self {
        self.disk = Some(disk);
        self
    }

    /// Runs the stage for dataset sample `index` through the cache: a hit
    /// skips decoding; a miss decodes the whole image and stores it.
    pub fn run_cached(
        &self,
        cache: &ImageCache,
        index: u64,
        bytes: &[u8],
        rng: &mut impl Rng,
    ) -> Result<Image, BoxError> {
        let img = match cache.get(index) {
            Some(img) => img,
            None => {
                let img = Arc::new(self.decode_through_disk(bytes)?);
                cache.insert(index, Arc::clone(&img));
                img
            }
        };
        Ok(self.transform.apply_ref(&img, rng)?)
    }

    /// The decoded image: from the disk cache when it holds it, else
    /// decoded (and stored there).
    fn decode_through_disk(&self, bytes: &[u8]) -> Result<Image, BoxError> {
        let Some(disk) = &self.disk else {
            return Ok(decode(bytes, &self.decode)?);
        };
        let key = disk.key(bytes, &self.decode);
        if let Some(img) = disk.get(&key) {
            return Ok(img);
        }
        let img = decode(bytes, &self.decode)?;
        disk.put(&key, &img);
        Ok(img)
    }
    /// Runs the stage outside a pipeline: the fused path when it applies,
    /// else decode then transform. Both carry out one [`Transform::plan`],
    /// so they pick the same crop and flip.
    pub fn run(&self, bytes: &[u8], rng: &mut impl Rng) -> Result<Image, BoxError> {
        self.run_keyed(bytes, None, rng)
    }

    /// [`run`](Self::run) for dataset sample `key`, whose MCU marks the
    /// scan index keeps (see [`seek`](Self::seek)).
    pub fn run_keyed(
        &self,
        bytes: &[u8],
        key: Option<u64>,
        rng: &mut impl Rng,
    ) -> Result<Image, BoxError> {
        match self.fused(bytes, key, rng)? {
            Fused::Done(img) => Ok(img),
            Fused::Planned(plan) => {
                let img = decode(bytes, &self.decode)?;
                Ok(plan.apply(&img)?)
            }
            Fused::NotApplicable => self.run_unfused(bytes, rng),
        }
    }

    /// Decode the whole image, then transform it.
    pub fn run_unfused(&self, bytes: &[u8], rng: &mut impl Rng) -> Result<Image, BoxError> {
        let img = decode(bytes, &self.decode)?;
        Ok(self.transform.apply(img, rng)?)
    }

    /// Fused decode + crop: decode only the rows and iMCU columns the crop
    /// needs (plus the resampling filter's margin), at 1/2, 1/4 or 1/8 scale
    /// in the IDCT when the crop is at least that many times the output (so
    /// the resize after it still only shrinks, and antialiases). `Ok(None)` when
    /// it does not apply (not a JPEG, EXIF-rotated, CMYK, no libjpeg, or no
    /// transform).
    pub fn run_fused(&self, bytes: &[u8], rng: &mut impl Rng) -> Result<Option<Image>, BoxError> {
        Ok(match self.fused(bytes, None, rng)? {
            Fused::Done(img) => Some(img),
            Fused::NotApplicable | Fused::Planned(_) => None,
        })
    }

    /// Decodes the region `(x, y, w, h)` of sample `key` through the scan
    /// index: only the MCUs it covers, or for a region near the full width
    /// its rows from the first on (see [`crate::jpeg`]). `None` when that
    /// does not apply (no index or key, a layout it cannot seek in, the
    /// index full) or anything fails — the ordinary decode then runs and
    /// reports real errors.
    fn decode_seeking(
        &self,
        bytes: &[u8],
        key: Option<u64>,
        req: &Request,
        buf: &mut Vec<u8>,
    ) -> Option<RegionInfo> {
        let Request {
            x,
            y,
            width: w,
            height: h,
            num,
            ..
        } = *req;
        let index = self.seek.as_ref()?;
        // Without a key nothing is remembered, and marking MCUs only to
        // use them once costs more than it saves.
        let key = key?;
        let layout = Layout::parse(bytes)?;
        // Two output pixels around the region keep their real neighbours
        // for libjpeg's chroma upsampling.
        let margin = 16 / num;
        let (row_px, col_px, mpr) = (layout.row_px(), layout.col_px(), layout.mcus_per_row());
        let row = y.saturating_sub(margin) / row_px;
        let end = (y + h + margin).div_ceil(row_px).min(layout.rows());
        let c0 = x.saturating_sub(margin) / col_px;
        let c1 = (x + w + margin).div_ceil(col_px).min(mpr);
        // A region within `margin` of the left edge has no column to its
        // left for `Layout::crop`'s synthetic one: full width then.
        let full_width = (c0 == 0 && c1 == mpr) || x < margin;
        // The last mark needed: the end of the region's last MCU, or for a
        // full-width region only the start of its first row.
        let upto = if full_width {
            row as usize * mpr as usize
        } else {
            (end as usize - 1) * mpr as usize + c1 as usize
        };
        let marks = index.marks(key, bytes, &layout, upto)?;
        STAND_IN.with(|stream| {
            let mut stream = stream.borrow_mut();
            let crop = if full_width {
                None
            } else {
                layout.crop(bytes, &marks, (row, end, c0, c1), &mut stream)
            };
            // Where the stand-in's first pixel sits in the original, and
            // what libjpeg reads after the stand-in's own bytes.
            let (left, top, rest): (i64, u32, &[u8]) = match crop {
                // `lead` synthetic MCU columns stand left of c0.
                Some(lead) => (i64::from(c0) - i64::from(lead), row, &[]),
                // Full width (or a DC table without the categories a crop
                // needs): a synthetic row stands in for the one before
                // `row`, and libjpeg reads the rest of the file in place.
                None if row >= 2 => {
                    let mark = marks.get((row * mpr) as usize)?;
                    let tail = layout.splice(bytes, mark, row, end, &mut stream)?;
                    (0, row - 1, bytes.get(tail..)?)
                }
                None => return None,
            };
            let (left, top) = (left * i64::from(col_px), top * row_px);
            let moved = Request {
                x: u32::try_from(i64::from(x) - left).ok()?,
                y: y - top,
                ..*req
            };
            let mut info =
                crate::libjpeg::decode_spliced_into(&stream, rest, &moved, buf).ok()??;
            // Stand-in origins are whole MCUs, so they scale exactly.
            info.x = u32::try_from(i64::from(info.x) + left * i64::from(num) / 8).ok()?;
            info.y += top * num / 8;
            Some(info)
        })
    }

    fn fused(&self, bytes: &[u8], key: Option<u64>, rng: &mut impl Rng) -> Result<Fused, BoxError> {
        use crate::decode::{
            check_pixels, has_eoi_or_data, is_jpeg, jpeg_header, Backend, DecodeError,
        };
        if matches!(self.transform, Transform::None)
            || self.decode.backend != Backend::Auto
            || !crate::libjpeg::AVAILABLE
            || !is_jpeg(bytes)
        {
            return Ok(Fused::NotApplicable);
        }
        if !has_eoi_or_data(bytes) {
            return Err(DecodeError::Jpeg(
                "the file ends inside the image data (truncated)".into(),
            )
            .into());
        }
        let head = jpeg_header(bytes);
        check_pixels(
            u64::from(head.width),
            u64::from(head.height),
            self.decode.max_pixels,
        )?;
        if self.decode.apply_exif && head.orientation != 1 {
            return Ok(Fused::NotApplicable);
        }
        // The frame header gives the size; libjpeg's own header pass is
        // needed only where it is missing (a height set by a DNL marker).
        // CMYK and other layouts libjpeg cannot make RGB of come back from
        // the region decode as `None`.
        let (w, h) = if head.width > 0 && head.height > 0 {
            (head.width, head.height)
        } else {
            let Some((w, h)) = crate::libjpeg::header(bytes).map_err(DecodeError::Jpeg)? else {
                return Ok(Fused::NotApplicable);
            };
            check_pixels(u64::from(w), u64::from(h), self.decode.max_pixels)?;
            (w, h)
        };
        let plan = match self.transform.plan(w, h, rng) {
            Some(plan) => plan,
            None => return Ok(Fused::NotApplicable),
        };
        let Plan {
            region,
            width: out_w,
            height: out_h,
            flip,
            ..
        } = plan;
        // The filter reads about one output pixel's worth of source beyond
        // the region on each side.
        let mx = (region.2 / f64::from(out_w)).ceil() as u32 + 1;
        let my = (region.3 / f64::from(out_h)).ceil() as u32 + 1;
        let x0 = (region.0.floor() as u32).saturating_sub(mx);
        let y0 = (region.1.floor() as u32).saturating_sub(my);
        let x1 = (((region.0 + region.2).ceil() as u32) + mx).min(w);
        let y1 = (((region.1 + region.3).ceil() as u32) + my).min(h);
        // The smallest IDCT scale of 1/8, 1/4, 1/2 or 1 that keeps the crop
        // at least as large as the output (libjpeg-turbo has SIMD IDCTs for
        // these; its other M/8 scales are slower than a full decode).
        let need = (f64::from(out_w) / region.2).max(f64::from(out_h) / region.3);
        let num = [1u32, 2, 4, 8]
            .into_iter()
            .find(|&m| f64::from(m) >= need * 8.0)
            .unwrap_or(8);
        let req = Request::new(x0, y0, x1 - x0, y1 - y0)
            .scaled(num)
            .fast(self.decode.fast);
        REGION.with(|buf| -> Result<Fused, BoxError> {
            let mut buf = buf.borrow_mut();
            let r = match self.decode_seeking(bytes, key, &req, &mut buf) {
                Some(r) => r,
                None => {
                    let Some(r) = crate::libjpeg::decode_region_into(bytes, &req, &mut buf)
                        .map_err(DecodeError::Jpeg)?
                    else {
                        return Ok(Fused::Planned(plan));
                    };
                    r
                }
            };
            let d = 8.0 / f64::from(num);
            let (rx, ry) = (f64::from(r.x), f64::from(r.y));
            let (rw, rh) = (f64::from(r.width), f64::from(r.height));
            let left = (region.0 / d - rx).clamp(0.0, rw);
            let top = (region.1 / d - ry).clamp(0.0, rh);
            let inner = (
                left,
                top,
                (region.2 / d).min(rw - left),
                (region.3 / d).min(rh - top),
            );
            let pixels = &buf[..r.width as usize * r.height as usize * 3];
            let out =
                crate::resample::resize(pixels, r.width, r.height, inner, out_w, out_h, flip)?;
            Ok(Fused::Done(Image::new(out_w, out_h, out)?))
        })
    }
}

/// What the fused path did.
enum Fused {
    /// It does not apply (not a JPEG, rotated, another backend, no
    /// transform); nothing was drawn.
    NotApplicable,
    /// The transform was planned but libjpeg cannot decode the image (CMYK):
    /// decode it whole and carry out this plan.
    Planned(Plan),
    /// The output.
    Done(Image),
}

impl Stage for DecodeTransform {
    type In = Bytes;
    type Out = Image;
    /// Decoding bytes in memory fails the same way every time: its errors
    /// are [`Permanent`](ferrofeed_core::Permanent), not retried.
    fn process(&self, bytes: Bytes, ctx: &StageCtx) -> Result<Image, BoxError> {
        match (&self.cache, &self.disk) {
            (Some(cache), _) => self.run_cached(cache, ctx.index(), &bytes, &mut ctx.rng()),
            (None, Some(_)) => self.decode_through_disk(&bytes).and_then(|img| {
                self.transform
                    .apply_ref(&img, &mut ctx.rng())
                    .map_err(BoxError::from)
            }),
            (None, None) => self.run_keyed(&bytes, Some(ctx.index()), &mut ctx.rng()),
        }
        .map_err(ferrofeed_core::Permanent::wrap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrofeed_core::rng::sample_rng;

    fn encode(seed: u64, quality: u8, sampling: jpeg_encoder::SamplingFactor) -> Vec<u8> {
        let img = crate::synth::image(seed, seed);
        let mut out = Vec::new();
        let mut enc = jpeg_encoder::Encoder::new(&mut out, quality);
        enc.set_sampling_factor(sampling);
        enc.encode(
            &img.data,
            img.width as u16,
            img.height as u16,
            jpeg_encoder::ColorType::Rgb,
        )
        .unwrap();
        out
    }

    /// Every region decoded from its iMCU row through the scan index has
    /// the same position and the same pixels as one decoded from the top:
    /// all chroma layouts, grayscale, every IDCT scale, standard and
    /// optimised Huffman tables, first and later passes.
    #[test]
    fn seeking_decodes_the_same_pixels_as_decoding_from_the_top() {
        if !crate::libjpeg::AVAILABLE {
            return;
        }
        use jpeg_encoder::SamplingFactor as S;
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/vision/");
        let mut files: Vec<(String, Vec<u8>)> = [
            "baseline_420",
            "s422",
            "s444",
            "gray",
            "eval_landscape",
            "optimized",
            "chroma_swing",
        ]
        .iter()
        .map(|n| {
            (
                n.to_string(),
                std::fs::read(format!("{dir}{n}.jpg")).unwrap(),
            )
        })
        .collect();
        for (i, (q, smp)) in [
            (90, S::F_2_2),
            (100, S::F_2_2),
            (30, S::F_2_1),
            (75, S::F_1_1),
            (50, S::F_1_2),
        ]
        .into_iter()
        .enumerate()
        {
            files.push((format!("synth q{q} {smp:?}"), encode(i as u64, q, smp)));
        }
        let stage = DecodeTransform::new(Transform::train(8));
        let mut rng = sample_rng(3);
        let (mut seeked, mut indexed) = (0, 0);
        for (key, (name, bytes)) in files.iter().enumerate() {
            assert!(Layout::parse(bytes).is_some(), "{name}: not seekable");
            let (w, h) = (layout_size(bytes).0, layout_size(bytes).1);
            for pass in 0..2 {
                for _ in 0..60 {
                    let num = [1, 2, 4, 8][rng.random_range(0..4)];
                    let y = rng.random_range(0..h - 1);
                    let x = rng.random_range(0..w - 1);
                    let rect = Request::new(
                        x,
                        y,
                        rng.random_range(1..=w - x),
                        rng.random_range(1..=h - y),
                    )
                    .scaled(num);
                    let mut a = Vec::new();
                    let want = crate::libjpeg::decode_region_into(bytes, &rect, &mut a)
                        .unwrap()
                        .unwrap();
                    let key = Some(key as u64);
                    let mut b = Vec::new();
                    let Some(got) = stage.decode_seeking(bytes, key, &rect, &mut b) else {
                        continue;
                    };
                    seeked += 1;
                    indexed += usize::from(pass == 1);
                    assert_eq!(got, want, "{name}: {rect:?} at {num}/8");
                    let n = (want.width * want.height * 3) as usize;
                    assert!(
                        a[..n] == b[..n],
                        "{name}: pixels differ for {rect:?} at {num}/8"
                    );
                }
            }
        }
        assert!(
            seeked > 300 && indexed > 150,
            "{seeked} seeks, {indexed} through the index"
        );
        let index = stage.seek.as_ref().unwrap();
        assert!(index.hits() > 0 && index.bytes() > 0);
    }

    fn layout_size(bytes: &[u8]) -> (u32, u32) {
        let h = crate::decode::jpeg_header(bytes);
        (h.width, h.height)
    }

    #[test]
    fn layouts_that_cannot_be_seeked_are_refused() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/vision/");
        for n in ["restart", "progressive", "cmyk", "empty", "not_an_image"] {
            let bytes = std::fs::read(format!("{dir}{n}.jpg")).unwrap();
            assert!(Layout::parse(&bytes).is_none(), "{n}");
        }
    }
}
