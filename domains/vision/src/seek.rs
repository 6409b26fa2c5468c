//! Seeking inside a baseline JPEG's entropy-coded data, so that a crop
//! Huffman-decodes only its own MCUs, not every row above it and the full
//! width of the rows it spans.
//!
//! Without restart markers a JPEG can only be read from the start: each
//! block's DC coefficient is coded as a difference from the previous block
//! of its component, and block boundaries are found only by decoding. A
//! [`ScanIndex`] remembers, per image, where each MCU (a tile of 8×8 to
//! 16×16 pixels) starts — byte, bit, and the DC predictors there — as
//! [`Mark`]s. Marks come from a skip-only parse ([`Layout::scan`]) that
//! decodes Huffman symbols (several per table lookup) without storing
//! coefficients, and that runs only over MCUs no mark covers yet: the first
//! epoch over an image pays for it, later ones do not.
//!
//! With marks, a region becomes a short stand-in JPEG that libjpeg decodes
//! as usual, with pixels bit-identical to a full decode's:
//! - [`Layout::crop`]: the original headers with the size cut to the
//!   region's MCU rows and columns; per row, one synthetic MCU whose blocks
//!   carry only the DC differences that bring the predictors to what the
//!   row's first real MCU expects (plus a few padding coefficients, so it
//!   ends on the bit where that MCU's data starts), then the row's original
//!   bytes, copied as they are. The synthetic MCUs are a column of garbage
//!   pixels left of the region, never used.
//! - [`Layout::splice`] for full-width regions: one synthetic MCU row, then
//!   the rest of the original file read in place (no copy).
//!
//! Anything outside the supported layout (progressive, restart markers,
//! arithmetic coding, more than one scan, 12-bit, CMYK) gives `None`, and
//! the caller decodes the ordinary way.
//!
//! ```
//! use ferrofeed_vision::seek::{Layout, Mark};
//! let jpeg = ferrofeed_vision::synth::jpeg(3, 1, 90).unwrap();
//! let layout = Layout::parse(&jpeg).expect("a baseline JPEG");
//! assert_eq!(layout.row_px(), 16); // 4:2:0: iMCU rows of 16 pixel rows
//! let mpr = layout.mcus_per_row() as usize;
//! let mut marks = vec![Mark::start(&layout)];
//! layout.scan(&jpeg, &mut marks, 5 * mpr).unwrap();
//! assert_eq!(marks.len(), 5 * mpr + 1); // the starts of MCUs 0..=5·mpr
//! let mut prefix = Vec::new();
//! let tail = layout.splice(&jpeg, &marks[5 * mpr], 5, 8, &mut prefix).unwrap();
//! // A 4-row image: the synthetic row, then rows 5, 6 and 7.
//! assert_eq!(u16::from_be_bytes([prefix[layout.height_at()], prefix[layout.height_at() + 1]]), 4 * 16);
//! assert!(tail > layout.data_start() && tail < jpeg.len());
//! ```
use ferrofeed_core::sync::LockExt;
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Bits looked up at once when decoding a Huffman symbol.
const LUT_BITS: u32 = 10;

/// Bits looked up at once when skipping several AC symbols.
const MULTI_BITS: u32 = 12;

/// One Huffman table: a lookup for codes up to [`LUT_BITS`] long, the
/// canonical limits for longer ones, and the code of each symbol.
#[derive(Clone)]
struct Huff {
    /// `(length << 8) | symbol` for every `LUT_BITS`-bit prefix whose code
    /// is that short; 0 when the code is longer.
    lut: Vec<u16>,
    /// Largest code of each length (−1 when none).
    maxcode: [i32; 17],
    /// Index into `vals` of the first code of each length, minus that code.
    delta: [i32; 17],
    vals: Vec<u8>,
    /// `(code, length)` per symbol; length 0 when the symbol is absent.
    enc: Vec<(u16, u8)>,
    /// For AC tables: per `LUT_BITS`-bit prefix with a short enough code,
    /// `(code length + value bits) << 8 | step`, where step is how far the
    /// coefficient index moves (0 for end-of-block); 0 when the code is
    /// longer.
    skip: Vec<u16>,
    /// For AC tables: several symbols per lookup (see `build_multi`).
    multi: Vec<u16>,
}

impl Huff {
    /// The table for a DHT entry (`class`, then its 16 counts and its
    /// symbols), built once per thread: datasets mostly share a few tables.
    fn cached(class: u8, spec: &[u8]) -> Option<Arc<Huff>> {
        type Tables = Vec<(u8, Vec<u8>, Arc<Huff>)>;
        thread_local! {
            static TABLES: RefCell<Tables> = const { RefCell::new(Vec::new()) };
        }
        TABLES.with(|t| {
            let mut t = t.borrow_mut();
            if let Some((_, _, h)) = t.iter_mut().find(|(c, s, _)| *c == class && s[..] == *spec) {
                // The multi-symbol table (8 KiB to fill) only for an AC
                // table seen twice: files with tables fitted to each image
                // would pay for it on every decode.
                if class == 1 && h.multi.is_empty() {
                    let mut full = Huff::clone(h);
                    full.build_multi();
                    *h = Arc::new(full);
                }
                return Some(Arc::clone(h));
            }
            let h = Arc::new(Huff::new(&spec[..16], &spec[16..])?);
            // A few tables serve most datasets; a stream of distinct ones
            // (optimised per image) restarts the list.
            if t.len() >= 16 {
                t.clear();
            }
            t.push((class, spec.to_vec(), Arc::clone(&h)));
            Some(h)
        })
    }

