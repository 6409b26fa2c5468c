//! `ferrofeed text` end to end, as CLI.md describes it.
#![cfg(feature = "text")]
mod common;
use common::{fail_in, files_with_prefix as files, npy_i64, ok_in, report};

#[test]
fn bucketed_run_dumps_batches_within_the_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let dump = tmp.path().join("dump");
    let rep = tmp.path().join("r.json");
    let args = [
        "text",
        "--max-tokens",
        "4096",
        "--dump",
        dump.to_str().unwrap(),
        "--report-json",
        rep.to_str().unwrap(),
        "--quiet",
    ];
    ok_in(&cache, &args);
    let r = report(&rep);
    assert_eq!(r["domain"], "text");
    assert_eq!(r["token_cache"], "built");
    assert!(r["padding_waste"].as_f64().unwrap() <= 0.05, "{r}");
    // The embedded corpus repeats most of its words (65.5 k words, 8.8 k distinct).
    let hits = r["word_cache_hit_rate"].as_f64().unwrap();
    assert!((0.6..1.0).contains(&hits), "{r}");
    let samples = r["samples"].as_u64().unwrap();
    let index: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(dump.join("index.json")).unwrap()).unwrap();
    assert_eq!(index.len() as u64, samples);
    assert!(index[3]["path"].as_str().unwrap().ends_with("corpus.txt:4"));
    let ids = files(&dump, "input_ids_");
    let masks = files(&dump, "attention_mask_");
    assert_eq!(ids.len() as u64, r["batches"].as_u64().unwrap());
    let mut rows = 0;
    let mut tokens = 0;
    for (i, m) in ids.iter().zip(&masks) {
        let (shape, _) = npy_i64(i);
        let (mshape, mask) = npy_i64(m);
        assert_eq!(shape, mshape);
        assert!(shape[0] * shape[1] <= 4096, "{shape:?}");
        assert!(mask.iter().all(|&x| x == 0 || x == 1));
        rows += shape[0];
        tokens += mask.iter().sum::<i64>();
    }
    assert_eq!(rows as u64, samples);
    assert_eq!(tokens as u64, r["tokens"].as_u64().unwrap());

    // Same seed again (now from the token cache): identical batches.
    let dump2 = tmp.path().join("dump2");
    let mut again = args.to_vec();
    again[4] = dump2.to_str().unwrap();
    ok_in(&cache, &again);
    assert_eq!(r["token_cache"], "built");
    assert_eq!(report(&rep)["token_cache"], "loaded");
    assert!(report(&rep)["word_cache_hit_rate"].is_null());
    for (a, b) in files(&dump, "input_ids_")
        .iter()
        .zip(files(&dump2, "input_ids_"))
    {
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    }
}

#[test]
fn packing_fills_rows_of_max_length() {
    let tmp = tempfile::tempdir().unwrap();
    let dump = tmp.path().join("dump");
    ok_in(
        &tmp.path().join("cache"),
        &[
            "text",
            "--pack",
            "--max-length",
            "128",
            "--batch-size",
            "32",
            "--limit-batches",
            "5",
            "--dump",
            dump.to_str().unwrap(),
            "--quiet",
        ],
    );
    for f in files(&dump, "document_ids_") {
        let (shape, docs) = npy_i64(&f);
        assert_eq!(shape[1], 128);
        assert!(docs[..(shape[0] - 1) * 128]
            .iter()
            .all(|&d| (0..32).contains(&d)));
    }
}

#[test]
fn ranks_read_disjoint_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let mut all = Vec::new();
    for rank in 0..2 {
        let dump = tmp.path().join(format!("d{rank}"));
        ok_in(
            &cache,
            &[
                "text",
                "--max-tokens",
                "8192",
                "--rank",
                &rank.to_string(),
                "--world-size",
                "2",
                "--drop-last",
                "true",
                "--dump",
                dump.to_str().unwrap(),
                "--quiet",
            ],
        );
        for f in files(&dump, "indices_") {
            all.extend(npy_i64(&f).1);
        }
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "no sample on both ranks");
}

