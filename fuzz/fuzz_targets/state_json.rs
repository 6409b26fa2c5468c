//! Any text as a `--resume` state file: parsed or refused, never a panic.
#![no_main]
use ferrofeed_core::PipelineState;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(state) = PipelineState::from_json(text) {
            let again = PipelineState::from_json(&state.to_json()).expect("a state round-trips");
            assert_eq!(again.to_json(), state.to_json());
        }
    }
});