    /// Fills `multi`: for each `MULTI_BITS`-bit prefix, the AC symbols
    /// (codes and value bits) wholly inside it, up to and including an
    /// end-of-block, as `bits << 8 | steps << 1 | ended`.
    fn build_multi(&mut self) {
        self.multi = vec![0; 1 << MULTI_BITS];
        for p in 0..1u32 << MULTI_BITS {
            let (mut pos, mut steps, mut ended) = (0u32, 0u32, false);
            while pos < MULTI_BITS {
                let avail = MULTI_BITS - pos;
                let rest = (p << pos) & ((1 << MULTI_BITS) - 1);
                let e = self.lut[(rest >> (MULTI_BITS - LUT_BITS)) as usize];
                let (len, sym) = (u32::from(e >> 8), e as u8);
                let step = u32::from(Huff::step(sym));
                // Steps past a block's 63 coefficients never apply (and
                // would not fit the entry's 7 bits).
                if e == 0 || len + u32::from(sym & 15) > avail || steps + step > 63 {
                    break;
                }
                pos += len + u32::from(sym & 15);
                if step == 0 {
                    ended = true;
                    break;
                }
                steps += step;
            }
            if pos > 0 {
                self.multi[p as usize] = ((pos << 8) | (steps << 1) | u32::from(ended)) as u16;
            }
        }
    }

    /// Whether the table has a code for `sym` (for a DC table: whether it
    /// can code differences of that category).
    fn codes(&self, sym: u32) -> bool {
        self.enc.get(sym as usize).is_some_and(|e| e.1 > 0)
    }

    /// How an AC symbol moves the coefficient index: 0 for end-of-block.
    fn step(sym: u8) -> u16 {
        let (run, size) = (u16::from(sym >> 4), sym & 15);
        match (size, run) {
            (0, 15) => 16,
            (0, _) => 0,
            _ => run + 1,
        }
    }

    /// From a DHT's 16 counts and its symbols; `None` when the counts
    /// overflow the code space.
    fn new(counts: &[u8], vals: &[u8]) -> Option<Huff> {
        let mut h = Huff {
            lut: vec![0; 1 << LUT_BITS],
            maxcode: [-1; 17],
            delta: [0; 17],
            vals: vals.to_vec(),
            enc: vec![(0, 0); 256],
            skip: vec![0; 1 << LUT_BITS],
            multi: Vec::new(),
        };
        let mut code: u32 = 0;
        let mut k = 0usize;
        for len in 1..=16u32 {
            let n = usize::from(counts[len as usize - 1]);
            if n > 0 {
                h.delta[len as usize] = k as i32 - code as i32;
                for _ in 0..n {
                    if code >= 1 << len || k >= vals.len() {
                        return None;
                    }
                    let sym = vals[k];
                    h.enc[usize::from(sym)] = (code as u16, len as u8);
                    if len <= LUT_BITS {
                        let shift = LUT_BITS - len;
                        let first = (code << shift) as usize;
                        for e in &mut h.lut[first..first + (1 << shift)] {
                            *e = ((len as u16) << 8) | u16::from(sym);
                        }
                        let skip = ((len as u16 + u16::from(sym & 15)) << 8) | Huff::step(sym);
                        for e in &mut h.skip[first..first + (1 << shift)] {
                            *e = skip;
                        }
                    }
                    code += 1;
                    k += 1;
                }
                h.maxcode[len as usize] = code as i32 - 1;
            }
            code <<= 1;
        }
        Some(h)
    }
}

/// A component of the scan: sampling factors and its Huffman tables.
#[derive(Clone)]
struct Comp {
    h: u32,
    v: u32,
    dc: Arc<Huff>,
    ac: Arc<Huff>,
}

/// The frame and scan of a baseline JPEG that can be seeked: one scan
/// holding every component (one, or three), Huffman-coded, 8-bit, no
/// restart interval.
#[derive(Clone)]
pub struct Layout {
    data_start: usize,
    height_at: usize,
    width: u32,
    height: u32,
    comps: Vec<Comp>,
    mcus_per_row: u32,
    rows: u32,
    row_px: u32,
    col_px: u32,
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

    /// A whole stand-in JPEG of MCU rows `row..end` and MCU columns
    /// `c0..c1`, written into `out` (cleared first; a reused buffer costs
    /// no allocation), from `marks` (which must reach mark `(end - 1) ×
    /// mcus_per_row + c1`): the headers with the size cut down, then per
    /// row `lead` synthetic MCUs, which set the DC predictors to what MCU
    /// `c0` expects and end on the bit where MCU `c0`'s data starts,
    /// followed by the row's original bytes for MCUs `c0..c1`, copied as
    /// they are. Returns `lead`: 1, or up to 8 when the DC table lacks the
    /// categories to reach a row's predictors in one block per component.
    /// The synthetic MCUs form a band of garbage pixels at the left, so
    /// pixel `(x, y)` of the original is `(x - c0 × col_px + lead × col_px,
    /// y - row × row_px)` here. `None` when the tables cannot code what the
    /// synthetic MCUs need, or the data is bad.
    pub fn crop(
        &self,
        bytes: &[u8],
        marks: &[Mark],
        (row, end, c0, c1): (u32, u32, u32, u32),
        out: &mut Vec<u8>,
    ) -> Option<u32> {
        if row >= end || end > self.rows || c0 >= c1 || c1 > self.mcus_per_row {
            return None;
        }
        let mpr = self.mcus_per_row as usize;
        let at = |r: u32, c: u32| marks.get(r as usize * mpr + c as usize);
        // The fewest synthetic columns whose blocks can carry every row's
        // change of predictors.
        let lead = [1u32, 2, 4, 8].into_iter().find(|&k| {
            let mut pred = [0i32; 3];
            (row..end).all(|r| {
                let (Some(start), Some(stop)) = (at(r, c0), at(r, c1)) else {
                    return false;
                };
                let ok = self.comps.iter().enumerate().all(|(c, comp)| {
                    let blocks = (k * comp.h * comp.v) as usize;
                    dc_reachable(&comp.dc, i32::from(start.dc[c]) - pred[c], blocks)
                });
                pred = stop.dc.map(i32::from);
                ok
            })
        })?;
        let height = (end * self.row_px).min(self.height) - row * self.row_px;
        let width = (c1 * self.col_px).min(self.width) - c0 * self.col_px + lead * self.col_px;
        let (first, last) = (at(row, c0)?, at(end - 1, c1)?);
        let room = self.data_start
            + last.byte.checked_sub(first.byte)? as usize
            + 64 * (end - row) as usize;
        out.clear();
        out.reserve(room);
        self.headers(bytes, width, height, out)?;
        let mut w = Writer {
            out: std::mem::take(out),
            acc: 0,
            n: 0,
        };
        let mut pred = [0i32; 3];
        for r in row..end {
            let (start, stop) = (at(r, c0)?, at(r, c1)?);
            self.synthetic_mcus(&mut w, lead, pred, start.dc, start.bit)?;
            let from = w.merge(bytes, start)?;
            w.out
                .extend_from_slice(bytes.get(from..stop.byte as usize)?);
            if stop.bit > 0 {
                let b = *bytes.get(stop.byte as usize)?;
                w.put_raw(u64::from(b >> (8 - stop.bit)), u32::from(stop.bit));
            }
            pred = stop.dc.map(i32::from);
        }
        // Pad the last byte with ones, as encoders do, then end the image.
        if w.n > 0 {
            let fill = 8 - w.n;
            w.put_raw((1 << fill) - 1, fill);
        }
        w.out.extend_from_slice(&[0xFF, 0xD9]);
        *out = w.out;
        Some(lead)
    }

