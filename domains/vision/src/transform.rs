//! Geometric transforms with torchvision's semantics, and the fused
//! decode-and-transform stage.
//!
//! - `Train`: RandomResizedCrop(size, scale 0.08–1, ratio 3/4–4/3; ten
//!   tries, then the centre fallback) and a horizontal flip with p = 0.5.
//! - `Eval`: Resize(shorter side → `resize`, or to an exact height × width;
//!   bilinear with antialias) then CenterCrop(`size`), fused into one
//!   resampling of just the pixels that survive the crop. Sizes and the crop
//!   origin follow torchvision's arithmetic exactly, Python's
//!   round-half-to-even included.
//! - `None`: decode only.
//!
//! Resampling ([`crate::resample`]) is a bilinear filter whose support
//! widens when downscaling — the antialiased bilinear of Pillow and of
//! torchvision's `Resize(antialias=True)`.
//!
//! ```
//! use ferrofeed_vision::{center_crop_box, eval_resize_size};
//! assert_eq!(eval_resize_size(500, 375, 256), (341, 256));
//! // (341 - 224) / 2 = 58.5 rounds to even, as Python's `round` does.
//! let b = center_crop_box(341, 256, 224);
//! assert_eq!((b.left, b.top, b.width, b.height), (58, 16, 224, 224));
//! ```
use std::cell::RefCell;
use std::sync::Arc;

use ferrofeed_core::{BoxError, Stage, StageCtx};
use ferrofeed_stages::Bytes;
use rand::Rng;

use crate::cache::ImageCache;
use crate::decode::{decode, DecodeOptions};
use crate::image::{Image, NormalizedImage};
use crate::jpeg::{Layout, ScanIndex};
use crate::libjpeg::{RegionInfo, Request};

/// A crop rectangle in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CropBox {
    /// First column.
    pub left: u32,
    /// First row.
    pub top: u32,
    /// Columns.
    pub width: u32,
    /// Rows.
    pub height: u32,
}

impl CropBox {
    /// `(left, top, width, height)` as the resampler's region.
    pub fn region(&self) -> (f64, f64, f64, f64) {
        (
            f64::from(self.left),
            f64::from(self.top),
            f64::from(self.width),
            f64::from(self.height),
        )
    }
}

/// torchvision's `RandomResizedCrop.get_params`: ten tries at a random area
/// fraction in `scale` and log-uniform aspect ratio in `ratio`, then the
/// centre crop clamped to the ratio range.
pub fn random_resized_crop_box(
    rng: &mut impl Rng,
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
) -> CropBox {
    let (w, h) = (f64::from(width), f64::from(height));
    let area = w * h;
    let (lr0, lr1) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * rng.random_range(scale.0..=scale.1);
        let aspect = rng.random_range(lr0..=lr1).exp();
        let cw = (target * aspect).sqrt().round();
        let ch = (target / aspect).sqrt().round();
        if cw > 0.0 && ch > 0.0 && cw <= w && ch <= h {
            let (cw, ch) = (cw as u32, ch as u32);
            let top = rng.random_range(0..=height - ch);
            let left = rng.random_range(0..=width - cw);
            return CropBox {
                left,
                top,
                width: cw,
                height: ch,
            };
        }
    }
    let in_ratio = w / h;
    let (cw, ch) = if in_ratio < ratio.0 {
        (w, (w / ratio.0).round())
    } else if in_ratio > ratio.1 {
        ((h * ratio.1).round(), h)
    } else {
        (w, h)
    };
    let (cw, ch) = ((cw as u32).clamp(1, width), (ch as u32).clamp(1, height));
    CropBox {
        left: (width - cw) / 2,
        top: (height - ch) / 2,
        width: cw,
        height: ch,
    }
}

/// torchvision's `Resize(size)` output for an int size: the shorter side
/// becomes `size`, the longer `int(size * long / short)`.
pub fn eval_resize_size(width: u32, height: u32, size: u32) -> (u32, u32) {
    if width <= height {
        let nh = (u64::from(size) * u64::from(height) / u64::from(width.max(1))) as u32;
        (size, nh.max(1))
    } else {
        let nw = (u64::from(size) * u64::from(width) / u64::from(height.max(1))) as u32;
        (nw.max(1), size)
    }
}

