//! Huffman tables of a baseline JPEG: a lookup for short codes, canonical
//! limits for long ones, and each symbol's code for writing.

use std::cell::RefCell;
use std::sync::Arc;

/// Bits looked up at once when decoding a Huffman symbol.
pub(super) const LUT_BITS: u32 = 10;

/// Bits looked up at once when skipping several AC symbols.
pub(super) const MULTI_BITS: u32 = 12;

/// One Huffman table: a lookup for codes up to [`LUT_BITS`] long, the
/// canonical limits for longer ones, and the code of each symbol.
#[derive(Clone)]
pub(super) struct Huff {
    /// `(length << 8) | symbol` for every `LUT_BITS`-bit prefix whose code
    /// is that short; 0 when the code is longer.
    pub(super) lut: Vec<u16>,
    /// Largest code of each length (−1 when none).
    pub(super) maxcode: [i32; 17],
    /// Index into `vals` of the first code of each length, minus that code.
    pub(super) delta: [i32; 17],
    pub(super) vals: Vec<u8>,
    /// `(code, length)` per symbol; length 0 when the symbol is absent.
    pub(super) enc: Vec<(u16, u8)>,
    /// For AC tables: per `LUT_BITS`-bit prefix with a short enough code,
    /// `(code length + value bits) << 8 | step`, where step is how far the
    /// coefficient index moves (0 for end-of-block); 0 when the code is
    /// longer.
    pub(super) skip: Vec<u16>,
    /// For AC tables: several symbols per lookup (see `build_multi`).
    pub(super) multi: Vec<u16>,
}

impl Huff {
    /// The table for a DHT entry (`class`, then its 16 counts and its
    /// symbols), built once per thread: datasets mostly share a few tables.
    pub(super) fn cached(class: u8, spec: &[u8]) -> Option<Arc<Huff>> {
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
    pub(super) fn build_multi(&mut self) {
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
    pub(super) fn codes(&self, sym: u32) -> bool {
        self.enc.get(sym as usize).is_some_and(|e| e.1 > 0)
    }

    /// How an AC symbol moves the coefficient index: 0 for end-of-block.
    pub(super) fn step(sym: u8) -> u16 {
        let (run, size) = (u16::from(sym >> 4), sym & 15);
        match (size, run) {
            (0, 15) => 16,
            (0, _) => 0,
            _ => run + 1,
        }
    }

    /// From a DHT's 16 counts and its symbols; `None` when the counts
    /// overflow the code space.
    pub(super) fn new(counts: &[u8], vals: &[u8]) -> Option<Huff> {
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
