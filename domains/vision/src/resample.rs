//! Antialiased bilinear resampling of interleaved RGB bytes, the filter of
//! PIL and torchvision `Resize(antialias=True)`: a triangle of radius
//! `max(scale, 1)` source pixels, weights normalised per output pixel,
//! 14-bit fixed point, rounded to bytes between the passes.
//!
//! Both passes run down columns, where every tap is a whole contiguous row
//! (a multiply-add over long byte runs, which vectorises well): the first
//! pass shrinks the rows, a byte transpose turns columns into rows, the
//! second pass shrinks those (mirrored here when the image is flipped), and a
//! second transpose puts the pixels back in row order. A horizontal pass over
//! interleaved pixels instead gathers a few bytes per tap and costs several
//! times more per output value.
//!
//! ```
//! use ferrofeed_vision::resample::resize;
//! // A 4×2 image, left half black, right half white, shrunk to 2×1.
//! let px: Vec<u8> = (0..8).flat_map(|i| [if i % 4 < 2 { 0 } else { 255 }; 3]).collect();
//! let out = resize(&px, 4, 2, (0.0, 0.0, 4.0, 2.0), 2, 1, false).unwrap();
//! assert_eq!(out, vec![36, 36, 36, 219, 219, 219]);
//! let flipped = resize(&px, 4, 2, (0.0, 0.0, 4.0, 2.0), 2, 1, true).unwrap();
//! assert_eq!(flipped, vec![219, 219, 219, 36, 36, 36]);
//! // An empty region is an error, not a panic.
//! assert!(resize(&px, 4, 2, (0.0, 0.0, 0.0, 2.0), 2, 1, false).is_err());
//! ```

use std::cell::RefCell;
use std::mem::MaybeUninit;

/// Fixed-point bits of the weights.
const PREC: u32 = 14;

/// One axis' filter: for output `o`, source indices `start[o]..start[o] +
/// len[o]` with weights `w[o * window..][..len[o]]`.
#[derive(Debug)]
struct Axis {
    start: Vec<u32>,
    len: Vec<u32>,
    window: usize,
    w: Vec<i32>,
}

impl Axis {
    /// The filter taking `in0..in1` of a source `in_size` long to `out_size`
    /// samples; taps may reach past `in0..in1` (clamped to the source), as
    /// `fast_image_resize` and PIL do.
    fn new(in_size: u32, in0: f64, in1: f64, out_size: u32) -> Axis {
        let scale = (in1 - in0) / f64::from(out_size);
        let fs = scale.max(1.0);
        // No output reads more source samples than there are.
        let window = (fs.ceil().min(f64::from(in_size)) as usize * 2 + 1).min(in_size as usize + 2);
        let mut a = Axis {
            start: Vec::with_capacity(out_size as usize),
            len: Vec::with_capacity(out_size as usize),
            window,
            w: vec![0; window * out_size as usize],
        };
        let inv = 1.0 / fs;
        let mut f = vec![0f64; window + 1];
        // `floor`, `ceil` and `round` are library calls on baseline x86_64;
        // the values here are non-negative, where casts do the same.
        for o in 0..out_size as usize {
            let centre = in0 + (o as f64 + 0.5) * scale;
            let lo = (centre - fs).max(0.0) as u32;
            let top = (centre + fs).min(f64::from(in_size));
            let mut hi = top as u32;
            if f64::from(hi) < top {
                hi += 1;
            }
            let hi = hi.max(lo);
            let mut first = lo;
            let mut n = 0usize;
            let mut sum = 0.0;
            for x in lo..hi {
                let v = 1.0 - (f64::from(x) + 0.5 - centre).abs() * inv;
                if v <= 0.0 {
                    if n == 0 {
                        first = x + 1;
                        continue;
                    }
                    break;
                }
                if n < f.len() {
                    f[n] = v;
                    n += 1;
                    sum += v;
                }
            }
            let ws = &mut a.w[o * window..(o + 1) * window];
            if n == 0 || sum <= 0.0 {
                // No source pixel under the filter (a region at the very
                // edge): take the nearest one.
                first = (centre.max(0.0) as u32).min(in_size.saturating_sub(1));
                n = 1;
                ws[0] = 1 << PREC;
            } else {
                let k = f64::from(1u32 << PREC) / sum;
                for (w, v) in ws.iter_mut().zip(&f[..n]) {
                    *w = (v * k + 0.5) as i32;
                }
                // The weights sum to exactly one, so a result lies in
                // 0..=255 without clamping.
                let residue = (1i32 << PREC) - ws.iter().sum::<i32>();
                if let Some(big) = ws.iter_mut().max_by_key(|w| **w) {
                    *big += residue;
                }
            }
            a.start.push(first);
            a.len.push(n.min(window) as u32);
        }
        a
    }

