//! Any bytes as a `.txt` or `.jsonl` line (strict and lossy UTF-8), then
//! tokenized when it parses.
#![no_main]
use std::sync::OnceLock;

use ferrofeed_text::corpus::parse_line;
use ferrofeed_text::{CorpusOptions, TextTokenizer, Utf8Policy};
use libfuzzer_sys::fuzz_target;

fn tokenizer() -> &'static TextTokenizer {
    static T: OnceLock<TextTokenizer> = OnceLock::new();
    T.get_or_init(|| TextTokenizer::embedded(128).expect("the embedded tokenizer loads"))
}

fuzz_target!(|data: &[u8]| {
    for (json, utf8) in [
        (false, Utf8Policy::Strict),
        (true, Utf8Policy::Strict),
        (true, Utf8Policy::Lossy),
    ] {
        let opts = CorpusOptions {
            utf8,
            ..CorpusOptions::default()
        };
        if let Ok(text) = parse_line(data, json, &opts) {
            let ids = tokenizer().encode(&text);
            if let Ok(ids) = ids {
                assert!(ids.len() <= 128);
            }
        }
    }
});