    /// Appends the file's marker segments up to its image data, with the
    /// frame's size set to `width × height`.
    fn headers(&self, bytes: &[u8], width: u32, height: u32, out: &mut Vec<u8>) -> Option<()> {
        let at = out.len() + self.height_at;
        out.extend_from_slice(bytes.get(..self.data_start)?);
        out[at..at + 2].copy_from_slice(&u16::try_from(height).ok()?.to_be_bytes());
        out[at + 2..at + 4].copy_from_slice(&u16::try_from(width).ok()?.to_be_bytes());
        Some(())
    }

    /// Writes `mcus` MCUs that carry only DC differences (taking each
    /// component's predictor from `from` to `to`) and, in the first block,
    /// as many padding coefficients as make the writer end `bit` bits into
    /// a byte.
    fn synthetic_mcus(
        &self,
        w: &mut Writer,
        mcus: u32,
        from: [i32; 3],
        to: [i16; 3],
        bit: u8,
    ) -> Option<()> {
        let mut diffs: Vec<Vec<i32>> = Vec::with_capacity(self.comps.len());
        let mut bits = u64::from(w.n);
        for (c, comp) in self.comps.iter().enumerate() {
            let (dct, act) = (&comp.dc, &comp.ac);
            let blocks = (mcus * comp.h * comp.v) as usize;
            let steps = dc_steps(dct, i32::from(to[c]) - from[c], blocks)?;
            let eob = u64::from(act.enc[0].1);
            if eob == 0 {
                return None;
            }
            for &d in &steps {
                let cat = category(d);
                bits += u64::from(dct.enc[cat as usize].1) + u64::from(cat) + eob;
            }
            diffs.push(steps);
        }
        let need = (u64::from(bit) + 8 - bits % 8) % 8;
        let mut pads = padding(&self.comps[0].ac, need as u32)?;
        let mut next = vec![0usize; self.comps.len()];
        for _ in 0..mcus {
            for (c, comp) in self.comps.iter().enumerate() {
                let (dct, act) = (&comp.dc, &comp.ac);
                for _ in 0..comp.h * comp.v {
                    let d = diffs[c][next[c]];
                    next[c] += 1;
                    let cat = category(d);
                    w.put(dct.enc[cat as usize], cat, d);
                    // Run-0 coefficients at positions 1, 2, …: at most 7.
                    for sym in pads.drain(..) {
                        w.put(act.enc[usize::from(sym)], u32::from(sym & 15), 1);
                    }
                    w.put(act.enc[0], 0, 0);
                }
            }
        }
        (w.n == u32::from(bit)).then_some(())
    }

    /// A stand-in JPEG for rows `row..end` of the image, whose data starts
    /// at `mark`, written into `out` (cleared first): the headers with the
    /// height cut to `end - row + 1` iMCU rows (or to the image's end), one
    /// synthetic row that leaves the DC predictors at `mark.dc` and ends on
    /// `mark.bit`, and the first byte of the real data merged into it.
    /// Returns the offset in `bytes` where the rest of the stand-in
    /// continues, unchanged. Row
    /// `row - 1` of the original becomes the synthetic row, so pixel rows
    /// shift up by `(row - 1) × row_px`. `None` when the tables cannot code
    /// what the synthetic row needs.
    pub fn splice(
        &self,
        bytes: &[u8],
        mark: &Mark,
        row: u32,
        end: u32,
        out: &mut Vec<u8>,
    ) -> Option<usize> {
        if row == 0 || row >= end || end > self.rows {
            return None;
        }
        let top = (row - 1) * self.row_px;
        let height = (end * self.row_px).min(self.height) - top;
        out.clear();
        self.headers(bytes, self.width, height, out)?;
        let mut w = Writer {
            out: std::mem::take(out),
            acc: 0,
            n: 0,
        };
        self.synthetic_mcus(&mut w, self.mcus_per_row, [0; 3], mark.dc, mark.bit)?;
        // Merge with the first byte of the real data.
        let tail = w.merge(bytes, mark);
        *out = w.out;
        tail
    }
}

/// The magnitude category of a DC difference (its bit length).
fn category(d: i32) -> u32 {
    32 - d.unsigned_abs().leading_zeros()
}

