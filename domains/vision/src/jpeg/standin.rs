//! Stand-in streams: short JPEGs that libjpeg decodes as usual, built
//! from marks (a cropped region, or a full-width region spliced onto the
//! rest of the file).

use super::bits::Writer;
use super::huffman::Huff;
use super::layout::{Layout, Mark};

impl Layout {
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
pub(super) fn category(d: i32) -> u32 {
    32 - d.unsigned_abs().leading_zeros()
}

/// DC differences for `blocks` blocks summing to `target`, using only the
/// categories the table can code; `None` when it cannot.
pub(super) fn dc_steps(t: &Huff, target: i32, blocks: usize) -> Option<Vec<i32>> {
    let mut out = dc_plan_within(t, target, blocks)?;
    out.resize(blocks, 0);
    Some(out)
}

/// Whether [`dc_steps`] can reach `target` within `blocks` blocks.
pub(super) fn dc_reachable(t: &Huff, target: i32, blocks: usize) -> bool {
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
pub(super) fn dc_plan(t: &Huff, target: i32, max: usize) -> Option<Vec<i32>> {
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
pub(super) fn padding(t: &Huff, need: u32) -> Option<Vec<u8>> {
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