    /// The first source index any output reads, and one past the last.
    fn span(&self) -> (u32, u32) {
        let lo = self.start.iter().copied().min().unwrap_or(0);
        let hi = self
            .start
            .iter()
            .zip(&self.len)
            .map(|(s, n)| s + n)
            .max()
            .unwrap_or(0);
        (lo, hi.max(lo))
    }

    fn taps(&self, o: usize) -> (usize, &[i32]) {
        let n = self.len[o] as usize;
        (
            self.start[o] as usize,
            &self.w[o * self.window..o * self.window + n],
        )
    }
}

/// `out[i] = Σ_k w[k] · row(k)[i]`, rounded to a byte (the weights are
/// non-negative and sum to one); rows are at least `out.len()` long. `acc`
/// is scratch space of at least `out.len()`.
#[inline(always)]
fn taps_generic<'a>(rows: impl Fn(usize) -> &'a [u8], w: &[i32], out: &mut [u8], acc: &mut [i32]) {
    let width = out.len();
    let acc = &mut acc[..width];
    acc.fill(1 << (PREC - 1));
    for (k, &wk) in w.iter().enumerate() {
        for (a, &s) in acc.iter_mut().zip(&rows(k)[..width]) {
            *a += wk * i32::from(s);
        }
    }
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = (a >> PREC) as u8;
    }
}

/// Most taps the AVX2 kernel takes (about a 7× downscale); wider filters use
/// the generic one.
const MAX_SIMD_TAPS: usize = 16;

/// [`taps_generic`] with AVX2, bit for bit: pairs of taps as one
/// `vpmaddwd` (bytes widened to 16 bits, interleaved row by row, against
/// the two weights), 16 columns at a time in registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn taps_avx2<'a>(rows: impl Fn(usize) -> &'a [u8], w: &[i32], out: &mut [u8], acc: &mut [i32]) {
    use std::arch::x86_64::*;
    let width = out.len();
    let n = w.len();
    if n > MAX_SIMD_TAPS || width < 16 {
        return taps_generic(rows, w, out, acc);
    }
    let mut src: [&[u8]; MAX_SIMD_TAPS] = [&[]; MAX_SIMD_TAPS];
    for (k, s) in src.iter_mut().enumerate().take(n) {
        *s = &rows(k)[..width];
    }
    // Weight pairs (w[2p] low, w[2p + 1] high); an odd last tap pairs
    // with its own row at weight zero.
    let pairs = n.div_ceil(2);
    let mut wv = [_mm256_setzero_si256(); MAX_SIMD_TAPS / 2];
    for (p, v) in wv.iter_mut().enumerate().take(pairs) {
        let lo = w[2 * p] as u16 as u32;
        let hi = w.get(2 * p + 1).map_or(0, |&x| x as u16 as u32);
        *v = _mm256_set1_epi32((lo | hi << 16) as i32);
    }
    let round = _mm256_set1_epi32(1 << (PREC - 1));
    let mut i = 0;
    while i + 16 <= width {
        let (mut a0, mut a1) = (round, round);
        for p in 0..pairs {
            let r0 = src[2 * p];
            let r1 = if 2 * p + 1 < n { src[2 * p + 1] } else { r0 };
            // SAFETY: both rows are `width` long and `i + 16 <= width`.
            let (x0, x1) = unsafe {
                (
                    _mm_loadu_si128(r0.as_ptr().add(i).cast()),
                    _mm_loadu_si128(r1.as_ptr().add(i).cast()),
                )
            };
            let lo = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(x0, x1));
            let hi = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(x0, x1));
            a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(lo, wv[p]));
            a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(hi, wv[p]));
        }
        let a0 = _mm256_srai_epi32::<{ PREC as i32 }>(a0);
        let a1 = _mm256_srai_epi32::<{ PREC as i32 }>(a1);
        // packus works within 128-bit lanes: put the quarters back in
        // order before narrowing to bytes.
        let p16 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a0, a1));
        let p8 = _mm_packus_epi16(
            _mm256_castsi256_si128(p16),
            _mm256_extracti128_si256::<1>(p16),
        );
        // SAFETY: `i + 16 <= width == out.len()`.
        unsafe { _mm_storeu_si128(out.as_mut_ptr().add(i).cast(), p8) };
        i += 16;
    }
    if i < width {
        // The last columns: redo the final 16 (overlapping is harmless,
        // the values are the same).
        let start = width - 16;
        taps_generic(|k| &src[k][start..], w, &mut out[start..], acc);
    }
}