#[test]
fn bad_input_gets_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let data = tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("a.txt"),
        b"a fine line\n\nanother \xff\xfe line\nlast line\n",
    )
    .unwrap();
    let d = data.to_str().unwrap();

    let e = fail_in(&cache, &["text", d, "--quiet"]);
    assert!(e.contains("a.txt:3") && e.contains("invalid UTF-8"), "{e}");
    assert!(e.contains("stage `source`"), "names the stage: {e}");

    let rep = tmp.path().join("r.json");
    ok_in(
        &cache,
        &[
            "text",
            d,
            "--on-error",
            "skip",
            "--report-json",
            rep.to_str().unwrap(),
            "--quiet",
        ],
    );
    let r = report(&rep);
    assert_eq!(r["samples"], 2);
    assert_eq!(r["empty_lines_skipped"], 1);
    let skipped = r["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0]["index"], 1);
    assert!(skipped[0]["path"].as_str().unwrap().ends_with("a.txt:3"));

    ok_in(
        &cache,
        &[
            "text",
            d,
            "--lossy-utf8",
            "--report-json",
            rep.to_str().unwrap(),
            "--quiet",
        ],
    );
    assert_eq!(report(&rep)["samples"], 3);

    let e = fail_in(
        &cache,
        &["text", d, "--lossy-utf8", "--max-tokens", "4", "--quiet"],
    );
    assert!(
        e.contains("--max-tokens 4 is smaller than one sequence"),
        "{e}"
    );

    let e = fail_in(&cache, &["text", d, "--tokenizer", "/nonexistent/tok.json"]);
    assert!(e.contains("/nonexistent/tok.json"), "{e}");
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, "{\"model\": 3}").unwrap();
    let e = fail_in(&cache, &["text", d, "--tokenizer", bad.to_str().unwrap()]);
    assert!(e.contains("bad.json"), "{e}");
    assert!(!e.contains("panicked"), "{e}");

    let long = tmp.path().join("long.txt");
    std::fs::write(&long, format!("{}\n", "word ".repeat(5000))).unwrap();
    let rep2 = tmp.path().join("r2.json");
    ok_in(
        &cache,
        &[
            "text",
            long.to_str().unwrap(),
            "--max-length",
            "64",
            "--report-json",
            rep2.to_str().unwrap(),
            "--quiet",
        ],
    );
    assert_eq!(report(&rep2)["truncated"], 1);
}

#[test]
fn inspect_and_make_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let out = ok_in(&cache, &["inspect", "text", "--index", "5"]);
    assert!(
        out.contains("tokenize") && out.contains("tokens ["),
        "{out}"
    );
    let dir = tmp.path().join("ds");
    ok_in(
        &cache,
        &[
            "make-dataset",
            "text",
            dir.to_str().unwrap(),
            "--count",
            "2500",
            "--seed",
            "4",
        ],
    );
    let names: Vec<String> = files(&dir, "part-")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        ["part-00000.txt", "part-00001.jsonl", "part-00002.txt"]
    );
    let rep = tmp.path().join("r.json");
    ok_in(
        &cache,
        &[
            "text",
            dir.to_str().unwrap(),
            "--report-json",
            rep.to_str().unwrap(),
            "--quiet",
        ],
    );
    assert_eq!(report(&rep)["samples"], 2500);
    let dir2 = tmp.path().join("ds2");
    ok_in(
        &cache,
        &[
            "make-dataset",
            "text",
            dir2.to_str().unwrap(),
            "--count",
            "2500",
            "--seed",
            "4",
        ],
    );
    for n in &names {
        assert_eq!(
            std::fs::read(dir.join(n)).unwrap(),
            std::fs::read(dir2.join(n)).unwrap()
        );
    }
}
