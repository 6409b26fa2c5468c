//! Geometric transforms with torchvision's semantics, planned once per
//! image ([`Transform::plan`]) and carried out by the decode stage
//! ([`crate::DecodeTransform`]).
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

use ferrofeed_core::{BoxError, Stage, StageCtx};
use rand::Rng;

use crate::image::{Image, NormalizedImage};

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

impl std::fmt::Display for ResizeTo {
    /// As [`FromStr`](std::str::FromStr) reads it: `N` or `HxW`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResizeTo::Shorter(s) => write!(f, "{s}"),
            ResizeTo::Exact { height, width } => write!(f, "{height}x{width}"),
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
