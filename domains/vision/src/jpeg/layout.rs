//! The frame and scan of a seekable JPEG, and the skip-only scan that
//! finds where each MCU starts.

use super::bits::Reader;
use super::huffman::Huff;
use std::sync::Arc;

/// A component of the scan: sampling factors and its Huffman tables.
#[derive(Clone)]
pub(super) struct Comp {
    pub(super) h: u32,
    pub(super) v: u32,
    pub(super) dc: Arc<Huff>,
    pub(super) ac: Arc<Huff>,
}

/// The frame and scan of a baseline JPEG that can be seeked: one scan
/// holding every component (one, or three), Huffman-coded, 8-bit, no
/// restart interval.
#[derive(Clone)]
pub struct Layout {
    pub(super) data_start: usize,
    pub(super) height_at: usize,
    pub(super) width: u32,
    pub(super) height: u32,
    pub(super) comps: Vec<Comp>,
    pub(super) mcus_per_row: u32,
    pub(super) rows: u32,
    pub(super) row_px: u32,
    pub(super) col_px: u32,
}

impl std::fmt::Debug for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layout")
            .field("width", &self.width)
            .field("height", &self.height)
            .field(
                "sampling",
                &self.comps.iter().map(|c| (c.h, c.v)).collect::<Vec<_>>(),
            )
            .field("mcus_per_row", &self.mcus_per_row)
            .field("rows", &self.rows)
            .finish()
    }
}

/// Where an MCU's data starts, and the DC predictors there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Byte offset in the file of the MCU's first bit.
    pub byte: u32,
    /// Bits of that byte that belong to the MCU before (0–7).
    pub bit: u8,
    /// Each component's DC predictor (unused ones 0).
    pub dc: [i16; 3],
}

impl Mark {
    /// The start of the image data: MCU 0.
    pub fn start(layout: &Layout) -> Mark {
        Mark {
            byte: layout.data_start as u32,
            bit: 0,
            dc: [0; 3],
        }
    }
}

impl Layout {
    /// Reads the markers up to the scan; `None` when the file is not a
    /// JPEG this module can seek in.
    pub fn parse(bytes: &[u8]) -> Option<Layout> {
        let mut dc: [Option<Arc<Huff>>; 4] = [None, None, None, None];
        let mut ac: [Option<Arc<Huff>>; 4] = [None, None, None, None];
        // (offset of the height, width, height, (id, h, v) per component)
        type Frame = (usize, u32, u32, Vec<(u8, u32, u32)>);
        let mut frame: Option<Frame> = None;
        if bytes.get(..2)? != [0xFF, 0xD8] {
            return None;
        }
        let mut i = 2;
        loop {
            if *bytes.get(i)? != 0xFF {
                return None;
            }
            let marker = *bytes.get(i + 1)?;
            if marker == 0xFF {
                i += 1;
                continue;
            }
            let len = usize::from(u16::from_be_bytes([*bytes.get(i + 2)?, *bytes.get(i + 3)?]));
            let seg = bytes.get(i + 4..i + 2 + len)?;
            if len < 2 {
                return None;
            }
            match marker {
                // Baseline and extended sequential Huffman frames.
                0xC0 | 0xC1 => {
                    if frame.is_some() || seg.len() < 6 || seg[0] != 8 {
                        return None;
                    }
                    let height = u32::from(u16::from_be_bytes([seg[1], seg[2]]));
                    let width = u32::from(u16::from_be_bytes([seg[3], seg[4]]));
                    let n = usize::from(seg[5]);
                    if !(n == 1 || n == 3) || seg.len() < 6 + 3 * n || width == 0 || height == 0 {
                        return None;
                    }
                    let comps = (0..n)
                        .map(|c| {
                            let s = &seg[6 + 3 * c..9 + 3 * c];
                            (s[0], u32::from(s[1] >> 4), u32::from(s[1] & 15))
                        })
                        .collect();
                    frame = Some((i + 5, width, height, comps));
                }
                // Any other frame type (progressive, lossless, arithmetic).
                0xC2..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => return None,
                0xC4 => {
                    let mut s = seg;
                    while !s.is_empty() {
                        let (class, id) = (s[0] >> 4, usize::from(s[0] & 15));
                        let counts = s.get(1..17)?;
                        let n: usize = counts.iter().map(|&c| usize::from(c)).sum();
                        s.get(17..17 + n)?;
                        if id > 3 || class > 1 {
                            return None;
                        }
                        let t = Huff::cached(class, &s[1..17 + n])?;
                        if class == 0 {
                            dc[id] = Some(t);
                        } else {
                            ac[id] = Some(t);
                        }
                        s = &s[17 + n..];
                    }
                }
                // A restart interval other than 0 resets the predictors:
                // not handled here.
                0xDD if seg.len() < 2 || u16::from_be_bytes([seg[0], seg[1]]) != 0 => return None,
                0xDA => {
                    let (height_at, width, height, fcomps) = frame?;
                    let ns = usize::from(*seg.first()?);
                    if ns != fcomps.len() || seg.len() < 1 + 2 * ns + 3 {
                        return None;
                    }
                    // Spectral selection and approximation must be baseline's.
                    let tail = &seg[1 + 2 * ns..];
                    if tail[0] != 0 || tail[1] != 63 || tail[2] != 0 {
                        return None;
                    }
                    let hmax = fcomps.iter().map(|c| c.1).max()?;
                    let vmax = fcomps.iter().map(|c| c.2).max()?;
                    let mut comps = Vec::with_capacity(ns);
                    for (k, &(id, h, v)) in fcomps.iter().enumerate() {
                        let sel = &seg[1 + 2 * k..3 + 2 * k];
                        if sel[0] != id || !(1..=4).contains(&h) || !(1..=4).contains(&v) {
                            return None;
                        }
                        let (td, ta) = (usize::from(sel[1] >> 4), usize::from(sel[1] & 15));
                        comps.push(Comp {
                            h,
                            v,
                            dc: Arc::clone(dc.get(td)?.as_ref()?),
                            ac: Arc::clone(ac.get(ta)?.as_ref()?),
                        });
                    }
                    let blocks: u32 = comps.iter().map(|c| c.h * c.v).sum();
                    if blocks > 10 || (ns == 1 && (hmax != 1 || vmax != 1)) {
                        return None;
                    }
                    let row_px = 8 * vmax;
                    return Some(Layout {
                        data_start: i + 2 + len,
                        height_at,
                        width,
                        height,
                        comps,
                        mcus_per_row: width.div_ceil(8 * hmax),
                        rows: height.div_ceil(row_px),
                        row_px,
                        col_px: 8 * hmax,
                    });
                }
                // A second frame, end of image, or a bare marker here.
                0xD8 | 0xD9 | 0x01 | 0xD0..=0xD7 => return None,
                _ => {}
            }
            i += 2 + len;
        }
    }

