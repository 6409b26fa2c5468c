//! Seeking tests: marks, stand-ins and the index against full decodes.

use super::huffman::{Huff, LUT_BITS, MULTI_BITS};
use super::index::ENTRY_OVERHEAD;
use super::standin::{category, dc_reachable, dc_steps};
use super::{Layout, Mark, ScanIndex};

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
            let info = crate::libjpeg::decode_region_into(
                &stream,
                &crate::libjpeg::Request::new(0, 0, w, h),
                &mut buf,
            )
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