/// DC differences for `blocks` blocks summing to `target`, using only the
/// categories the table can code; `None` when it cannot.
fn dc_steps(t: &Huff, target: i32, blocks: usize) -> Option<Vec<i32>> {
    let mut out = dc_plan_within(t, target, blocks)?;
    out.resize(blocks, 0);
    Some(out)
}

/// Whether [`dc_steps`] can reach `target` within `blocks` blocks.
fn dc_reachable(t: &Huff, target: i32, blocks: usize) -> bool {
    // The common case, without building a plan: one codable step.
    if target != 0 && t.codes(category(target)) && (blocks == 1 || t.codes(0)) {
        return true;
    }
    dc_plan_within(t, target, blocks).is_some()
}

/// The nonzero differences of [`dc_steps`], before the zeros that fill the
/// remaining blocks (which need a code for category 0).
fn dc_plan_within(t: &Huff, target: i32, blocks: usize) -> Option<Vec<i32>> {
    let plan =
        dc_plan(t, target, blocks.min(DC_PLAN_DEPTH)).or_else(|| dc_greedy(t, target, blocks))?;
    (plan.len() == blocks || t.codes(0)).then_some(plan)
}

/// Two codable nonzero differences summing to `target`, if any: each
/// category with a sign is an interval of values, so each pair of them is
/// one check.
fn dc_pair(t: &Huff, target: i32) -> Option<(i32, i32)> {
    let ranges: Vec<(i32, i32)> = (1..=11u32)
        .filter(|&c| t.codes(c))
        .flat_map(|c| {
            let (lo, hi) = (1 << (c - 1), (1 << c) - 1);
            [(lo, hi), (-hi, -lo)]
        })
        .collect();
    for &(alo, ahi) in &ranges {
        for &(blo, bhi) in &ranges {
            // b in [blo, bhi] and a = target - b in [alo, ahi].
            let lo = blo.max(target - ahi);
            if lo <= bhi.min(target - alo) {
                return Some((target - lo, lo));
            }
        }
    }
    None
}

/// Codable differences summing to `target`, at most `max`, each the most
/// of the largest codable category not above the rest: many small steps,
/// for tables with only small categories and many blocks to spend.
fn dc_greedy(t: &Huff, target: i32, max: usize) -> Option<Vec<i32>> {
    let mut out = Vec::new();
    let mut rest = target;
    while rest != 0 {
        let cat = category(rest);
        let step = match (1..=cat).rev().find(|&c| t.codes(c))? {
            c if c == cat => rest,
            c => rest.signum() * ((1 << c) - 1),
        };
        out.push(step);
        rest -= step;
        if out.len() > max {
            return None;
        }
    }
    Some(out)
}

/// The most DC differences [`dc_plan`] searches over (2^this paths at most).
const DC_PLAN_DEPTH: usize = 8;

/// Codable differences summing to `target`, at most `max` of them: all of
/// it when its category is in the table, else two that sum to it when
/// some do, else the fewer-step of two ways on — the most of the largest
/// codable category below, or the least of the smallest codable category
/// above (overshooting, to come back).
fn dc_plan(t: &Huff, target: i32, max: usize) -> Option<Vec<i32>> {
    if target == 0 {
        return Some(Vec::new());
    }
    if max == 0 {
        return None;
    }
    let cat = category(target);
    if t.codes(cat) {
        return Some(vec![target]);
    }
    if max >= 2 {
        if let Some((a, b)) = dc_pair(t, target) {
            return Some(vec![a, b]);
        }
    }
    let sign = target.signum();
    let below = (1..cat)
        .rev()
        .find(|&c| t.codes(c))
        .map(|c| sign * ((1 << c) - 1));
    let above = (cat + 1..=11)
        .find(|&c| t.codes(c))
        .map(|c| sign * (1 << (c - 1)));
    let mut best: Option<Vec<i32>> = None;
    for step in [below, above].into_iter().flatten() {
        if let Some(rest) = dc_plan(t, target - step, max - 1) {
            if best.as_ref().is_none_or(|b| rest.len() + 1 < b.len()) {
                let mut plan = vec![step];
                plan.extend(rest);
                best = Some(plan);
            }
        }
    }
    best
}

/// AC symbols (run 0) whose codes plus value bits add `need` bits modulo 8,
/// fewest first; `None` when the table has none that do.
fn padding(t: &Huff, need: u32) -> Option<Vec<u8>> {
    if need == 0 {
        return Some(Vec::new());
    }
    // Breadth-first over residues: from[r] = (previous residue, symbol).
    let mut from: [Option<(u32, u8)>; 8] = [None; 8];
    let mut frontier = vec![0u32];
    let mut seen = [false; 8];
    seen[0] = true;
    while !frontier.is_empty() && !seen[need as usize] {
        let mut nextf = Vec::new();
        for &r in &frontier {
            for size in 1..=10u8 {
                let e = t.enc[usize::from(size)];
                if e.1 == 0 {
                    continue;
                }
                let to = (r + u32::from(e.1) + u32::from(size)) % 8;
                if !seen[to as usize] {
                    seen[to as usize] = true;
                    from[to as usize] = Some((r, size));
                    nextf.push(to);
                }
            }
        }
        frontier = nextf;
    }
    let mut path = Vec::new();
    let mut r = need;
    while r != 0 {
        let (prev, sym) = from[r as usize]?;
        path.push(sym);
        r = prev;
    }
    Some(path)
}

/// Writes Huffman codes and value bits, stuffing a zero after each 0xFF.
struct Writer {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Writer {
    /// A code, then `size` bits of the value `v` (JPEG's one's-complement
    /// form for negatives).
    fn put(&mut self, code: (u16, u8), size: u32, v: i32) {
        self.put_raw(u64::from(code.0), u32::from(code.1));
        if size > 0 {
            let bits = if v < 0 { v - 1 } else { v } as u64 & ((1 << size) - 1);
            self.put_raw(bits, size);
        }
    }

