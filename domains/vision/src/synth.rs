//! Deterministic synthetic images with natural-image statistics (gradients,
//! overlapping shapes, texture and sensor-like noise — flat colour would
//! decode unrealistically fast), and the ImageNet-like folder built from them.
//!
//! ```
//! use ferrofeed_vision::synth;
//! let a = synth::image(5, 17);
//! assert_eq!(a, synth::image(5, 17), "a pure function of (seed, index)");
//! assert_ne!(a, synth::image(6, 17));
//! assert_eq!(synth::class_of(17), 7);
//! ```
use std::path::Path;

use ferrofeed_core::rng::{derive_seed, sample_rng};
use rand::Rng;

use crate::image::Image;

/// Number of classes in the synthetic dataset.
pub const CLASSES: usize = 10;

/// The class of image `index`.
pub fn class_of(index: u64) -> usize {
    (index % CLASSES as u64) as usize
}

/// The class folder name of class `c`.
pub fn class_name(c: usize) -> String {
    format!("class_{c:02}")
}

/// Image `index` of the dataset drawn with `seed`: about 500×375, content
/// themed by its class.
pub fn image(seed: u64, index: u64) -> Image {
    let mut rng = sample_rng(derive_seed(&[seed, index, 0x5359_4E54]));
    let class = class_of(index) as f32;
    let w: u32 = rng.random_range(440..=520);
    let h: u32 = rng.random_range(330..=400);
    // Class palette: a base hue per class, jittered per image.
    let hue = class / CLASSES as f32 + rng.random_range(-0.04..0.04);
    let c0 = hsv(hue, rng.random_range(0.3..0.8), rng.random_range(0.5..0.95));
    let c1 = hsv(
        hue + 0.5,
        rng.random_range(0.2..0.6),
        rng.random_range(0.2..0.6),
    );
    let angle: f32 = rng.random_range(0.0..std::f32::consts::TAU);
    let (ca, sa) = (angle.cos(), angle.sin());
    let diag = ((w * w + h * h) as f32).sqrt();

    struct Shape {
        cx: f32,
        cy: f32,
        rx: f32,
        ry: f32,
        rect: bool,
        color: [f32; 3],
        alpha: f32,
    }
    let shapes: Vec<Shape> = (0..rng.random_range(6..14))
        .map(|_| Shape {
            cx: rng.random_range(0.0..w as f32),
            cy: rng.random_range(0.0..h as f32),
            rx: rng.random_range(12.0..w as f32 / 3.0),
            ry: rng.random_range(12.0..h as f32 / 3.0),
            rect: rng.random_bool(0.4),
            color: hsv(
                hue + rng.random_range(-0.15..0.15),
                rng.random_range(0.2..1.0),
                rng.random_range(0.1..1.0),
            ),
            alpha: rng.random_range(0.5..0.95),
        })
        .collect();
    let (fx, fy): (f32, f32) = (rng.random_range(0.02..0.25), rng.random_range(0.02..0.25));
    let tex_amp: f32 = rng.random_range(6.0..22.0);
    let noise_amp: f32 = rng.random_range(10.0..18.0);
    // Fine detail (foliage, fabric): a high-frequency pattern of its own.
    let (gx, gy): (f32, f32) = (rng.random_range(0.6..1.6), rng.random_range(0.6..1.6));
    let fine_amp: f32 = rng.random_range(6.0..16.0);

    let mut data = vec![0u8; (w * h * 3) as usize];
    let mut state = derive_seed(&[seed, index, 0x4E4F_4953]);
    for y in 0..h {
        for x in 0..w {
            let (xf, yf) = (x as f32, y as f32);
            let t = ((xf * ca + yf * sa) / diag + 0.5).clamp(0.0, 1.0);
            let mut px = [0f32; 3];
            for c in 0..3 {
                px[c] = c0[c] * (1.0 - t) + c1[c] * t;
            }
            for s in &shapes {
                let (dx, dy) = ((xf - s.cx) / s.rx, (yf - s.cy) / s.ry);
                let inside = if s.rect {
                    dx.abs() <= 1.0 && dy.abs() <= 1.0
                } else {
                    dx * dx + dy * dy <= 1.0
                };
                if inside {
                    let shade = 1.0 - 0.25 * (dx * dx + dy * dy).min(1.0);
                    for (v, col) in px.iter_mut().zip(s.color) {
                        *v = *v * (1.0 - s.alpha) + col * shade * s.alpha;
                    }
                }
            }
            let tex = tex_amp * ((xf * fx).sin() * (yf * fy).cos())
                + fine_amp * (xf * gx + (yf * gy).sin() * 3.0).sin();
            let i = ((y * w + x) * 3) as usize;
            for c in 0..3 {
                // xorshift noise, roughly Gaussian from the sum of two draws.
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let n = ((state & 0xFF) as f32 + ((state >> 8) & 0xFF) as f32) / 255.0 - 1.0;
                let v = px[c] * 255.0 + tex + n * noise_amp;
                data[i + c] = v.clamp(0.0, 255.0) as u8;
            }
        }
    }
    Image {
        width: w,
        height: h,
        data,
    }
}