/// The size argument of torchvision's `Resize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeTo {
    /// `Resize(int)`: the shorter side becomes this, the aspect is kept.
    Shorter(u32),
    /// `Resize((h, w))`: exactly this size, the aspect is not kept.
    Exact {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
}

impl ResizeTo {
    /// The resized `(width, height)` of a `width × height` image.
    pub fn size_of(self, width: u32, height: u32) -> (u32, u32) {
        match self {
            ResizeTo::Shorter(s) => eval_resize_size(width, height, s),
            ResizeTo::Exact { height, width } => (width, height),
        }
    }
    /// The smaller side of any output (the largest center crop possible).
    fn min_side(self) -> u32 {
        match self {
            ResizeTo::Shorter(s) => s,
            ResizeTo::Exact { height, width } => height.min(width),
        }
    }
}

impl std::str::FromStr for ResizeTo {
    type Err = String;
    /// `N` (shorter side) or `HxW` (exact height and width).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("resize {s:?}: expected N (shorter side) or HxW, e.g. 256 or 256x320");
        match s.split_once(['x', 'X']) {
            None => s.trim().parse().map(ResizeTo::Shorter).map_err(|_| bad()),
            Some((h, w)) => Ok(ResizeTo::Exact {
                height: h.trim().parse().map_err(|_| bad())?,
                width: w.trim().parse().map_err(|_| bad())?,
            }),
        }
    }
}

/// torchvision's `CenterCrop(size)` box: `top = int(round((h - size) / 2))`
/// with Python's `round`, which rounds halves to even (58.5 → 58).
pub fn center_crop_box(width: u32, height: u32, size: u32) -> CropBox {
    let size_w = size.min(width);
    let size_h = size.min(height);
    CropBox {
        left: (f64::from(width - size_w) / 2.0).round_ties_even() as u32,
        top: (f64::from(height - size_h) / 2.0).round_ties_even() as u32,
        width: size_w,
        height: size_h,
    }
}

/// Resize(`resize`) + CenterCrop(`size`) as one step: the source region
/// (fractional, in the original image) that survives the crop, and the
/// output size.
fn eval_region(
    width: u32,
    height: u32,
    resize: ResizeTo,
    size: u32,
) -> ((f64, f64, f64, f64), u32, u32) {
    let (nw, nh) = resize.size_of(width, height);
    let b = center_crop_box(nw, nh, size);
    // Map the crop in the resized frame back to the source.
    let sx = f64::from(width) / f64::from(nw);
    let sy = f64::from(height) / f64::from(nh);
    let region = (
        f64::from(b.left) * sx,
        f64::from(b.top) * sy,
        f64::from(b.width) * sx,
        f64::from(b.height) * sy,
    );
    (region, b.width, b.height)
}

thread_local! {
    /// Each worker's buffer for decoded JPEG regions, reused across images.
    static REGION: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Each worker's buffer for the scan index's stand-in streams.
    static STAND_IN: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Resamples the region `(left, top, width, height)` of `img` (fractional
/// coordinates allowed) to `out_w × out_h` with antialiased bilinear.
pub fn resize_crop(
    img: &Image,
    region: (f64, f64, f64, f64),
    out_w: u32,
    out_h: u32,
) -> Result<Image, String> {
    Image::new(
        out_w,
        out_h,
        crate::resample::resize(
            &img.data, img.width, img.height, region, out_w, out_h, false,
        )?,
    )
}

/// What to do after decoding.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transform {
    /// Decode only.
    None,
    /// Resize (torchvision's `Resize(resize)`), then center-crop `size`.
    Eval {
        /// The size to resize to.
        resize: ResizeTo,
        /// Output side.
        size: u32,
    },
    /// RandomResizedCrop to `size` and a horizontal flip.
    Train {
        /// Output side.
        size: u32,
        /// Area fraction range.
        scale: (f64, f64),
        /// Aspect ratio range.
        ratio: (f64, f64),
        /// Flip probability.
        flip_p: f64,
    },
}

/// One image's transform, drawn: the source region to resample, the
/// output size and whether to flip (see [`Transform::plan`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Plan {
    /// The source image's `(width, height)` the plan was made for.
    pub source: (u32, u32),
    /// `(left, top, width, height)` in source pixels (fractional).
    pub region: (f64, f64, f64, f64),
    /// Output width.
    pub width: u32,
    /// Output height.
    pub height: u32,
    /// Mirror left to right.
    pub flip: bool,
}

