//! Slow-batch warnings. Alone in its own test binary: `tracing` caches per
//! call site whether anyone listens, so a test on another thread without a
//! subscriber could hide the warning from this one.
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferrofeed_core::prelude::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);
impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_batch_far_slower_than_usual_is_reported() {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let p = Pipeline::builder(FnSource::new(40, |i| Ok(i as i64)))
            .map_with(
                "sometimes_slow",
                StageOptions::new().workers(Parallelism::Fixed(1)),
                |x: i64, _: &StageCtx| {
                    std::thread::sleep(Duration::from_millis(if x == 30 { 400 } else { 2 }));
                    Ok(x)
                },
            )
            .batch_size(1)
            .min_task_samples(1)
            .prefetch(1)
            .collate(StackCollate::new().column::<i64>("x"))
            .build()
            .unwrap();
        let mut it = p.epoch(0);
        let mut n = 0;
        for b in it.by_ref() {
            b.unwrap();
            n += 1;
        }
        assert_eq!(n, 40);
    });
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("slow batch"), "no warning in:\n{text}");
    assert_eq!(text.matches("slow batch").count(), 1, "{text}");
}