    /// Completes the partial byte (which must hold `mark.bit` bits) with
    /// the rest of the byte at `mark`; returns the offset in `bytes` where
    /// the data continues byte-aligned.
    fn merge(&mut self, bytes: &[u8], mark: &Mark) -> Option<usize> {
        let at = mark.byte as usize;
        if mark.bit == 0 {
            return (self.n == 0).then_some(at);
        }
        let first = *bytes.get(at)?;
        let keep = 8 - u32::from(mark.bit);
        self.put_raw(u64::from(first) & ((1 << keep) - 1), keep);
        (self.n == 0).then_some(at + if first == 0xFF { 2 } else { 1 })
    }

    fn put_raw(&mut self, bits: u64, n: u32) {
        self.acc = (self.acc << n) | bits;
        self.n += n;
        while self.n >= 8 {
            let b = (self.acc >> (self.n - 8)) as u8;
            self.out.push(b);
            if b == 0xFF {
                self.out.push(0);
            }
            self.n -= 8;
        }
        self.acc &= (1 << self.n) - 1;
    }
}

/// Reads entropy-coded bits: 0xFF 0x00 is a data 0xFF; any other marker
/// ends the data, after which zeros are read and counted.
struct Reader<'a> {
    data: &'a [u8],
    /// Next byte to load.
    pos: usize,
    /// Unread bits, most significant first.
    acc: u64,
    n: u32,
    /// Zero bits loaded past the end of the data.
    pad: u32,
}

impl<'a> Reader<'a> {
    fn at(data: &'a [u8], byte: usize, bit: u8) -> Option<Reader<'a>> {
        let mut r = Reader {
            data,
            pos: byte,
            acc: 0,
            n: 0,
            pad: 0,
        };
        r.refill();
        if bit > 7 || r.n < u32::from(bit) || r.pad > 0 && r.n - r.pad < u32::from(bit) {
            return None;
        }
        r.consume(u32::from(bit));
        Some(r)
    }

    #[inline(always)]
    fn refill(&mut self) {
        while self.n <= 56 {
            if self.pad == 0 {
                if let Some(w) = self.data.get(self.pos..self.pos + 8) {
                    let w = u64::from_be_bytes(w.try_into().unwrap_or([0xFF; 8]));
                    // No 0xFF byte among the eight: take whole bytes at once.
                    let ones = !w;
                    if (ones.wrapping_sub(0x0101_0101_0101_0101) & !ones & 0x8080_8080_8080_8080)
                        == 0
                    {
                        let k = (64 - self.n) / 8;
                        let take = 8 * k;
                        self.acc |= (w >> (64 - take)) << (64 - self.n - take);
                        self.n += take;
                        self.pos += k as usize;
                        continue;
                    }
                }
            }
            let mut b = 0u8;
            if self.pad == 0 {
                match self.data.get(self.pos) {
                    Some(&0xFF) => {
                        if self.data.get(self.pos + 1) == Some(&0) {
                            b = 0xFF;
                            self.pos += 2;
                        } else {
                            self.pad += 8;
                        }
                    }
                    Some(&v) => {
                        b = v;
                        self.pos += 1;
                    }
                    None => self.pad += 8,
                }
            } else {
                self.pad += 8;
            }
            self.acc |= u64::from(b) << (56 - self.n);
            self.n += 8;
        }
    }

    #[inline(always)]
    fn consume(&mut self, n: u32) {
        self.acc <<= n;
        self.n -= n;
    }

    #[inline(always)]
    fn symbol(&mut self, t: &Huff) -> Option<u8> {
        let (sym, len) = self.peek_symbol(t)?;
        self.consume(len);
        Some(sym)
    }

    /// The next symbol and its code's length, not consumed.
    #[inline(always)]
    fn peek_symbol(&self, t: &Huff) -> Option<(u8, u32)> {
        let e = t.lut[(self.acc >> (64 - LUT_BITS)) as usize];
        if e != 0 {
            return Some((e as u8, u32::from(e >> 8)));
        }
        for len in LUT_BITS + 1..=16 {
            let code = (self.acc >> (64 - len)) as i32;
            if code <= t.maxcode[len as usize] {
                return Some((*t.vals.get((t.delta[len as usize] + code) as usize)?, len));
            }
        }
        None
    }

    /// Skips one block; returns its DC difference.
    #[inline(always)]
    fn skip_block(&mut self, dc: &Huff, ac: &Huff) -> Option<i32> {
        if self.n < 32 {
            self.refill();
        }
        let s = u32::from(self.symbol(dc)?);
        if s > 11 {
            return None;
        }
        let diff = if s == 0 {
            0
        } else {
            let v = (self.acc >> (64 - s)) as i32;
            self.consume(s);
            if v < 1 << (s - 1) {
                v - (1 << s) + 1
            } else {
                v
            }
        };
        // Each AC symbol: one lookup gives the bits to skip (code and
        // value) and the step in the coefficient index.
        let mut k = 1u32;
        loop {
            if self.n < 32 {
                self.refill();
            }
            if let Some(&m) = ac.multi.get((self.acc >> (64 - MULTI_BITS)) as usize) {
                let steps = u32::from(m >> 1) & 127;
                if m != 0 && k + steps < 64 {
                    self.consume(u32::from(m >> 8));
                    if m & 1 == 1 {
                        break;
                    }
                    k += steps;
                    continue;
                }
            }
            let mut e = ac.skip[(self.acc >> (64 - LUT_BITS)) as usize];
            if e == 0 {
                let (sym, len) = self.peek_symbol(ac)?;
                e = ((len as u16 + u16::from(sym & 15)) << 8) | Huff::step(sym);
            }
            self.consume(u32::from(e >> 8));
            let step = u32::from(e & 0xFF);
            k += step;
            if step == 0 || k >= 64 {
                break;
            }
        }
        if self.pad > 0 && self.pad > self.n {
            return None; // read past the end of the data
        }
        Some(diff)
    }

    /// The file offset of the next unread bit, and how many bits of that
    /// byte were already read.
    fn position(&self) -> Option<(usize, u8)> {
        if self.pad > self.n {
            return None;
        }
        let real = self.n - self.pad;
        let mut j = self.pos;
        for _ in 0..real.div_ceil(8) {
            j = j.checked_sub(1)?;
            // A zero after 0xFF is stuffing: the data byte is the 0xFF.
            if self.data[j] == 0 && j > 0 && self.data[j - 1] == 0xFF {
                j -= 1;
            }
        }
        Some((j, ((8 - real % 8) % 8) as u8))
    }
}

/// MCU marks per dataset sample, shared by a stage's workers, bounded in
/// bytes (once full, new images are not indexed; their decodes take the
/// ordinary path). An entry reserves room for every MCU of its image.
pub struct ScanIndex {
    max_bytes: usize,
    bytes: AtomicUsize,
    inner: Mutex<HashMap<u64, Entry>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

#[derive(Clone)]
struct Entry {
    /// Identifies the file: its length and a hash of its headers and end.
    check: (usize, u64),
    marks: Arc<Vec<Mark>>,
    /// Bytes counted against the cap.
    size: usize,
}

impl std::fmt::Debug for ScanIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanIndex")
            .field("max_bytes", &self.max_bytes)
            .field("bytes", &self.bytes())
            .field("hits", &self.hits.load(Ordering::Relaxed))
            .field("misses", &self.misses.load(Ordering::Relaxed))
            .finish()
    }
}