fn hsv(h: f32, s: f32, v: f32) -> [f32; 3] {
    let h = h.rem_euclid(1.0) * 6.0;
    let i = h.floor();
    let f = h - i;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - s * f), v * (1.0 - s * (1.0 - f)));
    match i as u32 {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    }
}

/// Encodes an image as a baseline JPEG of the given quality with 4:2:0
/// chroma subsampling (what cameras and Pillow's default write).
pub fn encode_jpeg(img: &Image, quality: u8) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut enc = jpeg_encoder::Encoder::new(&mut out, quality);
    enc.set_sampling_factor(jpeg_encoder::SamplingFactor::F_2_2);
    let (w, h) = (
        u16::try_from(img.width).map_err(|_| "image too wide for JPEG")?,
        u16::try_from(img.height).map_err(|_| "image too tall for JPEG")?,
    );
    enc.encode(&img.data, w, h, jpeg_encoder::ColorType::Rgb)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Image `index` as a JPEG.
pub fn jpeg(seed: u64, index: u64, quality: u8) -> Result<Vec<u8>, String> {
    encode_jpeg(&image(seed, index), quality)
}

/// Image `index` resampled to exactly `width × height` (e.g. camera-sized
/// photos for memory benchmarks), as a JPEG.
pub fn jpeg_sized(
    seed: u64,
    index: u64,
    quality: u8,
    (width, height): (u32, u32),
) -> Result<Vec<u8>, String> {
    let img = image(seed, index);
    let full = (0.0, 0.0, f64::from(img.width), f64::from(img.height));
    let data =
        crate::resample::resize(&img.data, img.width, img.height, full, width, height, false)?;
    encode_jpeg(&Image::new(width, height, data)?, quality)
}

/// The file [`write_dataset`] leaves in every folder it writes. A folder
/// holding it (and nothing but the layout written beside it) may be written
/// again; any other non-empty folder is refused.
pub const MARKER: &str = ".ferrofeed-synth";

/// Writes `count` JPEGs (q90) into `dir/<class>/img_<index>.jpg` (e.g.
/// `class_03/img_000013.jpg`), spread over
/// `threads` threads. The images are written under a temporary name and
/// moved in at the end, so an interrupted run leaves no half dataset.
///
/// `dir` may be missing, empty, or a dataset this function wrote (marked by
/// [`MARKER`]), which is replaced: only its own files are removed. Any other
/// folder is refused with [`std::io::ErrorKind::AlreadyExists`] before
/// anything is written, so a user's files are never touched.
pub fn write_dataset(dir: &Path, count: u64, seed: u64, threads: usize) -> std::io::Result<()> {
    write_dataset_sized(dir, count, seed, threads, None)
}

/// What `dir` holds before [`write_dataset`] writes it.
enum Target {
    Missing,
    /// Empty, or a dataset written before (its files listed, to remove).
    Reusable(Vec<std::path::PathBuf>),
}

