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
//! use ferrofeed_vision::jpeg::{Layout, Mark};
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
//!
//! The rooms: Huffman tables (`huffman.rs`), bit reader and writer
//! (`bits.rs`), frame and scan layout with the skip scan (`layout.rs`),
//! stand-in streams (`standin.rs`) and the per-image mark cache
//! (`index.rs`).

mod bits;
mod huffman;
mod index;
mod layout;
mod standin;
#[cfg(test)]
mod tests;

pub use index::ScanIndex;
pub use layout::{Layout, Mark};