    /// Pixel rows per iMCU row (8 × the largest vertical sampling factor).
    pub fn row_px(&self) -> u32 {
        self.row_px
    }

    /// iMCU rows in the image.
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// Offset of the first byte of entropy-coded data.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// Offset of the frame header's 16-bit height.
    pub fn height_at(&self) -> usize {
        self.height_at
    }

    /// MCUs per MCU row.
    pub fn mcus_per_row(&self) -> u32 {
        self.mcus_per_row
    }

    /// Pixel columns per MCU.
    pub fn col_px(&self) -> u32 {
        self.col_px
    }

    /// MCUs in the image; the mark with this index is the end of the data.
    pub fn mcus(&self) -> usize {
        self.mcus_per_row as usize * self.rows as usize
    }

    /// Extends `marks` (the starts of MCUs `0..marks.len()` in raster
    /// order, at least MCU 0's) until it holds mark `upto` (so `upto + 1`
    /// marks; mark [`mcus`](Self::mcus) is the end of the last MCU),
    /// parsing only the MCUs after the last mark. `None` when the data is
    /// corrupt or ends first.
    pub fn scan(&self, bytes: &[u8], marks: &mut Vec<Mark>, upto: usize) -> Option<()> {
        let upto = upto.min(self.mcus());
        let last = *marks.last()?;
        if marks.len() > upto {
            return Some(());
        }
        marks.reserve(upto + 1 - marks.len());
        let mut r = Reader::at(bytes, last.byte as usize, last.bit)?;
        let mut pred = [
            i32::from(last.dc[0]),
            i32::from(last.dc[1]),
            i32::from(last.dc[2]),
        ];
        while marks.len() <= upto {
            for (c, comp) in self.comps.iter().enumerate() {
                for _ in 0..comp.h * comp.v {
                    pred[c] += r.skip_block(&comp.dc, &comp.ac)?;
                }
            }
            let (byte, bit) = r.position()?;
            if pred.iter().any(|&p| i32::from(p as i16) != p) {
                return None;
            }
            let dc = [pred[0], pred[1], pred[2]].map(|p| p as i16);
            marks.push(Mark {
                byte: u32::try_from(byte).ok()?,
                bit,
                dc,
            });
        }
        Some(())
    }
}