fn is_image_name(name: &str) -> bool {
    name.strip_prefix("img_")
        .and_then(|n| n.strip_suffix(".jpg"))
        .is_some_and(|n| n.len() >= 6 && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `dir` may be written, and which of its files are ours.
fn target(dir: &Path) -> std::io::Result<Target> {
    use std::io::{Error, ErrorKind};
    let meta = match std::fs::metadata(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Target::Missing),
        other => other?,
    };
    if !meta.is_dir() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            "exists and is not a folder",
        ));
    }
    let foreign = |what: &Path| {
        Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "is not empty and is not a dataset written by make-dataset ({} is not one of its files); \
                 refusing to write into it: name a new or empty folder",
                what.display()
            ),
        )
    };
    let mut ours = Vec::new();
    let mut marked = false;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name();
        let kind = entry.file_type()?;
        match name.to_str() {
            Some(MARKER) if kind.is_file() => marked = true,
            Some(n) if kind.is_dir() && (0..CLASSES).any(|c| class_name(c) == n) => {
                for f in std::fs::read_dir(&path)? {
                    let f = f?;
                    let ok = f.file_type()?.is_file()
                        && f.file_name().to_str().is_some_and(is_image_name);
                    if !ok {
                        return Err(foreign(&f.path()));
                    }
                    ours.push(f.path());
                }
            }
            _ => return Err(foreign(&path)),
        }
        ours.push(path);
    }
    if !ours.is_empty() && !marked {
        return Err(foreign(&dir.join(MARKER)));
    }
    Ok(Target::Reusable(ours))
}

/// [`write_dataset`] with every image resampled to `size` (width, height).
pub fn write_dataset_sized(
    dir: &Path,
    count: u64,
    seed: u64,
    threads: usize,
    size: Option<(u32, u32)>,
) -> std::io::Result<()> {
    let existing = target(dir)?;
    // `.` or `..` have no usable parent or name: work from the real path.
    let dir = match existing {
        Target::Missing => dir.to_path_buf(),
        Target::Reusable(_) => std::fs::canonicalize(dir)?,
    };
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(
        ".{}.tmp-{}",
        dir.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("dataset"),
        std::process::id()
    ));
    // Only a folder of this name and process can be a leftover of ours.
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    for c in 0..CLASSES {
        std::fs::create_dir_all(tmp.join(class_name(c)))?;
    }
    std::fs::write(tmp.join(MARKER), b"written by ferrofeed make-dataset\n")?;
    let threads = threads.max(1) as u64;
    std::thread::scope(|s| -> std::io::Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let tmp = &tmp;
                s.spawn(move || -> std::io::Result<()> {
                    let mut i = t;
                    while i < count {
                        let bytes = match size {
                            None => jpeg(seed, i, 90),
                            Some(size) => jpeg_sized(seed, i, 90, size),
                        }
                        .map_err(std::io::Error::other)?;
                        let path = tmp
                            .join(class_name(class_of(i)))
                            .join(format!("img_{i:06}.jpg"));
                        std::fs::write(path, bytes)?;
                        i += threads;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| std::io::Error::other("a writer thread panicked"))??;
        }
        Ok(())
    })?;
    match existing {
        Target::Missing => std::fs::rename(&tmp, &dir),
        Target::Reusable(ours) => {
            // Files first, then the (now empty) class folders; the marker
            // goes in first, so an interrupted move is still ours.
            for p in ours.iter().filter(|p| !p.is_dir()) {
                std::fs::remove_file(p)?;
            }
            for p in ours.iter().filter(|p| p.is_dir()) {
                std::fs::remove_dir(p)?;
            }
            std::fs::rename(tmp.join(MARKER), dir.join(MARKER))?;
            for c in 0..CLASSES {
                std::fs::rename(tmp.join(class_name(c)), dir.join(class_name(c)))?;
            }
            std::fs::remove_dir(&tmp)
        }
    }
}