fn taps<'a>(
    avx2: bool,
    rows: impl Fn(usize) -> &'a [u8],
    w: &[i32],
    out: &mut [u8],
    acc: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    if avx2 {
        // SAFETY: `avx2` is true only when the CPU reports AVX2.
        return unsafe { taps_avx2(rows, w, out, acc) };
    }
    let _ = avx2;
    taps_generic(rows, w, out, acc)
}

fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `dst[c * rows + r] = src[r * cols + c]` for a `rows × cols` byte matrix.
fn transpose(src: &[u8], rows: usize, cols: usize, dst: &mut [u8]) {
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`, and only
    // initialised bytes are written through the view.
    let dst = unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) };
    transpose_uninit(src, rows, cols, dst);
}

/// [`transpose`] into possibly uninitialised memory: every byte of
/// `dst[..rows * cols]` is written (the 16×16 tiles, then the edges).
fn transpose_uninit(src: &[u8], rows: usize, cols: usize, dst: &mut [MaybeUninit<u8>]) {
    assert!(src.len() >= rows * cols && dst.len() >= rows * cols);
    const T: usize = 16;
    let (rt, ct) = (rows / T * T, cols / T * T);
    // Down the source, so that each destination row fills front to back.
    for c0 in (0..ct).step_by(T) {
        for r0 in (0..rt).step_by(T) {
            tile16(src, cols, r0, c0, dst, rows);
        }
    }
    // The edges that do not fill a 16×16 tile.
    for r in 0..rows {
        let cs = if r < rt { ct } else { 0 };
        for c in cs..cols {
            dst[c * rows + r] = MaybeUninit::new(src[r * cols + c]);
        }
    }
}

/// Transposes the 16×16 tile at `(r0, c0)` of `src` (row length `sc`) into
/// `dst` (row length `dc`) at `(c0, r0)`.
#[cfg(target_arch = "x86_64")]
fn tile16(src: &[u8], sc: usize, r0: usize, c0: usize, dst: &mut [MaybeUninit<u8>], dc: usize) {
    use std::arch::x86_64::*;
    // The last byte each side touches, checked once so the loads and
    // stores below stay in bounds.
    assert!((r0 + 15) * sc + c0 + 16 <= src.len() && (c0 + 15) * dc + r0 + 16 <= dst.len());
    // SAFETY: SSE2 is part of x86_64; every 16-byte load and store lies
    // within the bounds asserted above.
    unsafe {
        let mut r = [_mm_setzero_si128(); 16];
        for (i, v) in r.iter_mut().enumerate() {
            *v = _mm_loadu_si128(src.as_ptr().add((r0 + i) * sc + c0).cast());
        }
        // Bytes, then pairs, quads and eights of rows interleave, after
        // which register j holds column j.
        let mut a = [_mm_setzero_si128(); 16];
        for i in 0..8 {
            a[i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
            a[i + 8] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
        }
        let mut b = [_mm_setzero_si128(); 16];
        for h in 0..2 {
            for i in 0..4 {
                let (x, y) = (a[h * 8 + 2 * i], a[h * 8 + 2 * i + 1]);
                b[h * 8 + i] = _mm_unpacklo_epi16(x, y);
                b[h * 8 + 4 + i] = _mm_unpackhi_epi16(x, y);
            }
        }
        for q in 0..4 {
            let c_lo = _mm_unpacklo_epi32(b[q * 4], b[q * 4 + 1]);
            let c_hi = _mm_unpackhi_epi32(b[q * 4], b[q * 4 + 1]);
            let d_lo = _mm_unpacklo_epi32(b[q * 4 + 2], b[q * 4 + 3]);
            let d_hi = _mm_unpackhi_epi32(b[q * 4 + 2], b[q * 4 + 3]);
            let cols = [
                _mm_unpacklo_epi64(c_lo, d_lo),
                _mm_unpackhi_epi64(c_lo, d_lo),
                _mm_unpacklo_epi64(c_hi, d_hi),
                _mm_unpackhi_epi64(c_hi, d_hi),
            ];
            for (k, v) in cols.into_iter().enumerate() {
                let j = q * 4 + k;
                _mm_storeu_si128(dst.as_mut_ptr().add((c0 + j) * dc + r0).cast(), v);
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn tile16(src: &[u8], sc: usize, r0: usize, c0: usize, dst: &mut [MaybeUninit<u8>], dc: usize) {
    for r in r0..r0 + 16 {
        for c in c0..c0 + 16 {
            dst[c * dc + r] = MaybeUninit::new(src[r * sc + c]);
        }
    }
}

#[derive(Default)]
struct Scratch {
    rows_shrunk: Vec<u8>,
    columns: Vec<u8>,
    shrunk_t: Vec<u8>,
    acc: Vec<i32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Resamples `region = (left, top, width, height)` (fractional source
/// pixels) of the `width × height` RGB image `src` to `out_w × out_h` RGB,
/// mirrored left-right when `flip` is set. Errors on a zero size, an empty
/// region or too few pixel bytes.
pub fn resize(
    src: &[u8],
    width: u32,
    height: u32,
    region: (f64, f64, f64, f64),
    out_w: u32,
    out_h: u32,
    flip: bool,
) -> Result<Vec<u8>, String> {
    if width == 0 || height == 0 || out_w == 0 || out_h == 0 {
        return Err(format!(
            "cannot resize {width}x{height} to {out_w}x{out_h}: a side is zero"
        ));
    }
    if src.len() < width as usize * height as usize * 3 {
        return Err(format!(
            "{} bytes of pixels for a {width}x{height} RGB image",
            src.len()
        ));
    }
    if !(region.2 > 0.0 && region.3 > 0.0) {
        return Err(format!("empty crop region {region:?}"));
    }
    if ![region.0, region.1, region.2, region.3]
        .iter()
        .all(|v| v.is_finite())
    {
        return Err(format!("crop region {region:?} is not finite"));
    }
    let stride = width as usize * 3;
    assert!(src.len() >= stride * height as usize, "short pixel buffer");
    let avx2 = has_avx2();
    let hx = Axis::new(width, region.0, region.0 + region.2, out_w);
    let vy = Axis::new(height, region.1, region.1 + region.3, out_h);
    let (x0, x1) = hx.span();
    let (oh, ow) = (out_h as usize, out_w as usize);
    // Bytes of each source row the horizontal filter reads.
    let (b0, b1) = (x0 as usize * 3, x1 as usize * 3);
    let run = b1 - b0;
    let n = oh * ow * 3;
    let mut out = Vec::with_capacity(n);
    SCRATCH.with(|s| {
        let s = &mut *s.borrow_mut();
        // Pass 1: rows, `oh × run`.
        // Scratch buffers only grow, so no call zero-fills them again.
        let grow = |v: &mut Vec<u8>, n: usize| {
            if v.len() < n {
                v.resize(n, 0);
            }
        };
        grow(&mut s.rows_shrunk, oh * run);
        grow(&mut s.columns, run * oh);
        grow(&mut s.shrunk_t, ow * 3 * oh);
        if s.acc.len() < run.max(3 * oh) {
            s.acc.resize(run.max(3 * oh), 0);
        }
        for (o, dst) in s.rows_shrunk[..oh * run].chunks_exact_mut(run).enumerate() {
            let (y, w) = vy.taps(o);
            taps(
                avx2,
                |k| &src[(y + k) * stride + b0..(y + k) * stride + b1],
                w,
                dst,
                &mut s.acc,
            );
        }
        // Columns become rows: `run × oh`, row `3x + c` is channel c of
        // source column `x0 + x`.
        transpose(&s.rows_shrunk, oh, run, &mut s.columns);
        // Pass 2: row `3x' + c` of `ow * 3 × oh` is output column x'. The
        // three channel rows of a column lie end to end, so one pass of
        // `3 * oh` bytes makes all three.
        let columns = &s.columns;
        let span = 3 * oh;
        for xo in 0..ow {
            let (x, w) = hx.taps(xo);
            let x = x - x0 as usize;
            let at = if flip { ow - 1 - xo } else { xo };
            taps(
                avx2,
                |k| &columns[(x + k) * span..(x + k + 1) * span],
                w,
                &mut s.shrunk_t[at * span..(at + 1) * span],
                &mut s.acc,
            );
        }
        transpose_uninit(&s.shrunk_t, ow * 3, oh, &mut out.spare_capacity_mut()[..n]);
    });
    // SAFETY: `transpose_uninit` wrote all `n` bytes.
    unsafe { out.set_len(n) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(w: u32, h: u32, seed: u32) -> Vec<u8> {
        (0..w * h * 3)
            .map(|i| {
                let v = i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13;
                // Smooth ramps plus noise, like a photo.
                ((i / 3 % w) * 200 / w + (v % 56)) as u8
            })
            .collect()
    }

    /// Straight from the definition, in floating point, with the same
    /// rounding to bytes between the passes.
    fn reference(
        src: &[u8],
        w: u32,
        h: u32,
        region: (f64, f64, f64, f64),
        ow: u32,
        oh: u32,
    ) -> Vec<u8> {
        let weights = |size: u32, in0: f64, len: f64, out: u32| -> Vec<Vec<(usize, f64)>> {
            let scale = len / f64::from(out);
            let fs = scale.max(1.0);
            (0..out)
                .map(|o| {
                    let c = in0 + (f64::from(o) + 0.5) * scale;
                    let taps: Vec<(usize, f64)> = (0..size)
                        .map(|x| {
                            (
                                x as usize,
                                (1.0 - ((f64::from(x) + 0.5 - c) / fs).abs()).max(0.0),
                            )
                        })
                        .filter(|t| t.1 > 0.0)
                        .collect();
                    let s: f64 = taps.iter().map(|t| t.1).sum();
                    taps.into_iter().map(|(x, v)| (x, v / s)).collect()
                })
                .collect()
        };
        let wy = weights(h, region.1, region.3, oh);
        let wx = weights(w, region.0, region.2, ow);
        let mut mid = vec![0u8; oh as usize * w as usize * 3];
        for (o, t) in wy.iter().enumerate() {
            for i in 0..w as usize * 3 {
                let v: f64 = t
                    .iter()
                    .map(|&(y, k)| k * f64::from(src[y * w as usize * 3 + i]))
                    .sum();
                mid[o * w as usize * 3 + i] = v.round().clamp(0.0, 255.0) as u8;
            }
        }
        let mut out = vec![0u8; oh as usize * ow as usize * 3];
        for y in 0..oh as usize {
            for (o, t) in wx.iter().enumerate() {
                for c in 0..3 {
                    let v: f64 = t
                        .iter()
                        .map(|&(x, k)| k * f64::from(mid[(y * w as usize + x) * 3 + c]))
                        .sum();
                    out[(y * ow as usize + o) * 3 + c] = v.round().clamp(0.0, 255.0) as u8;
                }
            }
        }
        out
    }

    #[test]
    fn matches_the_definition_within_one_level() {
        let cases = [
            (500, 375, (12.3, 40.7, 300.5, 280.2), 224, 224),
            (500, 375, (0.0, 0.0, 500.0, 375.0), 224, 224),
            (64, 48, (3.0, 5.0, 20.0, 17.0), 37, 41), // upscaling
            (300, 200, (250.0, 150.0, 50.0, 50.0), 17, 33),
            (40, 30, (0.0, 0.0, 40.0, 30.0), 40, 30), // identity
            (1000, 20, (0.0, 0.0, 1000.0, 20.0), 31, 3),
        ];
        for (i, &(w, h, region, ow, oh)) in cases.iter().enumerate() {
            let src = image(w, h, i as u32);
            let got = resize(&src, w, h, region, ow, oh, false).unwrap();
            let want = reference(&src, w, h, region, ow, oh);
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap();
            assert!(worst <= 1, "case {i}: off by {worst}");
        }
    }

    #[test]
    fn simd_and_generic_kernels_agree_bit_for_bit() {
        let rows: Vec<Vec<u8>> = (0..70)
            .map(|r| (0..203).map(|i| ((i * 37 + r * 101) % 256) as u8).collect())
            .collect();
        for n in [1, 2, 3, 5, 8, 16, 17, 65] {
            let raw: Vec<i32> = (0..n).map(|k: i32| 1 + (k * 7919) % 1000).collect();
            let total: i32 = raw.iter().sum();
            let mut w: Vec<i32> = raw.iter().map(|v| v * (1 << PREC) / total).collect();
            w[0] += (1 << PREC) - w.iter().sum::<i32>();
            for width in [16, 17, 31, 203] {
                let mut acc = vec![0; width];
                let (mut a, mut b) = (vec![0u8; width], vec![0u8; width]);
                taps_generic(|k| &rows[k][..], &w, &mut a, &mut acc);
                taps(has_avx2(), |k| &rows[k][..], &w, &mut b, &mut acc);
                assert_eq!(a, b, "{n} taps, width {width}");
            }
        }
    }

    #[test]
    fn odd_regions_are_errors_or_clamped_never_panics() {
        let src = image(20, 10, 3);
        assert!(resize(&src, 20, 10, (0.0, 0.0, f64::INFINITY, 5.0), 4, 4, false).is_err());
        assert!(resize(&src, 20, 10, (f64::NAN, 0.0, 5.0, 5.0), 4, 4, false).is_err());
        assert!(resize(&src, 20, 10, (0.0, 0.0, 5.0, 5.0), 0, 4, false).is_err());
        assert!(resize(&src[..10], 20, 10, (0.0, 0.0, 5.0, 5.0), 4, 4, false).is_err());
        // Far outside or far larger than the image: edge pixels, bounded work.
        for region in [
            (-50.0, -30.0, 10.0, 5.0),
            (100.0, 40.0, 3.0, 3.0),
            (0.0, 0.0, 1e12, 1e12),
        ] {
            let out = resize(&src, 20, 10, region, 7, 5, false).unwrap();
            assert_eq!(out.len(), 7 * 5 * 3);
        }
    }

    #[test]
    fn flip_mirrors_the_unflipped_result() {
        let src = image(123, 77, 9);
        let region = (5.5, 3.25, 100.0, 70.0);
        let a = resize(&src, 123, 77, region, 45, 29, false).unwrap();
        let b = resize(&src, 123, 77, region, 45, 29, true).unwrap();
        for y in 0..29 {
            for x in 0..45 {
                let p = (y * 45 + x) * 3;
                let q = (y * 45 + 44 - x) * 3;
                assert_eq!(a[p..p + 3], b[q..q + 3]);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any image, region inside it and output size: within one level of
        /// the definition, and the flip is the exact mirror.
        #[test]
        fn any_region_matches_the_definition(
            w in 1u32..90, h in 1u32..70, ow in 1u32..60, oh in 1u32..60,
            fx in 0.0f64..1.0, fy in 0.0f64..1.0, fw in 0.05f64..1.0, fh in 0.05f64..1.0,
            seed in 0u32..1000,
        ) {
            let src = image(w, h, seed);
            let left = fx * f64::from(w) * (1.0 - fw);
            let top = fy * f64::from(h) * (1.0 - fh);
            let region = (left, top, fw * f64::from(w), fh * f64::from(h));
            let got = resize(&src, w, h, region, ow, oh, false).unwrap();
            let want = reference(&src, w, h, region, ow, oh);
            let worst = got.iter().zip(&want).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
            proptest::prop_assert!(worst <= 1, "off by {}", worst);
            let flipped = resize(&src, w, h, region, ow, oh, true).unwrap();
            let row = ow as usize * 3;
            for (a, b) in got.chunks_exact(row).zip(flipped.chunks_exact(row)) {
                let mirrored: Vec<u8> = b.chunks_exact(3).rev().flatten().copied().collect();
                proptest::prop_assert_eq!(a, &mirrored[..]);
            }
        }
    }

    #[test]
    fn transpose_handles_partial_tiles() {
        for (rows, cols) in [(16, 16), (33, 50), (7, 3), (224, 672), (1, 40)] {
            let src: Vec<u8> = (0..rows * cols).map(|i| (i * 31 % 256) as u8).collect();
            let mut dst = vec![0; rows * cols];
            transpose(&src, rows, cols, &mut dst);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        dst[c * rows + r],
                        src[r * cols + c],
                        "{rows}x{cols} at {r},{c}"
                    );
                }
            }
        }
    }
}
