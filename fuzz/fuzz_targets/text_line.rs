//! Any bytes as a `.txt` or `.jsonl` line (strict and lossy UTF-8), then
//! tokenized when it parses — word by word through the word cache, which
//! must give the ids of encoding the whole line.
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
            let words = tokenizer().encode_counted(&text);
            let whole = tokenizer().encode_whole(&text);
            match (words, whole) {
                (Ok(words), Ok(whole)) => {
                    assert!(words.0.len() <= 128);
                    assert_eq!(words, whole, "{text:?}");
                }
                (Err(_), Err(_)) => {}
                (a, b) => panic!("{text:?}: {a:?} vs {b:?}"),
            }
        }
    }
});