impl Plan {
    /// Resamples the plan's region of `img` (antialiased bilinear) to the
    /// output size; an error when `img` is not the size the plan was made
    /// for.
    pub fn apply(&self, img: &Image) -> Result<Image, String> {
        if (img.width, img.height) != self.source {
            return Err(format!(
                "a transform planned for {}x{} was given a {}x{} image",
                self.source.0, self.source.1, img.width, img.height
            ));
        }
        Image::new(
            self.width,
            self.height,
            crate::resample::resize(
                &img.data,
                img.width,
                img.height,
                self.region,
                self.width,
                self.height,
                self.flip,
            )?,
        )
    }
}

impl Transform {
    /// torchvision's training defaults at `size`.
    pub fn train(size: u32) -> Self {
        Transform::Train {
            size,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip_p: 0.5,
        }
    }
    /// Resize the shorter side to `resize`, center-crop `size`.
    pub fn eval(resize: u32, size: u32) -> Self {
        Transform::Eval {
            resize: ResizeTo::Shorter(resize),
            size,
        }
    }
    /// Resize to exactly `height × width`, center-crop `size`.
    pub fn eval_exact(height: u32, width: u32, size: u32) -> Self {
        Transform::Eval {
            resize: ResizeTo::Exact { height, width },
            size,
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Transform::None => Ok(()),
            Transform::Eval { resize, size } => {
                if size == 0 || resize.min_side() == 0 {
                    Err("--size and --resize must be at least 1".into())
                } else if size > resize.min_side() {
                    Err(format!("--size {size} is larger than the resized image's shorter side {}: the center crop would need padding", resize.min_side()))
                } else {
                    Ok(())
                }
            }
            Transform::Train {
                size,
                scale,
                ratio,
                flip_p,
            } => {
                if size == 0 {
                    Err("--size must be at least 1".into())
                } else if !(0.0 < scale.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                    Err(format!("scale {scale:?} must satisfy 0 < min <= max <= 1"))
                } else if !(0.0 < ratio.0 && ratio.0 <= ratio.1) {
                    Err(format!("ratio {ratio:?} must satisfy 0 < min <= max"))
                } else if !(0.0..=1.0).contains(&flip_p) {
                    Err(format!("flip probability {flip_p} is not in [0, 1]"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Applies the transform to a decoded image; random draws come from
    /// `rng` (in the pipeline: the sample's `(seed, epoch, index)` RNG).
    pub fn apply(&self, img: Image, rng: &mut impl Rng) -> Result<Image, String> {
        match self {
            Transform::None => Ok(img),
            _ => self.apply_ref(&img, rng),
        }
    }

    /// [`apply`](Self::apply) to a borrowed image (e.g. one held by a cache).
    pub fn apply_ref(&self, img: &Image, rng: &mut impl Rng) -> Result<Image, String> {
        match self.plan(img.width, img.height, rng) {
            None => Ok(img.clone()),
            Some(plan) => plan.apply(img),
        }
    }

    /// What the transform does to a `width × height` image, with its random
    /// draws (crop, flip) made now from `rng`; `None` for
    /// [`Transform::None`]. The fused path (decode only the region) and the
    /// unfused one (decode all, then resample) both carry out a plan, so
    /// they agree by construction.
    ///
    /// ```
    /// use ferrofeed_vision::Transform;
    /// let mut rng = ferrofeed_core::rng::sample_rng(0);
    /// let plan = Transform::eval(256, 224).plan(500, 375, &mut rng).unwrap();
    /// assert_eq!((plan.width, plan.height, plan.flip), (224, 224, false));
    /// ```
    pub fn plan(&self, width: u32, height: u32, rng: &mut impl Rng) -> Option<Plan> {
        let (region, out_w, out_h, flip) = match *self {
            Transform::None => return None,
            Transform::Eval { resize, size } => {
                let (region, w, h) = eval_region(width, height, resize, size);
                (region, w, h, false)
            }
            Transform::Train {
                scale,
                ratio,
                flip_p,
                size,
            } => {
                let b = random_resized_crop_box(rng, width, height, scale, ratio);
                let flip = rng.random::<f64>() < flip_p;
                (b.region(), size, size, flip)
            }
        };
        Some(Plan {
            source: (width, height),
            region,
            width: out_w,
            height: out_h,
            flip,
        })
    }

    /// The unfused eval path (resize the whole image, then crop), kept to
    /// check the fused one against.
    pub fn eval_unfused(img: &Image, resize: ResizeTo, size: u32) -> Result<Image, String> {
        let (nw, nh) = resize.size_of(img.width, img.height);
        let full = resize_crop(
            img,
            (0.0, 0.0, f64::from(img.width), f64::from(img.height)),
            nw,
            nh,
        )?;
        let b = center_crop_box(nw, nh, size);
        let mut data = Vec::with_capacity((b.width * b.height * 3) as usize);
        for y in b.top..b.top + b.height {
            let row = (y * nw + b.left) as usize * 3;
            data.extend_from_slice(&full.data[row..row + b.width as usize * 3]);
        }
        Image::new(b.width, b.height, data)
    }
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
            seek: Some(ScanIndex::new(DEFAULT_SEEK_BYTES)),
        }
    }

    /// Keeps decoded images in `cache`.
    pub fn with_cache(mut self, cache: Arc<ImageCache>) -> Self {
        self.cache = Some(cache);
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
                let img = Arc::new(decode(bytes, &self.decode)?);
                cache.insert(index, Arc::clone(&img));
                img
            }
        };
        Ok(self.transform.apply_ref(&img, rng)?)
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
    fn process(&self, bytes: Bytes, ctx: &StageCtx) -> Result<Image, BoxError> {
        match &self.cache {
            Some(cache) => self.run_cached(cache, ctx.index(), &bytes, &mut ctx.rng()),
            None => self.run_keyed(&bytes, Some(ctx.index()), &mut ctx.rng()),
        }
    }
}

/// `Image → NormalizedImage`: `(v / 255 - mean) / std` per channel, CHW.
#[derive(Debug, Clone, Copy)]
pub struct Normalize {
    /// Channel means (0–1 scale).
    pub mean: [f32; 3],
    /// Channel standard deviations (0–1 scale).
    pub std: [f32; 3],
}

impl Normalize {
    /// ImageNet statistics.
    pub fn imagenet() -> Self {
        Normalize {
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
        }
    }
}

impl Stage for Normalize {
    type In = Image;
    type Out = NormalizedImage;
    fn process(&self, img: Image, _ctx: &StageCtx) -> Result<NormalizedImage, BoxError> {
        let plane = img.width as usize * img.height as usize;
        let mut data = vec![0f32; plane * 3];
        let scale: [f32; 3] = std::array::from_fn(|c| 1.0 / (255.0 * self.std[c]));
        let shift: [f32; 3] = std::array::from_fn(|c| self.mean[c] / self.std[c]);
        for (i, px) in img.data.chunks_exact(3).enumerate() {
            for c in 0..3 {
                data[c * plane + i] = f32::from(px[c]) * scale[c] - shift[c];
            }
        }
        Ok(NormalizedImage {
            width: img.width,
            height: img.height,
            data,
        })
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

    #[test]
    fn rrc_boxes_respect_scale_and_ratio() {
        let mut rng = sample_rng(1);
        for _ in 0..2000 {
            let b = random_resized_crop_box(&mut rng, 500, 375, (0.08, 1.0), (0.75, 4.0 / 3.0));
            assert!(b.left + b.width <= 500 && b.top + b.height <= 375);
            let frac = f64::from(b.width * b.height) / (500.0 * 375.0);
            assert!((0.07..=1.0).contains(&frac), "area {frac}");
            let r = f64::from(b.width) / f64::from(b.height);
            assert!((0.74..=1.35).contains(&r), "ratio {r}");
        }
        // An extreme aspect falls back to the centre crop clamped to the ratio.
        let b = random_resized_crop_box(&mut rng, 1000, 10, (0.9, 1.0), (0.75, 4.0 / 3.0));
        assert_eq!((b.height, b.width), (10, 13));
    }

    #[test]
    fn eval_sizes_follow_torchvision() {
        assert_eq!(eval_resize_size(375, 500, 256), (256, 341));
        assert_eq!(eval_resize_size(256, 256, 256), (256, 256));
        assert_eq!(center_crop_box(256, 341, 224).top, 58);
        assert_eq!(center_crop_box(256, 343, 224).top, 60);
        assert!(Transform::eval(200, 224).validate().is_err());
        assert!(Transform::eval_exact(300, 200, 224).validate().is_err());
        assert!(Transform::eval_exact(300, 240, 224).validate().is_ok());
        assert_eq!("256".parse(), Ok(ResizeTo::Shorter(256)));
        assert_eq!(
            "300x240".parse(),
            Ok(ResizeTo::Exact {
                height: 300,
                width: 240
            })
        );
        assert!("256x".parse::<ResizeTo>().is_err());
        assert!("wide".parse::<ResizeTo>().is_err());
    }

    /// Python's `round`: halves go to the even neighbour.
    fn py_round(x: f64) -> f64 {
        let f = x.floor();
        let d = x - f;
        if d > 0.5 || (d == 0.5 && f % 2.0 != 0.0) {
            f + 1.0
        } else {
            f
        }
    }

    /// torchvision's arithmetic as its Python source writes it:
    /// `_compute_resized_output_size` (float division, then `int`) and
    /// `center_crop` (`int(round((h - ch) / 2.0))`, Python's round-half-even).
    fn torchvision_eval(w: u32, h: u32, resize: u32, crop: u32) -> (u32, u32, u32, u32) {
        let (short, long) = if w <= h { (w, h) } else { (h, w) };
        let new_long = (f64::from(resize) * f64::from(long) / f64::from(short)) as u32;
        let (nw, nh) = if w <= h {
            (resize, new_long)
        } else {
            (new_long, resize)
        };
        let top = py_round(f64::from(nh - crop) / 2.0) as u32;
        let left = py_round(f64::from(nw - crop) / 2.0) as u32;
        (nw, nh, left, top)
    }

    #[test]
    fn eval_sizes_and_crop_origin_match_torchvision_for_every_side_from_200_to_1000() {
        for w in 200..=1000u32 {
            for h in 200..=1000u32 {
                let (nw, nh) = ResizeTo::Shorter(256).size_of(w, h);
                let b = center_crop_box(nw, nh, 224);
                assert_eq!(
                    (nw, nh, b.left, b.top),
                    torchvision_eval(w, h, 256, 224),
                    "{w}x{h}"
                );
            }
        }
        // Resize((h, w)) keeps exactly the size asked for; the crop origin
        // follows the same rounding.
        for side in 224..=1000u32 {
            let (height, width) = (side, 1224 - side);
            let r = ResizeTo::Exact { height, width };
            assert_eq!(r.size_of(640, 480), (width, height));
            let b = center_crop_box(width, height, 224);
            let want = (
                py_round(f64::from(width - 224) / 2.0) as u32,
                py_round(f64::from(height - 224) / 2.0) as u32,
            );
            assert_eq!((b.left, b.top), want, "{height}x{width}");
        }
    }

    #[test]
    fn normalize_matches_the_formula() {
        let img = Image::new(1, 1, vec![0, 128, 255]).unwrap();
        let cancel = std::sync::atomic::AtomicBool::new(false);
        let ctx = StageCtx::detached(0, 0, 0, &cancel);
        let n = Normalize::imagenet().process(img, &ctx).unwrap();
        assert!((n.data[0] - (-0.485 / 0.229)).abs() < 1e-5);
        assert!((n.data[2] - ((1.0 - 0.406) / 0.225)).abs() < 1e-5);
    }
}