/// Bytes an entry costs besides its marks (key, length, hash, table slot).
const ENTRY_OVERHEAD: usize = 64;

impl ScanIndex {
    /// An index holding at most `max_bytes` of marks.
    pub fn new(max_bytes: usize) -> Arc<ScanIndex> {
        Arc::new(ScanIndex {
            max_bytes,
            bytes: AtomicUsize::new(0),
            inner: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Images with marks.
    pub fn images(&self) -> usize {
        self.inner.lock_unpoisoned().len()
    }

    /// Lookups that found every mark they needed.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Lookups that had to parse MCUs.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// The marks of sample `key` through mark `upto` (see
    /// [`Layout::scan`]), parsing (and remembering) what is not yet
    /// marked; `None` when the data is bad or the image's marks would not
    /// fit in the byte cap.
    pub fn marks(
        &self,
        key: u64,
        bytes: &[u8],
        layout: &Layout,
        upto: usize,
    ) -> Option<Arc<Vec<Mark>>> {
        let upto = upto.min(layout.mcus());
        let check = (bytes.len(), file_hash(bytes, layout.data_start));
        // Room for the whole image's marks, so an entry grows in place.
        let full = ENTRY_OVERHEAD + (layout.mcus() + 1) * std::mem::size_of::<Mark>();
        // An entry that must grow is taken out while it does: a sample is
        // decoded by one worker at a time, and an entry held alone grows
        // without a copy.
        let taken = {
            let mut inner = self.inner.lock_unpoisoned();
            match inner.get(&key) {
                Some(e) if e.check == check && e.marks.len() > upto => {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                    return Some(Arc::clone(&e.marks));
                }
                Some(e) if e.check == check => inner.remove(&key),
                Some(_) => {
                    // Another file under this key: forget the old one.
                    if let Some(old) = inner.remove(&key) {
                        self.bytes.fetch_sub(old.size, Ordering::Relaxed);
                    }
                    None
                }
                None => None,
            }
        };
        self.misses.fetch_add(1, Ordering::Relaxed);
        let (mut marks, size) = match taken {
            Some(e) => {
                let marks = Arc::try_unwrap(e.marks).unwrap_or_else(|shared| {
                    let mut v = Vec::with_capacity(layout.mcus() + 1);
                    v.extend_from_slice(&shared);
                    v
                });
                (marks, e.size)
            }
            None => {
                if self.bytes() + full > self.max_bytes {
                    return None;
                }
                self.bytes.fetch_add(full, Ordering::Relaxed);
                let mut v = Vec::with_capacity(layout.mcus() + 1);
                v.push(Mark::start(layout));
                (v, full)
            }
        };
        let scanned = layout.scan(bytes, &mut marks, upto);
        let marks = Arc::new(marks);
        // Marks found before a failure are still right: kept either way.
        let mut inner = self.inner.lock_unpoisoned();
        let entry = Entry {
            check,
            marks: Arc::clone(&marks),
            size,
        };
        if let Some(raced) = inner.insert(key, entry) {
            self.bytes.fetch_sub(raced.size, Ordering::Relaxed);
        }
        scanned?;
        Some(marks)
    }
}

/// A 64-bit hash of the headers (tables, size) and the last 32 bytes.
fn file_hash(bytes: &[u8], header_end: usize) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let end = &bytes[bytes.len().saturating_sub(32)..];
    for chunk in bytes[..header_end.min(bytes.len())]
        .chunks(8)
        .chain(end.chunks(8))
    {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h ^ u64::from_le_bytes(w))
            .wrapping_mul(0x0000_0100_0000_01b3)
            .rotate_left(29);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Marks from a cut-off file stop where its data does: rows inside the
    /// remaining bytes are marked, rows past the cut are refused, and the
    /// marks found agree with those of the whole file.
    #[test]
    fn scanning_a_truncated_file_marks_only_the_mcus_it_holds() {
        let jpeg = crate::synth::jpeg(9, 2, 90).unwrap();
        let layout = Layout::parse(&jpeg).unwrap();
        let last = layout.mcus();
        let mut whole = vec![Mark::start(&layout)];
        layout.scan(&jpeg, &mut whole, last).unwrap();
        assert_eq!(whole.len(), last + 1);
        let mid = 12 * layout.mcus_per_row() as usize + 5;
        let cut = &jpeg[..whole[mid].byte as usize + 1];
        let mut marks = vec![Mark::start(&layout)];
        assert!(layout.scan(cut, &mut marks, last).is_none());
        let mut marks = vec![Mark::start(&layout)];
        layout.scan(cut, &mut marks, mid - 1).unwrap();
        assert_eq!(marks[..], whole[..mid]);
        // Scanning on from a mark gives the same marks as from the top.
        let mut resumed = whole[..70].to_vec();
        layout.scan(&jpeg, &mut resumed, last).unwrap();
        assert_eq!(resumed, whole);
    }

    /// A stand-in for MCU rows `row..end` and columns `c0..c1` decodes,
    /// past its synthetic left column, to the pixels of those MCUs in a
    /// full decode, away from the edges where chroma upsampling looks at
    /// neighbours the stand-in does not have.
    #[test]
    fn crop_stand_ins_decode_to_the_original_pixels() {
        if !crate::libjpeg::AVAILABLE {
            return;
        }
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/vision/");
        let files = [
            crate::synth::jpeg(4, 7, 90).unwrap(),
            std::fs::read(format!("{dir}optimized.jpg")).unwrap(),
            // Red at both edges, blue in the middle, with tables fitted to
            // it: its chroma DC table lacks the categories of an edge-to-
            // middle jump, so those stand-ins need several synthetic MCUs.
            std::fs::read(format!("{dir}chroma_swing.jpg")).unwrap(),
        ];
        let mut leads = std::collections::BTreeMap::new();
        for jpeg in &files {
            let layout = Layout::parse(jpeg).unwrap();
            let mut marks = vec![Mark::start(&layout)];
            layout.scan(jpeg, &mut marks, layout.mcus()).unwrap();
            let full = crate::decode::decode(jpeg, &Default::default()).unwrap();
            let (rp, cp) = (layout.row_px(), layout.col_px());
            let (rows, cols) = (layout.rows(), layout.mcus_per_row());
            let mut cases = vec![
                (0, 1, 0, 1),
                (0, rows, 1, cols - 1),
                (rows - 1, rows, cols - 1, cols),
            ];
            for c0 in 0..cols {
                for c1 in c0 + 1..=cols {
                    cases.push((rows / 3, rows / 3 + 2, c0, c1));
                }
            }
            for (row, end, c0, c1) in cases {
                let mut stream = Vec::new();
                let lead = layout
                    .crop(jpeg, &marks, (row, end, c0, c1), &mut stream)
                    .unwrap();
                *leads.entry(lead).or_insert(0) += 1;
                let mut buf = Vec::new();
                let (w, h) = ((c1 - c0 + lead) * cp, (end - row) * rp);
                let info =
                    crate::libjpeg::decode_region_into(&stream, 8, false, 0, 0, w, h, &mut buf)
                        .unwrap()
                        .unwrap();
                let sw = info.width as usize;
                for y in row * rp + 2..(end * rp).min(full.height) - 2 {
                    for x in c0 * cp + 2..(c1 * cp).min(full.width) - 2 {
                        let sx = (x - c0 * cp + lead * cp) as usize;
                        let sy = (y - row * rp) as usize;
                        let got = &buf[(sy * sw + sx) * 3..][..3];
                        let want = &full.data[((y * full.width + x) * 3) as usize..][..3];
                        assert_eq!(got, want, "crop {row}..{end} × {c0}..{c1} at ({x}, {y})");
                    }
                }
            }
        }
        assert!(
            leads.keys().any(|&l| l > 1),
            "stand-ins by synthetic columns: {leads:?}"
        );
    }

    /// DC differences come out codable and summing to the target, for a
    /// full table, one with gaps (overshooting helps) and one with only
    /// small categories (many steps), or not at all when impossible.
    #[test]
    fn dc_steps_are_codable_and_sum_to_the_target() {
        let table = |cats: &[u8]| {
            let mut counts = [0u8; 16];
            counts[3] = cats.len() as u8; // all 4-bit codes
            Huff::new(&counts, cats).unwrap()
        };
        let full = table(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        let gaps = table(&[0, 1, 6, 7, 9]);
        let small = table(&[0, 1, 2, 3]);
        let no_zero = table(&[1, 6, 7]);
        for (t, name) in [
            (&full, "full"),
            (&gaps, "gaps"),
            (&small, "small"),
            (&no_zero, "no zero"),
        ] {
            for target in [
                -2047, -1000, -129, -20, -3, 0, 1, 2, 20, 63, 64, 200, 700, 2047,
            ] {
                for blocks in [1, 2, 4, 8, 64, 128, 512] {
                    let Some(steps) = dc_steps(t, target, blocks) else {
                        assert!(!dc_reachable(t, target, blocks), "{name} {target} {blocks}");
                        continue;
                    };
                    assert_eq!(steps.len(), blocks, "{name} {target} {blocks}");
                    assert_eq!(
                        steps.iter().sum::<i32>(),
                        target,
                        "{name} {target} {blocks}"
                    );
                    assert!(
                        steps.iter().all(|&d| t.codes(category(d))),
                        "{name} {target}: {steps:?}"
                    );
                    assert!(dc_reachable(t, target, blocks));
                }
            }
        }
        // What each must reach.
        assert!(dc_steps(&full, 2047, 1).is_some());
        assert!(dc_steps(&gaps, 20, 2).is_some(), "52 - 32");
        assert!(dc_steps(&small, 700, 128).is_some(), "100 steps of 7");
        assert!(dc_steps(&small, 700, 8).is_none());
        assert!(
            dc_steps(&no_zero, 0, 2).is_none(),
            "no way to code a zero difference"
        );
    }

    /// Skipping several AC symbols per lookup marks the same places as one
    /// symbol at a time: a table's first use in a thread has no
    /// multi-symbol lookup, its second has one.
    #[test]
    fn multi_symbol_skipping_marks_the_same_places() {
        for (seed, q) in [(1, 90), (2, 30), (3, 100)] {
            // A fresh thread: an empty table cache.
            std::thread::spawn(move || {
                let jpeg = crate::synth::jpeg(seed, seed, q).unwrap();
                let single = Layout::parse(&jpeg).unwrap();
                let multi = Layout::parse(&jpeg).unwrap();
                assert!(single.comps.iter().all(|c| c.ac.multi.is_empty()));
                assert!(multi.comps[0].ac.multi.len() == 1 << MULTI_BITS);
                let mut a = vec![Mark::start(&single)];
                single.scan(&jpeg, &mut a, single.mcus()).unwrap();
                let mut b = vec![Mark::start(&multi)];
                multi.scan(&jpeg, &mut b, multi.mcus()).unwrap();
                assert_eq!(a, b, "q{q}");
            })
            .join()
            .unwrap();
        }
    }

    /// Every multi-symbol entry agrees with decoding its prefix one symbol
    /// at a time, and never spans more than 63 coefficients — also for a
    /// table whose zero run (16 zeros) has a one-bit code.
    #[test]
    fn multi_symbol_entries_agree_with_single_symbols() {
        let jpeg = crate::synth::jpeg(1, 1, 90).unwrap();
        let standard = Layout::parse(&jpeg).unwrap().comps[0].ac.as_ref().clone();
        // ZRL: 0, EOB: 10, (0,1): 110, (0,2): 1110.
        let mut counts = [0u8; 16];
        counts[..4].copy_from_slice(&[1, 1, 1, 1]);
        let odd = Huff::new(&counts, &[0xF0, 0x00, 0x01, 0x02]).unwrap();
        for mut t in [standard, odd] {
            t.build_multi();
            for p in 0..1u32 << MULTI_BITS {
                let m = u32::from(t.multi[p as usize]);
                if m == 0 {
                    continue;
                }
                let (bits, steps, ended) = (m >> 8, (m >> 1) & 127, m & 1 == 1);
                assert!(bits <= MULTI_BITS && steps <= 63, "prefix {p:#x}");
                // The same prefix, one symbol at a time.
                let (mut pos, mut k, mut end) = (0, 0, false);
                while pos < bits {
                    let acc = u64::from(p) << (64 - MULTI_BITS + pos);
                    let e = t.lut[(acc >> (64 - LUT_BITS)) as usize];
                    let (len, sym) = (u32::from(e >> 8), e as u8);
                    pos += len + u32::from(sym & 15);
                    match Huff::step(sym) {
                        0 => end = true,
                        s => k += u32::from(s),
                    }
                }
                assert_eq!((pos, k, end), (bits, steps, ended), "prefix {p:#x}");
            }
        }
    }

    /// The index keeps to its cap, grows an entry in place, answers from
    /// it once it reaches far enough, and replaces an entry whose file
    /// changed.
    #[test]
    fn the_index_keeps_its_cap_and_grows_entries_in_place() {
        let jpegs: Vec<Vec<u8>> = (0..3)
            .map(|i| crate::synth::jpeg(5, i, 90).unwrap())
            .collect();
        let layouts: Vec<Layout> = jpegs.iter().map(|j| Layout::parse(j).unwrap()).collect();
        let size = |l: &Layout| ENTRY_OVERHEAD + (l.mcus() + 1) * std::mem::size_of::<Mark>();
        let cap = size(&layouts[0]) + size(&layouts[1]);
        let index = ScanIndex::new(cap);
        let first = index.marks(0, &jpegs[0], &layouts[0], 40).unwrap();
        assert_eq!(first.len(), 41);
        let data = first.as_ptr();
        drop(first);
        let grown = index.marks(0, &jpegs[0], &layouts[0], 400).unwrap();
        assert_eq!(grown.len(), 401);
        assert_eq!(grown.as_ptr(), data, "the entry was copied to grow");
        let hit = index.marks(0, &jpegs[0], &layouts[0], 100).unwrap();
        assert_eq!((hit.len(), index.hits(), index.misses()), (401, 1, 2));
        assert!(index.marks(1, &jpegs[1], &layouts[1], 10).is_some());
        assert!(
            index.marks(2, &jpegs[2], &layouts[2], 10).is_none(),
            "past the cap"
        );
        assert_eq!((index.images(), index.bytes()), (2, cap));
        // Key 1 now names another file: its marks are made afresh.
        let other = index.marks(1, &jpegs[0], &layouts[0], 5).unwrap();
        assert_eq!(other[..], grown[..6]);
        assert_eq!(index.bytes(), size(&layouts[0]) * 2);
    }

    /// Corrupt data (an impossible Huffman code) is refused, not skipped.
    #[test]
    fn corrupt_data_is_refused() {
        let mut jpeg = crate::synth::jpeg(9, 3, 90).unwrap();
        let layout = Layout::parse(&jpeg).unwrap();
        let start = layout.data_start();
        // All-ones runs are never valid codes in these tables; 0xFF needs
        // its stuffing zero, so write FF 00 pairs.
        for i in 0..64 {
            jpeg[start + 40 + i] = if i % 2 == 0 { 0xFF } else { 0 };
        }
        let mut marks = vec![Mark::start(&layout)];
        assert!(layout.scan(&jpeg, &mut marks, layout.mcus()).is_none());
    }
}
