//! Bit-level I/O over entropy-coded data: a reader that skips blocks and
//! a writer that stuffs bytes.

use super::huffman::{Huff, LUT_BITS, MULTI_BITS};
use super::layout::Mark;

/// Writes Huffman codes and value bits, stuffing a zero after each 0xFF.
pub(super) struct Writer {
    pub(super) out: Vec<u8>,
    pub(super) acc: u64,
    pub(super) n: u32,
}

impl Writer {
    /// A code, then `size` bits of the value `v` (JPEG's one's-complement
    /// form for negatives).
    pub(super) fn put(&mut self, code: (u16, u8), size: u32, v: i32) {
        self.put_raw(u64::from(code.0), u32::from(code.1));
        if size > 0 {
            let bits = if v < 0 { v - 1 } else { v } as u64 & ((1 << size) - 1);
            self.put_raw(bits, size);
        }
    }

    /// Completes the partial byte (which must hold `mark.bit` bits) with
    /// the rest of the byte at `mark`; returns the offset in `bytes` where
    /// the data continues byte-aligned.
    pub(super) fn merge(&mut self, bytes: &[u8], mark: &Mark) -> Option<usize> {
        let at = mark.byte as usize;
        if mark.bit == 0 {
            return (self.n == 0).then_some(at);
        }
        let first = *bytes.get(at)?;
        let keep = 8 - u32::from(mark.bit);
        self.put_raw(u64::from(first) & ((1 << keep) - 1), keep);
        (self.n == 0).then_some(at + if first == 0xFF { 2 } else { 1 })
    }

    pub(super) fn put_raw(&mut self, bits: u64, n: u32) {
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
pub(super) struct Reader<'a> {
    pub(super) data: &'a [u8],
    /// Next byte to load.
    pub(super) pos: usize,
    /// Unread bits, most significant first.
    pub(super) acc: u64,
    pub(super) n: u32,
    /// Zero bits loaded past the end of the data.
    pub(super) pad: u32,
}

impl<'a> Reader<'a> {
    pub(super) fn at(data: &'a [u8], byte: usize, bit: u8) -> Option<Reader<'a>> {
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
    pub(super) fn refill(&mut self) {
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
    pub(super) fn consume(&mut self, n: u32) {
        self.acc <<= n;
        self.n -= n;
    }

    #[inline(always)]
    pub(super) fn symbol(&mut self, t: &Huff) -> Option<u8> {
        let (sym, len) = self.peek_symbol(t)?;
        self.consume(len);
        Some(sym)
    }

    /// The next symbol and its code's length, not consumed.
    #[inline(always)]
    pub(super) fn peek_symbol(&self, t: &Huff) -> Option<(u8, u32)> {
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
    pub(super) fn skip_block(&mut self, dc: &Huff, ac: &Huff) -> Option<i32> {
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
    pub(super) fn position(&self) -> Option<(usize, u8)> {
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
